package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
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
func NewOffsetWatcher(cfg kafka.Config) (*OffsetWatcher, error) {
	cfg.Defaults()
	sc, err := cfg.Sarama()
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
func DeleteTopics(cfg kafka.Config, topics []string) error {
	cfg.Defaults()
	admin, err := kafka.NewAdmin(cfg)
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

// Record is a record read back by Tail.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   map[string]string
	Timestamp time.Time
}

// Tail reads every partition of topics from the oldest offset and calls fn
// for each record until ctx ends or fn returns false. It is meant for the
// demo and for tools, not for the relay's path.
func Tail(ctx context.Context, cfg kafka.Config, topics []string, fn func(Record) bool) error {
	return TailIsolated(ctx, cfg, topics, sarama.ReadUncommitted, fn)
}

// TailIsolated is Tail with a consumer of isolation level iso:
// sarama.ReadCommitted sees the records of a transaction once it commits,
// and never those of aborted ones.
func TailIsolated(ctx context.Context, cfg kafka.Config, topics []string, iso sarama.IsolationLevel, fn func(Record) bool) error {
	cfg.Defaults()
	sc, err := cfg.Sarama()
	if err != nil {
		return err
	}
	sc.Consumer.IsolationLevel = iso
	sc.Consumer.Return.Errors = false
	consumer, err := sarama.NewConsumer(cfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	defer consumer.Close()
	out := make(chan *sarama.ConsumerMessage)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pcs []sarama.PartitionConsumer
	var wg sync.WaitGroup
	done := make(chan struct{})
	defer func() {
		cancel()
		close(done)
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait() // each forwarder ends when its partition consumer closes
	}()
	for _, t := range topics {
		parts, err := consumer.Partitions(t)
		if err != nil {
			return fmt.Errorf("kafka: partitions of %q: %w", t, err)
		}
		for _, p := range parts {
			pc, err := consumer.ConsumePartition(t, p, sarama.OffsetOldest)
			if err != nil {
				return fmt.Errorf("kafka: consume %s/%d: %w", t, p, err)
			}
			pcs = append(pcs, pc)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for m := range pc.Messages() {
					select {
					case out <- m:
					case <-done:
					}
				}
			}()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-out:
			r := Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp, Headers: map[string]string{}}
			for _, h := range m.Headers {
				r.Headers[string(h.Key)] = string(h.Value)
			}
			if !fn(r) {
				return nil
			}
		}
	}
}
