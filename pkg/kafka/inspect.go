package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

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
	// ReplicationFactor is the number of replicas of its first partition.
	ReplicationFactor int
	// Configs holds the topic's settings that matter to delivery
	// (max.message.bytes, min.insync.replicas,
	// unclean.leader.election.enable, and retention.ms,
	// message.timestamp.type and cleanup.policy, which say how long it
	// keeps a record by the record's timestamp), when the broker answered a
	// DescribeConfigs for it (the credentials may not allow it); a missing
	// key means unknown.
	Configs map[string]string
	// Err is nil when the topic exists and is usable, ErrTopicMissing when
	// the cluster does not know it, or the broker's error for the topic
	// otherwise (for example TOPIC_AUTHORIZATION_FAILED).
	Err error
}

// Ping checks that at least one of cfg's brokers accepts a connection and
// answers ApiVersions. It tries each broker once, bounded by DialTimeout
// and ReadTimeout, and names every broker and its error when none answers.
func Ping(ctx context.Context, cfg Config) error {
	cfg.Defaults()
	sc, err := cfg.sarama()
	if err != nil {
		return err
	}
	_, err = probe(ctx, &cfg, sc)
	return err
}

// CheckTopics asks the cluster about topics with one metadata request, and
// one DescribeConfigs request for the topics that exist, and returns one
// TopicState per topic, in the order given. It never creates a topic,
// whatever auto.create.topics says. The error is set when no broker could be
// asked; per-topic problems are in the TopicStates. ctx ending closes the
// connection, so a broker that does not answer holds it up no longer.
func CheckTopics(ctx context.Context, cfg Config, topics []string) ([]TopicState, error) {
	cfg.Defaults()
	sc, err := cfg.sarama()
	if err != nil {
		return nil, err
	}
	if len(topics) == 0 {
		return nil, nil
	}
	var out []TopicState
	var errs []string
	for _, addr := range cfg.Brokers {
		out, err = topicStates(ctx, addr, sc, topics)
		if err == nil {
			return out, nil
		}
		var ae *AuthError
		if err = cfg.Security.authError(addr, err); errors.As(err, &ae) {
			return nil, err
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("kafka: read topic metadata: no broker answered among %s: %s",
		strings.Join(cfg.Brokers, ","), strings.Join(errs, "; "))
}

// topicConfigs are the topic settings CheckTopics reads.
var topicConfigs = []string{"max.message.bytes", "min.insync.replicas", "unclean.leader.election.enable",
	"retention.ms", "message.timestamp.type", "cleanup.policy"}

// openBroker connects to the broker at addr for one exchange; ctx's end
// closes the connection (and a dial in progress). The func returned
// releases it.
func openBroker(ctx context.Context, addr string, sc *sarama.Config) (*sarama.Broker, func(), error) {
	sc, release := withCancel(ctx, sc)
	b := sarama.NewBroker(addr)
	if err := b.Open(sc); err != nil {
		release()
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = b.Close() })
	closeB := func() {
		if stop() {
			_ = b.Close()
		}
		release()
	}
	if ok, err := b.Connected(); !ok {
		closeB()
		if err == nil {
			err = errors.New("not connected")
		}
		return nil, nil, err
	}
	return b, closeB, nil
}

// topicStates asks the broker at addr. The metadata request leaves
// AllowAutoTopicCreation false: asking must not create.
func topicStates(ctx context.Context, addr string, sc *sarama.Config, topics []string) ([]TopicState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, closeB, err := openBroker(ctx, addr, sc)
	if err != nil {
		return nil, err
	}
	defer closeB()
	req := sarama.NewMetadataRequest(sc.Version, topics)
	req.AllowAutoTopicCreation = false
	md, err := b.GetMetadata(req)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return nil, err
	}
	byName := make(map[string]*sarama.TopicMetadata, len(md.Topics))
	for _, t := range md.Topics {
		byName[t.Name] = t
	}
	out := make([]TopicState, len(topics))
	var existing []*sarama.ConfigResource
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
			if len(t.Partitions) > 0 {
				s.ReplicationFactor = len(t.Partitions[0].Replicas)
			}
			existing = append(existing, &sarama.ConfigResource{Type: sarama.TopicResource, Name: name, ConfigNames: topicConfigs})
		}
		out[i] = s
	}
	if len(existing) == 0 {
		return out, nil
	}
	// Not every user may describe configs: without them the settings stay
	// unknown, which is not an error.
	dc, err := b.DescribeConfigs(&sarama.DescribeConfigsRequest{Version: 1, Resources: existing})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return out, nil
	}
	for _, r := range dc.Resources {
		if r.ErrorCode != 0 {
			continue
		}
		for i := range out {
			if out[i].Topic != r.Name {
				continue
			}
			out[i].Configs = make(map[string]string, len(r.Configs))
			for _, c := range r.Configs {
				out[i].Configs[c.Name] = c.Value
			}
		}
	}
	return out, nil
}

// MaxMessageBytes returns the topic's max.message.bytes, if known.
func (s TopicState) MaxMessageBytes() (int, bool) {
	v, ok := s.Configs["max.message.bytes"]
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil
}

// TimestampRetention says how long the topic keeps a record by the
// timestamp the record was produced with: the broker deletes a segment once
// its newest timestamp is older than retention.ms, and it rolls a segment
// for a record whose timestamp is old, so such a record is deleted at the
// next retention check (log.retention.check.interval.ms, 5 minutes by
// default) whatever else the topic holds. deletes is false when no record
// is deleted by the timestamp it carries: retention.ms negative (-1:
// kept for ever), message.timestamp.type=LogAppendTime (the broker stamps
// the time it appends), or a cleanup.policy without delete (compact
// alone). known is false when the settings were not read (the credentials
// may not describe the topic's configs); deletes is false then too.
func (s TopicState) TimestampRetention() (retention time.Duration, deletes, known bool) {
	ms, ok := s.Configs["retention.ms"]
	typ, typOK := s.Configs["message.timestamp.type"]
	if !ok || !typOK {
		return 0, false, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(ms), 10, 64)
	if err != nil {
		return 0, false, false
	}
	if strings.EqualFold(strings.TrimSpace(typ), "LogAppendTime") || n < 0 {
		return 0, false, true
	}
	// The broker's default is delete; an empty policy (Kafka 4.1) deletes
	// nothing.
	if policy, ok := s.Configs["cleanup.policy"]; ok {
		del := false
		for _, p := range strings.Split(policy, ",") {
			del = del || strings.EqualFold(strings.TrimSpace(p), "delete")
		}
		if !del {
			return 0, false, true
		}
	}
	if n > math.MaxInt64/int64(time.Millisecond) {
		return 0, false, true // longer than time.Duration holds: 292 years
	}
	return time.Duration(n) * time.Millisecond, true, true
}
