package kafka

import (
	"errors"
	"fmt"
	"strings"
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

// NewAdmin opens a cluster admin client with cfg (defaults applied), for
// tools and tests; close it when done.
func NewAdmin(cfg Config) (sarama.ClusterAdmin, error) {
	cfg.Defaults()
	_, admin, err := newAdmin(cfg)
	return admin, err
}

// Sarama returns the sarama configuration the producer would use for c
// (defaults applied first), for tools and tests that talk to Kafka with
// sarama directly.
func (c Config) Sarama() (*sarama.Config, error) {
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.sarama()
}
