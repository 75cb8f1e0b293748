package kafka

import (
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
)

// OffsetWatcher reads the high-water marks (the offset the next record of a
// partition will get) of topics over one long-lived client. It serves
// benchmarks and tools that poll for how many records a topic holds; it is
// not used on the relay's path. It is not safe for concurrent use.
type OffsetWatcher struct {
	client sarama.Client
	parts  map[string][]int32
}

// NewOffsetWatcher connects to cfg's brokers.
func NewOffsetWatcher(cfg Config) (*OffsetWatcher, error) {
	cfg.Defaults()
	sc, err := cfg.sarama()
	if err != nil {
		return nil, err
	}
	client, err := sarama.NewClient(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	return &OffsetWatcher{client: client, parts: map[string][]int32{}}, nil
}

// HighWater returns the high-water mark of every partition of topic, indexed
// by partition. The partition list is read once per topic and then cached.
func (w *OffsetWatcher) HighWater(topic string) (map[int32]int64, error) {
	parts, ok := w.parts[topic]
	if !ok {
		var err error
		if parts, err = w.client.Partitions(topic); err != nil {
			return nil, fmt.Errorf("kafka: partitions of %q: %w", topic, err)
		}
		w.parts[topic] = parts
	}
	out := make(map[int32]int64, len(parts))
	for _, p := range parts {
		off, err := w.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("kafka: high-water mark of %s/%d: %w", topic, p, err)
		}
		out[p] = off
	}
	return out, nil
}

// Total returns the sum of the high-water marks of every partition of
// topics: for topics that were empty and never truncated, the number of
// records written to them.
func (w *OffsetWatcher) Total(topics ...string) (int64, error) {
	var sum int64
	for _, t := range topics {
		hw, err := w.HighWater(t)
		if err != nil {
			return 0, err
		}
		for _, off := range hw {
			sum += off
		}
	}
	return sum, nil
}

// Close closes the client.
func (w *OffsetWatcher) Close() error { return w.client.Close() }

// DeleteTopics deletes topics; a topic that does not exist is not an error.
func DeleteTopics(cfg Config, topics []string) error {
	cfg.Defaults()
	_, admin, err := newAdmin(cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	var errs []error
	for _, t := range topics {
		if err := admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			errs = append(errs, fmt.Errorf("kafka: delete topic %q: %w", t, err))
		}
	}
	return errors.Join(errs...)
}
