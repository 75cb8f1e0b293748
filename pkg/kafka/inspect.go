package kafka

import (
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
)

// ErrTopicMissing is the error of a [TopicState] whose topic the cluster does
// not know.
var ErrTopicMissing = errors.New("kafka: topic does not exist")

// TopicState is what the cluster's metadata says about one topic.
type TopicState struct {
	Topic string
	// Partitions is the topic's partition count; 0 when Err is set.
	Partitions int32
	// Err is nil when the topic exists and is usable, ErrTopicMissing when
	// the cluster does not know it, or the broker's error for the topic
	// otherwise (for example TOPIC_AUTHORIZATION_FAILED).
	Err error
}

// Ping checks that at least one of cfg's brokers accepts a connection and
// answers ApiVersions. It tries each broker once, bounded by DialTimeout
// and ReadTimeout, and names every broker and its error when none answers.
func Ping(cfg Config) error {
	cfg.Defaults()
	sc, err := cfg.sarama()
	if err != nil {
		return err
	}
	return probe(&cfg, sc)
}

// CheckTopics asks the cluster about topics with one metadata request and
// returns one TopicState per topic, in the order given. It never creates a
// topic, whatever auto.create.topics says. The error is set when no broker
// could be asked; per-topic problems are in the TopicStates.
func CheckTopics(cfg Config, topics []string) ([]TopicState, error) {
	cfg.Defaults()
	sc, err := cfg.sarama()
	if err != nil {
		return nil, err
	}
	if len(topics) == 0 {
		return nil, nil
	}
	var md *sarama.MetadataResponse
	var errs []string
	for _, addr := range cfg.Brokers {
		md, err = topicMetadata(addr, sc, topics)
		if err == nil {
			break
		}
		var ae *AuthError
		if err = cfg.Security.authError(addr, err); errors.As(err, &ae) {
			return nil, err
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
	}
	if md == nil {
		return nil, fmt.Errorf("kafka: read topic metadata: no broker answered among %s: %s",
			strings.Join(cfg.Brokers, ","), strings.Join(errs, "; "))
	}
	byName := make(map[string]*sarama.TopicMetadata, len(md.Topics))
	for _, t := range md.Topics {
		byName[t.Name] = t
	}
	out := make([]TopicState, len(topics))
	for i, name := range topics {
		s := TopicState{Topic: name}
		t, ok := byName[name]
		switch {
		case !ok, errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition):
			s.Err = ErrTopicMissing
		case t.Err != sarama.ErrNoError:
			s.Err = fmt.Errorf("kafka: topic %q: %w", name, t.Err)
		default:
			s.Partitions = int32(len(t.Partitions))
		}
		out[i] = s
	}
	return out, nil
}

// topicMetadata sends one metadata request for topics to the broker at addr.
// The request leaves AllowAutoTopicCreation false: asking must not create.
func topicMetadata(addr string, sc *sarama.Config, topics []string) (*sarama.MetadataResponse, error) {
	b := sarama.NewBroker(addr)
	if err := b.Open(sc); err != nil {
		return nil, err
	}
	defer func() { _ = b.Close() }()
	if ok, err := b.Connected(); !ok {
		if err == nil {
			err = errors.New("not connected")
		}
		return nil, err
	}
	req := sarama.NewMetadataRequest(sc.Version, topics)
	req.AllowAutoTopicCreation = false
	return b.GetMetadata(req)
}
