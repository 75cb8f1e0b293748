package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// CreateTopics creates the topics that do not exist yet, with the given
// partition count and replication factor, and waits until the cluster's
// metadata lists them and every partition's leader serves. Topics that
// already exist are left as they are.
func CreateTopics(cfg Config, topics []string, partitions int32, replication int16) error {
	return CreateTopicsWithConfig(cfg, topics, partitions, replication, nil)
}

// CreateTopicsWithConfig is CreateTopics with topic configuration entries
// (for example message.timestamp.type=LogAppendTime) for the topics it
// creates.
func CreateTopicsWithConfig(cfg Config, topics []string, partitions int32, replication int16, configs map[string]string) error {
	cfg.Defaults()
	sc, admin, err := newAdmin(cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	var entries map[string]*string
	for k, v := range configs {
		if entries == nil {
			entries = map[string]*string{}
		}
		entries[k] = &v
	}
	for _, t := range topics {
		err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: replication, ConfigEntries: entries}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("kafka: create topic %q: %w", t, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := admin.DescribeTopics(topics)
		missing := ""
		if err == nil {
			for _, m := range md {
				if m.Err != sarama.ErrNoError || len(m.Partitions) == 0 {
					missing = m.Name
					break
				}
				// A partition without a leader yet fails a consumer or
				// producer that starts at once.
				for _, p := range m.Partitions {
					if p.Err != sarama.ErrNoError || p.Leader < 0 {
						missing = m.Name
					}
				}
			}
		}
		if err == nil && missing == "" {
			return waitLeaders(cfg, sc, topics, deadline)
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("topic %q not in the metadata with a leader for every partition yet", missing)
			}
			return fmt.Errorf("kafka: wait for topics: %w", err)
		}
		time.Sleep(100 * time.Millisecond) // metadata propagation; bounded by deadline
	}
}

// newAdmin opens a cluster admin client with cfg (defaults applied) and
// returns the sarama configuration it was made with.
func newAdmin(cfg Config) (*sarama.Config, sarama.ClusterAdmin, error) {
	sc, err := cfg.sarama()
	if err != nil {
		return nil, nil, err
	}
	sc.Metadata.Full = true // the admin client refreshes metadata without naming topics
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, sc)
	if err != nil {
		brokers := strings.Join(cfg.Brokers, ",")
		return nil, nil, fmt.Errorf("kafka: connect to brokers %s: %w", brokers, cfg.Security.authError(brokers, err))
	}
	return sc, admin, nil
}

// waitLeaders waits until every partition of topics answers a request for
// its end offset: a leader listed in the metadata may not have applied that
// metadata yet, and until it has it answers NOT_LEADER_OR_FOLLOWER, which
// a consumer started at once (Tail) takes as fatal.
func waitLeaders(cfg Config, sc *sarama.Config, topics []string, deadline time.Time) error {
	client, err := sarama.NewClient(cfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	defer client.Close()
	for _, t := range topics {
		parts, err := client.Partitions(t)
		if err != nil {
			return fmt.Errorf("kafka: partitions of %q: %w", t, err)
		}
		for _, p := range parts {
			for {
				_, err := client.GetOffset(t, p, sarama.OffsetNewest)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("kafka: wait for the leader of %s/%d: %w", t, p, err)
				}
				_ = client.RefreshMetadata(t)
				time.Sleep(100 * time.Millisecond) // leader catching up; bounded by deadline
			}
		}
	}
	return nil
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
func Tail(ctx context.Context, cfg Config, topics []string, fn func(Record) bool) error {
	cfg.Defaults()
	sc, err := cfg.sarama()
	if err != nil {
		return err
	}
	sc.Consumer.Return.Errors = false
	consumer, err := sarama.NewConsumer(cfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), cfg.Security.authError(strings.Join(cfg.Brokers, ","), err))
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
