package testenv

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// topicTimeout bounds creating a topic until every partition has a leader.
const topicTimeout = time.Minute

// newSaramaConfig is the base client configuration of the helpers.
func newSaramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	// Kafka 4 refuses protocol versions before 2.1; sarama negotiates each
	// API down from this bound.
	cfg.Version = sarama.V4_0_0_0
	cfg.ClientID = "pgoutbox-testenv"
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Net.ReadTimeout = 10 * time.Second
	cfg.Net.WriteTimeout = 10 * time.Second
	cfg.Metadata.Retry.Backoff = 250 * time.Millisecond
	cfg.Admin.Timeout = 30 * time.Second
	cfg.Consumer.Retry.Backoff = 250 * time.Millisecond
	cfg.Consumer.Return.Errors = true
	return cfg
}

// TopicSpec says how [Env.CreateTopicWith] makes a topic.
type TopicSpec struct {
	Partitions int
	// ReplicationFactor 0 means the environment's: 1 on the single broker,
	// 3 on the cluster.
	ReplicationFactor int
	// Configs are topic-level settings, over the environment's (the
	// cluster's topics get min.insync.replicas=2).
	Configs map[string]string
}

// CreateTopic creates a topic with the given number of partitions — with
// one replica on the single broker, with three and min.insync.replicas=2
// on the cluster ([Cluster]) — and waits until the broker reports a leader
// for each. It fails the test if the topic exists already. At the end of a
// test that passed it deletes the topic (a failed test keeps it for
// inspection).
func (e *Env) CreateTopic(t testing.TB, name string, partitions int) {
	t.Helper()
	e.CreateTopicWith(t, name, TopicSpec{Partitions: partitions})
}

// Tombstone writes a record with key and no value to topic (an offsets
// topic's record of a slot removed, say), acknowledged by every replica.
func (e *Env) Tombstone(t testing.TB, topic string, key []byte) {
	t.Helper()
	p := e.syncProducer(t)
	defer func() { _ = p.Close() }()
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.ByteEncoder(key)}); err != nil {
		t.Fatalf("tombstone for %q on %s: %v", key, topic, err)
	}
}

// syncProducer is a producer whose records every replica acknowledges.
func (e *Env) syncProducer(t testing.TB) sarama.SyncProducer {
	t.Helper()
	cfg := newSaramaConfig()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(e.KafkaBrokers, cfg)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	return p
}

// CreateTopicWith is CreateTopic with a replication factor and topic
// settings of the test's choosing.
func (e *Env) CreateTopicWith(t testing.TB, name string, spec TopicSpec) {
	t.Helper()
	partitions := spec.Partitions
	rf := spec.ReplicationFactor
	if rf == 0 {
		rf = max(e.topics.ReplicationFactor, 1)
	}
	var configs map[string]*string
	for _, m := range []map[string]string{e.topics.Configs, spec.Configs} {
		for k, v := range m {
			if configs == nil {
				configs = map[string]*string{}
			}
			configs[k] = &v
		}
	}
	// A cluster just started may list a broker whose listener is not open
	// yet (a CI run met "connection refused" from one): such errors are
	// retried with a fresh admin client, for up to a minute.
	detail := &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: int16(rf), ConfigEntries: configs}
	deadline := time.Now().Add(time.Minute)
	for try := 0; ; try++ {
		err := createTopic(e.KafkaBrokers, name, detail)
		if err == nil || (try > 0 && errors.Is(err, sarama.ErrTopicAlreadyExists)) {
			break
		}
		if !retriableAdminError(err) || time.Now().After(deadline) {
			t.Fatalf("testenv: create topic %s: %v", name, err)
		}
		time.Sleep(200 * time.Millisecond) // a retry's pace, bounded by the deadline
	}
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		if err := e.ensureUp(); err != nil {
			t.Errorf("testenv: %v", err)
			return
		}
		if err := e.deleteTopic(name); err != nil {
			t.Logf("testenv: delete topic %s: %v", name, err)
		}
	})
	// A leader in the metadata is not yet a leader that serves: the broker
	// applies the new metadata a moment later, and until then it answers
	// NOT_LEADER_OR_FOLLOWER. Asking each partition for its end offset
	// waits for the real thing.
	client, err := sarama.NewClient(e.KafkaBrokers, newSaramaConfig())
	if err != nil {
		t.Fatalf("testenv: connect to Kafka: %v", err)
	}
	defer func() { _ = client.Close() }()
	Eventually(t, topicTimeout, 50*time.Millisecond, func() (bool, string) {
		if err := client.RefreshMetadata(name); err != nil {
			return false, fmt.Sprintf("topic %s: metadata: %v", name, err)
		}
		parts, err := client.Partitions(name)
		if err != nil || len(parts) != partitions {
			return false, fmt.Sprintf("topic %s: %d of %d partitions (%v)", name, len(parts), partitions, err)
		}
		for _, p := range parts {
			if _, err := client.GetOffset(name, p, sarama.OffsetNewest); err != nil {
				return false, fmt.Sprintf("topic %s partition %d: end offset: %v", name, p, err)
			}
		}
		// Every broker must know the topic too: a request about it
		// (DescribeConfigs, metadata) may go to any broker, and one that
		// has not applied the new metadata yet answers
		// UNKNOWN_TOPIC_OR_PARTITION.
		for _, b := range client.Brokers() {
			if err := b.Open(client.Config()); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
				return false, fmt.Sprintf("topic %s: connect to broker %s: %v", name, b.Addr(), err)
			}
			req := sarama.NewMetadataRequest(client.Config().Version, []string{name})
			md, err := b.GetMetadata(req)
			if err != nil {
				return false, fmt.Sprintf("topic %s: metadata from broker %s: %v", name, b.Addr(), err)
			}
			if len(md.Topics) != 1 || md.Topics[0].Err != sarama.ErrNoError || len(md.Topics[0].Partitions) != partitions {
				return false, fmt.Sprintf("topic %s: broker %s does not know it yet", name, b.Addr())
			}
		}
		return true, ""
	})
}

// DeleteTopic deletes topic name while the test runs (under a client that
// produces to it, say) and waits until the broker no longer knows it.
func (e *Env) DeleteTopic(t testing.TB, name string) {
	t.Helper()
	if err := e.deleteTopic(name); err != nil {
		t.Fatalf("testenv: delete topic %s: %v", name, err)
	}
	cfg := newSaramaConfig()
	cfg.Metadata.AllowAutoTopicCreation = false
	cfg.Metadata.Retry.Max = 0
	client, err := sarama.NewClient(e.KafkaBrokers, cfg)
	if err != nil {
		t.Fatalf("testenv: connect to Kafka: %v", err)
	}
	defer func() { _ = client.Close() }()
	Eventually(t, topicTimeout, 50*time.Millisecond, func() (bool, string) {
		err := client.RefreshMetadata(name)
		return errors.Is(err, sarama.ErrUnknownTopicOrPartition), fmt.Sprintf("topic %s still known after its deletion: %v", name, err)
	})
}

func (e *Env) deleteTopic(name string) error {
	cfg := newSaramaConfig()
	cfg.Admin.Timeout = 10 * time.Second
	admin, err := sarama.NewClusterAdmin(e.KafkaBrokers, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	return admin.DeleteTopic(name)
}

// Header is a Kafka record header. A record may repeat a key.
type Header struct {
	Key   string
	Value []byte
}

// Message is a record read back from Kafka.
type Message struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte // nil for a null key
	Value     []byte // nil for a null value (a tombstone)
	Headers   []Header
	Timestamp time.Time
}

// Header returns the value of the first header named key.
func (m Message) Header(key string) (value []byte, ok bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

// ConsumerOption configures NewConsumer.
type ConsumerOption func(*sarama.Config)

// ReadCommitted makes the consumer skip records of aborted and open
// transactions (isolation.level=read_committed). By default it reads
// uncommitted ones too.
func ReadCommitted() ConsumerOption {
	return func(c *sarama.Config) { c.Consumer.IsolationLevel = sarama.ReadCommitted }
}

// Consumer reads every partition of some topics from the oldest offset,
// without a consumer group, collecting the messages in the background until
// Close. Its methods are safe for concurrent use.
//
// The partitions are those the topics had when the Consumer was made.
// Messages of one partition are collected in offset order; partitions
// interleave arbitrarily.
type Consumer struct {
	topics   []string
	consumer sarama.Consumer
	pcs      []sarama.PartitionConsumer
	wg       sync.WaitGroup
	once     sync.Once
	arrived  chan struct{} // capacity 1: something arrived since the last look

	mu     sync.Mutex
	msgs   []Message
	polled int
	errs   []error // the last few consumer errors, for failure messages
}

// NewConsumer starts a Consumer of topics; the test's cleanup closes it.
func (e *Env) NewConsumer(t testing.TB, topics []string, opts ...ConsumerOption) *Consumer {
	t.Helper()
	cfg := newSaramaConfig()
	for _, o := range opts {
		o(cfg)
	}
	sc, err := sarama.NewConsumer(e.KafkaBrokers, cfg)
	if err != nil {
		t.Fatalf("testenv: connect to Kafka: %v", err)
	}
	c := &Consumer{topics: slices.Clone(topics), consumer: sc, arrived: make(chan struct{}, 1)}
	t.Cleanup(c.Close)
	for _, topic := range topics {
		parts := partitionsOf(t, sc, topic)
		for _, p := range parts {
			pc := consumePartition(t, sc, topic, p)
			c.pcs = append(c.pcs, pc)
			c.wg.Add(2)
			go func() {
				defer c.wg.Done()
				for m := range pc.Messages() {
					c.add(convert(m))
				}
			}()
			go func() {
				defer c.wg.Done()
				for err := range pc.Errors() {
					c.addErr(err)
				}
			}()
		}
	}
	return c
}

// partitionsOf lists a topic's partitions, waiting for a topic that is
// still being created to show.
func partitionsOf(t testing.TB, sc sarama.Consumer, topic string) []int32 {
	t.Helper()
	deadline := time.Now().Add(topicTimeout)
	for {
		parts, err := sc.Partitions(topic)
		if err == nil && len(parts) > 0 {
			return parts
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: partitions of %s: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// consumePartition starts consuming a partition from its oldest offset,
// retrying while its leader is not serving yet (a topic just created, a
// broker just restarted).
func consumePartition(t testing.TB, sc sarama.Consumer, topic string, p int32) sarama.PartitionConsumer {
	t.Helper()
	deadline := time.Now().Add(topicTimeout)
	for {
		pc, err := sc.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err == nil {
			return pc
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: consume %s/%d: %v", topic, p, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func convert(m *sarama.ConsumerMessage) Message {
	msg := Message{
		Topic:     m.Topic,
		Partition: m.Partition,
		Offset:    m.Offset,
		Key:       m.Key,
		Value:     m.Value,
		Timestamp: m.Timestamp,
	}
	for _, h := range m.Headers {
		if h != nil {
			msg.Headers = append(msg.Headers, Header{Key: string(h.Key), Value: h.Value})
		}
	}
	return msg
}

func (c *Consumer) add(m Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, m)
	c.mu.Unlock()
	c.signal()
}

func (c *Consumer) addErr(err error) {
	c.mu.Lock()
	if len(c.errs) == 10 {
		c.errs = c.errs[1:]
	}
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

func (c *Consumer) signal() {
	select {
	case c.arrived <- struct{}{}:
	default:
	}
}

// Messages returns every message collected so far.
func (c *Consumer) Messages() []Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// Len returns how many messages have been collected so far.
func (c *Consumer) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// Poll returns the messages collected since the previous Poll, without
// waiting.
func (c *Consumer) Poll() []Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.msgs[c.polled:])
	c.polled = len(c.msgs)
	return out
}

// WaitFor waits until at least n messages have been collected in all and
// returns every message collected; it fails the test after timeout.
func (c *Consumer) WaitFor(t testing.TB, n int, timeout time.Duration) []Message {
	t.Helper()
	msgs, ok := c.wait(func(got int) bool { return got >= n }, timeout)
	if !ok {
		t.Fatalf("testenv: %d of %d messages from %v after %s; recent consumer errors: %v", len(msgs), n, c.topics, timeout, c.recentErrors())
	}
	return msgs
}

// wait returns every message collected once until(count) holds, or at the
// deadline with ok false.
func (c *Consumer) wait(until func(n int) bool, timeout time.Duration) (msgs []Message, ok bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		done := until != nil && until(len(c.msgs))
		c.mu.Unlock()
		if done {
			return c.Messages(), true
		}
		select {
		case <-c.arrived:
		case <-deadline.C:
			return c.Messages(), false
		}
	}
}

func (c *Consumer) recentErrors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.errs)
}

// Close stops the Consumer; the messages collected stay readable. It may be
// called more than once.
func (c *Consumer) Close() {
	c.once.Do(func() {
		for _, pc := range c.pcs {
			pc.AsyncClose()
		}
		c.wg.Wait() // the goroutines drain both channels until sarama closes them
		_ = c.consumer.Close()
	})
}

// ConsumeAll reads topics from the oldest offsets and returns every message
// read once until(number of messages read) is true; it fails the test if
// that takes longer than timeout. With until nil it reads for the whole
// timeout and returns what it read (to check that nothing more arrives).
func (e *Env) ConsumeAll(t testing.TB, topics []string, timeout time.Duration, until func(n int) bool) []Message {
	t.Helper()
	c := e.NewConsumer(t, topics)
	defer c.Close()
	msgs, ok := c.wait(until, timeout)
	if !ok && until != nil {
		t.Fatalf("testenv: condition not met by the %d messages read from %v in %s; recent consumer errors: %v", len(msgs), topics, timeout, c.recentErrors())
	}
	return msgs
}

// createTopic creates a topic with a new admin client.
func createTopic(brokers []string, name string, detail *sarama.TopicDetail) error {
	admin, err := sarama.NewClusterAdmin(brokers, newSaramaConfig())
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	return admin.CreateTopic(name, detail, false)
}

// retriableAdminError says whether err is a broker not reachable yet or not
// in its role yet, which a cluster that is starting gives for a moment.
func retriableAdminError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, sarama.ErrOutOfBrokers) ||
		errors.Is(err, sarama.ErrNotController) || errors.Is(err, sarama.ErrLeaderNotAvailable) ||
		errors.Is(err, sarama.ErrBrokerNotAvailable) || errors.Is(err, sarama.ErrClosedClient)
}
