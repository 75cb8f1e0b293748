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
// not used on the relay's path. Each call asks each broker once, for all
// the partitions it leads (one ListOffsets request per broker rather than
// per partition: a benchmark polling 1,000 topics every 10 ms would
// otherwise load the broker it measures). It is not safe for concurrent
// use.
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
	hw, err := w.highWater([]string{topic})
	return hw[topic], err
}

// Total returns the sum of the high-water marks of every partition of
// topics: for topics that were empty and never truncated, the number of
// records written to them.
func (w *OffsetWatcher) Total(topics ...string) (int64, error) {
	hw, err := w.highWater(topics)
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, parts := range hw {
		for _, off := range parts {
			sum += off
		}
	}
	return sum, nil
}

func (w *OffsetWatcher) highWater(topics []string) (map[string]map[int32]int64, error) {
	reqs := map[*sarama.Broker]*sarama.OffsetRequest{}
	for _, t := range topics {
		parts, ok := w.parts[t]
		if !ok {
			var err error
			if parts, err = w.client.Partitions(t); err != nil {
				return nil, fmt.Errorf("kafka: partitions of %q: %w", t, err)
			}
			w.parts[t] = parts
		}
		for _, p := range parts {
			b, err := w.client.Leader(t, p)
			if err != nil {
				return nil, fmt.Errorf("kafka: leader of %s/%d: %w", t, p, err)
			}
			if reqs[b] == nil {
				reqs[b] = sarama.NewOffsetRequest(w.client.Config().Version)
			}
			reqs[b].AddBlock(t, p, sarama.OffsetNewest, 1)
		}
	}
	out := make(map[string]map[int32]int64, len(topics))
	for b, req := range reqs {
		resp, err := b.GetAvailableOffsets(req)
		if err != nil {
			_ = b.Close() // the client opens it again
			return nil, fmt.Errorf("kafka: high-water marks from broker %s: %w", b.Addr(), err)
		}
		for t, blocks := range resp.Blocks {
			for p, blk := range blocks {
				if !errors.Is(blk.Err, sarama.ErrNoError) {
					return nil, fmt.Errorf("kafka: high-water mark of %s/%d: %w", t, p, blk.Err)
				}
				if out[t] == nil {
					out[t] = map[int32]int64{}
				}
				out[t][p] = blk.Offset
			}
		}
	}
	for _, t := range topics {
		if len(out[t]) != len(w.parts[t]) {
			return nil, fmt.Errorf("kafka: high-water marks of %s: %d of %d partitions answered", t, len(out[t]), len(w.parts[t]))
		}
	}
	return out, nil
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
	return TailWith(ctx, cfg, topics, TailOptions{Isolation: iso}, fn)
}

// TailOptions say how TailWith reads.
type TailOptions struct {
	Isolation sarama.IsolationLevel
	// Newest starts each partition at its end as it is when its consumer
	// starts, instead of its oldest offset.
	Newest bool
	// Started, if set, is called once every partition's consumer has
	// started: from then on every record appended is read.
	Started func()
}

// TailWith is Tail with options.
func TailWith(ctx context.Context, cfg kafka.Config, topics []string, o TailOptions, fn func(Record) bool) error {
	from := sarama.OffsetOldest
	if o.Newest {
		from = sarama.OffsetNewest
	}
	cfg.Defaults()
	sc, err := cfg.Sarama()
	if err != nil {
		return err
	}
	sc.Consumer.IsolationLevel = o.Isolation
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
			pc, err := consumer.ConsumePartition(t, p, from)
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
	if o.Started != nil {
		o.Started()
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
