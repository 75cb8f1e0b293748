package kafka

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/IBM/sarama"
	gometrics "github.com/rcrowley/go-metrics"
)

// Defaults applied by [Config.Defaults] to fields left at their zero value.
const (
	DefaultClientID        = "pgoutbox"
	DefaultVersion         = "4.0.0"
	DefaultMaxMessageBytes = 1 << 20 // 1 MiB, Kafka's own default max.message.bytes
	DefaultCompression     = "none"

	// DefaultFlushFrequency bounds the time a record waits in a batch while
	// no request is in flight to its broker: without it, below saturation,
	// sarama sends a request for every one to three records (DESIGN.md,
	// "Latency and throughput", has the measurements).
	DefaultFlushFrequency = time.Millisecond
	// DefaultFlushBytes flushes a batch early once this many bytes wait for
	// one broker, so big records do not wait for the timer.
	DefaultFlushBytes = 256 << 10
	// DefaultFlushMessages flushes a batch early once this many records wait
	// for one broker.
	DefaultFlushMessages = 1000

	// The retry defaults follow the Java client (retry.backoff.ms 100,
	// retry.backoff.max.ms 1000) and give each record about 37 s of backoff
	// (100+200+400+800 ms, then 1 s per retry) before it fails: enough to
	// ride out a broker restart or a ~30 s outage. The metadata refresh that
	// runs before each retry waits with the same backoff, so it too outlasts
	// an outage instead of failing the record early (unless MetadataTimeout
	// says otherwise: see sarama()).
	// DefaultRetryMax and DefaultMetadataRetryMax retry for a long time
	// (1000 tries, about 16 minutes at the 1 s backoff cap): a record that
	// fails after its retries leaves a gap, and sarama goes on sending later
	// records of the same partition, which then land before the failed one
	// is resent. Retrying through an outage keeps per-key order; the relay's
	// in-flight caps bound memory meanwhile. (sarama keeps per-partition
	// state for every retry level, so "unlimited" is not an option.)
	DefaultRetryMax         = 1000
	DefaultRetryBackoff     = 100 * time.Millisecond
	DefaultRetryBackoffMax  = time.Second
	DefaultMetadataRetryMax = 1000

	// DefaultAckBuffer is the capacity of [Producer.Acks]: the most records
	// a caller may have sent but not yet received the ack of. 8192 covers
	// ~100,000 records/s at 80 ms of Kafka round trip.
	DefaultAckBuffer = 8192
	// DefaultRetryBufferBytes bounds the bytes of records waiting in sarama's
	// retry buffer; beyond it records fail with ErrProducerRetryBufferOverflow.
	DefaultRetryBufferBytes = 256 << 20

	// DefaultTopicMissingTimeout is how long a topic the cluster does not
	// know is asked about again before its records count as poison: a
	// topic created a moment ago may not be in every broker's metadata
	// yet.
	DefaultTopicMissingTimeout = time.Minute

	// Exactly-once mode (kafka.exactly.once). DefaultTransactionTimeout is
	// Kafka's own default transaction.timeout.ms: the longest a Kafka
	// transaction, and so the records of one PostgreSQL transaction, may
	// take from its first record to its commit. DefaultTransactionInterval
	// is how long a Kafka transaction stays open for more PostgreSQL
	// transactions after its first record; DefaultTransactionMaxRecords ends
	// it earlier.
	DefaultTransactionTimeout    = time.Minute
	DefaultOffsetsTopic          = "pgoutbox.offsets"
	DefaultTransactionInterval   = 5 * time.Millisecond
	DefaultTransactionMaxRecords = 10000

	DefaultDialTimeout    = 10 * time.Second
	DefaultReadTimeout    = 30 * time.Second
	DefaultWriteTimeout   = 30 * time.Second
	DefaultRequestTimeout = 10 * time.Second
)

// txnRetries is how often a record or a transaction request is retried in
// exactly-once mode: for about the transaction timeout.
func (c *Config) txnRetries() int {
	return 8 + int(c.TransactionTimeout/max(c.RetryBackoffMax, time.Millisecond))
}

// txnRetryBackoff is the first wait before a transaction request is
// retried.
const txnRetryBackoff = 2 * time.Millisecond

// minVersion is the oldest protocol level Kafka 4 still speaks.
var minVersion = sarama.V2_1_0_0

// Config configures a [Producer]. The zero value of any field except
// Brokers means its default; call [Config.Defaults] to fill them in and
// [Config.Validate] to check the result. New does both.
//
// Options that can only make the producer unsafe (acks, idempotence,
// in-flight requests, partitioner) are not configurable.
type Config struct {
	// Brokers are the seed brokers, host:port each.
	Brokers []string `yaml:"brokers"`
	// ClientID is sent to the brokers (logs, quotas). Default "pgoutbox".
	ClientID string `yaml:"client.id"`
	// Version is the newest Kafka protocol level to use; requests are
	// negotiated per API below it. At least 2.1.0, which Kafka 4 requires.
	// Default "4.0.0".
	Version string `yaml:"version"`

	// MaxMessageBytes is the largest record (key, value, headers and
	// overhead) the producer accepts, and the largest uncompressed batch per
	// partition. Larger records fail with an error ack without being sent.
	// Keep it at most the topic's max.message.bytes. Default 1 MiB.
	MaxMessageBytes int `yaml:"max.message.bytes"`
	// Compression is one of none, gzip, snappy, lz4, zstd. Default none.
	Compression string `yaml:"compression"`

	// FlushBytes, FlushMessages and FlushFrequency decide when a batch is
	// sent while no request is in flight to its broker (while one is, records
	// accumulate anyway, since only one request per broker may be open).
	// A batch goes when FlushFrequency has passed since its first record or
	// when either threshold is reached. A negative value disables a trigger;
	// the thresholds need the timer. Disabling all three sends each record at
	// once: lowest latency when idle, many tiny requests under moderate load.
	// Defaults 256 KiB, 1000 records, 1 ms.
	FlushBytes     int           `yaml:"flush.bytes"`
	FlushMessages  int           `yaml:"flush.messages"`
	FlushFrequency time.Duration `yaml:"flush.frequency"`

	// RetryMax is how often a record is retried on retriable errors (leader
	// change, broker down, not enough replicas) before it fails. Backoff
	// between tries doubles from RetryBackoff up to RetryBackoffMax; the
	// same backoff applies to metadata refreshes, which are retried
	// MetadataRetryMax times (within MetadataTimeout, if set). Defaults:
	// 1000, 100 ms, 1 s, 1000 (see DefaultRetryMax for why so many).
	RetryMax         int           `yaml:"retry.max"`
	RetryBackoff     time.Duration `yaml:"retry.backoff"`
	RetryBackoffMax  time.Duration `yaml:"retry.backoff.max"`
	MetadataRetryMax int           `yaml:"metadata.retry.max"`

	// AckBuffer is the capacity of the Acks channel. The caller must never
	// have more than AckBuffer records sent and not yet acknowledged (read
	// from Acks); that guarantees the goroutine draining sarama never blocks,
	// which is what keeps sarama from deadlocking. Default 8192. Not a file
	// setting: the relay sets it from relay.max.inflight.records.
	AckBuffer int `yaml:"-"`
	// SingleRecordBatches sends one record per produce request. The relay
	// uses it after the broker refused a batch as too large, to resend its
	// records one by one: only a record too large on its own is poison.
	// Not a file setting.
	SingleRecordBatches bool `yaml:"-"`
	// RetryBufferBytes bounds the bytes of records parked in sarama's retry
	// buffer. Records that overflow it fail. Default 256 MiB.
	RetryBufferBytes int64 `yaml:"retry.buffer.bytes"`

	// AutoCreateTopics lets metadata requests ask the broker to create
	// missing topics (if the broker allows it). Default false: a missing
	// topic fails its records once metadata retries are exhausted.
	AutoCreateTopics bool `yaml:"auto.create.topics"`
	// TopicMissingTimeout is how long the relay asks again about a topic
	// the cluster does not know before its records are poison (they fail,
	// or go to the dead-letter topic). With AutoCreateTopics the relay
	// does not ask (the first record creates the topic) unless the topic
	// was deleted while it ran (its records fail after the producer's
	// retries, or MetadataTimeout). Default 1 minute.
	TopicMissingTimeout time.Duration `yaml:"topic.missing.timeout"`
	// MetadataTimeout bounds each metadata refresh of the producer in
	// time (0: only MetadataRetryMax bounds it, about 16 minutes at the
	// backoff cap). Records whose retry needs metadata no broker gives (a
	// topic deleted while the relay runs, the whole cluster unreachable)
	// fail after it, and the session starts again from the slot. Default 0.
	MetadataTimeout time.Duration `yaml:"metadata.timeout"`

	// ExactlyOnce writes records in Kafka transactions, each holding whole
	// PostgreSQL transactions and one record to OffsetsTopic with the
	// position they end at, so that a read_committed consumer sees every
	// committed event once (see the relay's documentation). Default false:
	// at-least-once.
	ExactlyOnce bool `yaml:"exactly.once"`
	// TransactionalID is the producer's transactional.id. Every instance
	// relaying the same slot must use the same one: the instance that
	// starts fences the one before. Empty: the relay derives it from the
	// server's system identifier, the database and the slot.
	TransactionalID string `yaml:"transactional.id"`
	// TransactionTimeout is transaction.timeout.ms: the coordinator aborts
	// a transaction open longer. At most the brokers'
	// transaction.max.timeout.ms (15 minutes by default). Default 1 minute.
	TransactionTimeout time.Duration `yaml:"transaction.timeout"`
	// OffsetsTopic is the compacted topic that holds, per slot, the commit
	// end LSN of the last PostgreSQL transaction in Kafka. Default
	// "pgoutbox.offsets".
	OffsetsTopic string `yaml:"offsets.topic"`
	// TransactionInterval and TransactionMaxRecords group consecutive
	// PostgreSQL transactions into one Kafka transaction: it is committed
	// at the first transaction boundary once TransactionInterval has
	// passed since its first record or it holds TransactionMaxRecords
	// records (and the commit before it has finished). A negative interval
	// (-1ms) commits at every boundary. Defaults 5 ms and 10,000.
	TransactionInterval   time.Duration `yaml:"transaction.interval"`
	TransactionMaxRecords int           `yaml:"transaction.max.records"`

	// DialTimeout, ReadTimeout and WriteTimeout bound network operations;
	// RequestTimeout is how long a broker waits for its replicas before it
	// answers a produce request (Java's request.timeout.ms, broker side).
	// ReadTimeout must exceed RequestTimeout. Defaults 10 s, 30 s, 30 s, 10 s.
	DialTimeout    time.Duration `yaml:"dial.timeout"`
	ReadTimeout    time.Duration `yaml:"read.timeout"`
	WriteTimeout   time.Duration `yaml:"write.timeout"`
	RequestTimeout time.Duration `yaml:"request.timeout"`

	// Security holds TLS and SASL (security.protocol, sasl.*, ssl.*),
	// applied to every connection: the producer's, and the admin and
	// inspection clients'.
	Security `yaml:",inline"`

	// metadataRefresh, when set, replaces sarama's background metadata
	// refresh interval (10 minutes): tests use it to catch a refresh
	// under way.
	metadataRefresh time.Duration
}

// Defaults sets every zero-valued field except Brokers to its default.
func (c *Config) Defaults() {
	setDefault(&c.ClientID, DefaultClientID)
	setDefault(&c.Version, DefaultVersion)
	setDefault(&c.MaxMessageBytes, DefaultMaxMessageBytes)
	setDefault(&c.Compression, DefaultCompression)
	setDefault(&c.FlushBytes, DefaultFlushBytes)
	setDefault(&c.FlushMessages, DefaultFlushMessages)
	setDefault(&c.FlushFrequency, DefaultFlushFrequency)
	setDefault(&c.RetryMax, DefaultRetryMax)
	setDefault(&c.RetryBackoff, DefaultRetryBackoff)
	setDefault(&c.RetryBackoffMax, DefaultRetryBackoffMax)
	setDefault(&c.MetadataRetryMax, DefaultMetadataRetryMax)
	setDefault(&c.AckBuffer, DefaultAckBuffer)
	setDefault(&c.RetryBufferBytes, DefaultRetryBufferBytes)
	setDefault(&c.TopicMissingTimeout, DefaultTopicMissingTimeout)
	setDefault(&c.TransactionTimeout, DefaultTransactionTimeout)
	setDefault(&c.OffsetsTopic, DefaultOffsetsTopic)
	setDefault(&c.TransactionInterval, DefaultTransactionInterval)
	setDefault(&c.TransactionMaxRecords, DefaultTransactionMaxRecords)
	setDefault(&c.DialTimeout, DefaultDialTimeout)
	setDefault(&c.ReadTimeout, DefaultReadTimeout)
	setDefault(&c.WriteTimeout, DefaultWriteTimeout)
	setDefault(&c.RequestTimeout, DefaultRequestTimeout)
	c.Security.defaults()
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate reports every problem with the configuration, each naming its
// YAML option. Zero-valued fields are checked as their defaults, so Validate
// tells whether New would accept the configuration.
func (c *Config) Validate() error {
	cfg := *c
	cfg.Defaults()
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, fmt.Errorf("kafka: %s: %s", option, fmt.Sprintf(format, args...)))
	}

	if len(cfg.Brokers) == 0 {
		bad("brokers", "at least one broker (host:port) is required")
	}
	for _, b := range cfg.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			bad("brokers", "%q is not host:port", b)
		}
	}
	if _, err := cfg.kafkaVersion(); err != nil {
		errs = append(errs, err)
	}
	if cfg.MaxMessageBytes < 0 || cfg.MaxMessageBytes >= int(sarama.MaxRequestSize) {
		bad("max.message.bytes", "%d is out of range (1 to %d)", cfg.MaxMessageBytes, sarama.MaxRequestSize-1)
	}
	if _, err := compressionCodec(cfg.Compression); err != nil {
		errs = append(errs, err)
	}
	if cfg.FlushBytes >= int(sarama.MaxRequestSize) {
		bad("flush.bytes", "%d must be below %d", cfg.FlushBytes, sarama.MaxRequestSize)
	}
	if cfg.FlushFrequency < 0 && (cfg.FlushBytes > 0 || cfg.FlushMessages > 0) {
		// sarama would hold a batch that never reaches a threshold forever.
		bad("flush.frequency", "must be set while flush.bytes or flush.messages is set (disable those too, with -1)")
	}
	if cfg.FlushFrequency > 0 && cfg.FlushFrequency < time.Microsecond {
		bad("flush.frequency", "%v is below 1µs", cfg.FlushFrequency)
	}
	if cfg.RetryMax < 1 {
		bad("retry.max", "%d must be at least 1 (the idempotent producer needs retries)", cfg.RetryMax)
	}
	if cfg.RetryBackoff < 0 {
		bad("retry.backoff", "%v must not be negative", cfg.RetryBackoff)
	}
	if cfg.RetryBackoffMax < cfg.RetryBackoff {
		bad("retry.backoff.max", "%v is below retry.backoff %v", cfg.RetryBackoffMax, cfg.RetryBackoff)
	}
	if cfg.MetadataRetryMax < 0 {
		bad("metadata.retry.max", "%d must not be negative", cfg.MetadataRetryMax)
	}
	if cfg.AckBuffer < 1 {
		bad("ack.buffer", "%d must be at least 1", cfg.AckBuffer)
	}
	if cfg.RetryBufferBytes < 0 {
		bad("retry.buffer.bytes", "%d must not be negative", cfg.RetryBufferBytes)
	}
	for _, d := range []struct {
		option string
		v      time.Duration
	}{
		{"dial.timeout", cfg.DialTimeout},
		{"read.timeout", cfg.ReadTimeout},
		{"write.timeout", cfg.WriteTimeout},
		{"request.timeout", cfg.RequestTimeout},
		{"topic.missing.timeout", cfg.TopicMissingTimeout},
		{"metadata.timeout", cfg.MetadataTimeout},
	} {
		if d.v < 0 {
			bad(d.option, "%v must not be negative", d.v)
		}
	}
	if cfg.RequestTimeout%time.Millisecond != 0 {
		bad("request.timeout", "%v is not a whole number of milliseconds", cfg.RequestTimeout)
	}
	if cfg.ReadTimeout <= cfg.RequestTimeout {
		bad("read.timeout", "%v must exceed request.timeout %v, or every slow produce request looks like a dead broker", cfg.ReadTimeout, cfg.RequestTimeout)
	}
	if cfg.TransactionTimeout < time.Second || cfg.TransactionTimeout%time.Millisecond != 0 {
		bad("transaction.timeout", "%v must be at least 1s and a whole number of milliseconds", cfg.TransactionTimeout)
	}
	if cfg.TransactionInterval >= cfg.TransactionTimeout/2 {
		bad("transaction.interval", "%v must be below half of transaction.timeout %v (negative: commit at every transaction boundary)", cfg.TransactionInterval, cfg.TransactionTimeout)
	}
	if cfg.TransactionMaxRecords < 1 {
		bad("transaction.max.records", "%d must be at least 1", cfg.TransactionMaxRecords)
	}
	if err := validTopicName(cfg.OffsetsTopic); err != nil {
		bad("offsets.topic", "%q: %v", cfg.OffsetsTopic, err)
	}
	if len(cfg.TransactionalID) > 249 {
		bad("transactional.id", "%d characters: keep it below 250", len(cfg.TransactionalID))
	}
	errs = append(errs, cfg.Security.validate()...)
	return errors.Join(errs...)
}

// validTopicName checks a topic name as the broker does.
func validTopicName(t string) error {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return errors.New("a topic name has 1 to 249 characters and is not . or ..")
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q is not allowed in a topic name", r)
		}
	}
	return nil
}

func (c *Config) kafkaVersion() (sarama.KafkaVersion, error) {
	v, err := sarama.ParseKafkaVersion(c.Version)
	if err != nil {
		return v, fmt.Errorf("kafka: version: %q is not a Kafka version like 4.0.0", c.Version)
	}
	if !v.IsAtLeast(minVersion) {
		return v, fmt.Errorf("kafka: version: %s is below %s, the oldest protocol Kafka 4 accepts", v, minVersion)
	}
	return v, nil
}

func compressionCodec(name string) (sarama.CompressionCodec, error) {
	switch strings.ToLower(name) {
	case "none":
		return sarama.CompressionNone, nil
	case "gzip":
		return sarama.CompressionGZIP, nil
	case "snappy":
		return sarama.CompressionSnappy, nil
	case "lz4":
		return sarama.CompressionLZ4, nil
	case "zstd":
		return sarama.CompressionZSTD, nil
	}
	return sarama.CompressionNone, fmt.Errorf("kafka: compression: %q is not one of none, gzip, snappy, lz4, zstd", name)
}

// backoff returns a capped exponential backoff for sarama's BackoffFunc
// hooks: base, 2·base, 4·base, … up to max. retries counts from 0 for the
// metadata hook and from 1 for the producer hook; both start near base.
func backoff(base, max time.Duration) func(retries, maxRetries int) time.Duration {
	return func(retries, _ int) time.Duration {
		d := base
		for i := 1; i < retries && d < max; i++ {
			d *= 2
		}
		return min(d, max)
	}
}

// initProducerIDRetries is how often sarama's idempotent producer retries
// InitProducerId before it gives up (see sarama()).
const initProducerIDRetries = 8

// saramaChannelBuffer is sarama's ChannelBufferSize (sarama's own default):
// see sarama().
const saramaChannelBuffer = 256

// sarama builds the sarama configuration from a defaulted, valid Config.
func (c *Config) sarama() (*sarama.Config, error) {
	version, err := c.kafkaVersion()
	if err != nil {
		return nil, err
	}
	codec, err := compressionCodec(c.Compression)
	if err != nil {
		return nil, err
	}
	sc := sarama.NewConfig()
	sc.ClientID = c.ClientID
	sc.Version = version

	sc.Net.DialTimeout = c.DialTimeout
	sc.Net.ReadTimeout = c.ReadTimeout
	sc.Net.WriteTimeout = c.WriteTimeout
	// The idempotent producer keeps order across retries only with one
	// request in flight per broker connection.
	sc.Net.MaxOpenRequests = 1
	if err := c.Security.apply(sc); err != nil {
		return nil, err
	}

	// Only the topics we produce to; the full cluster map is memory we
	// never read.
	sc.Metadata.Full = false
	sc.Metadata.AllowAutoTopicCreation = c.AutoCreateTopics
	sc.Metadata.Retry.Max = c.MetadataRetryMax
	sc.Metadata.Retry.Backoff = c.RetryBackoff
	sc.Metadata.Retry.BackoffFunc = backoff(c.RetryBackoff, c.RetryBackoffMax)
	// sarama retries a topic the cluster does not know (deleted while the
	// relay runs, or one the broker will not auto-create) as it retries a
	// cluster that does not answer, MetadataRetryMax times: 16 minutes at
	// the backoff cap, during which the relay warns of the records
	// unacknowledged (Close does not wait for it: see closer). A
	// MetadataTimeout fails them sooner, and the relay then asks about the
	// topic as about any missing one; not by default, since it fails
	// records during a whole-cluster outage as long too, and a record that
	// fails leaves a gap that later ones of its key may pass.
	sc.Metadata.Timeout = c.MetadataTimeout
	if c.metadataRefresh > 0 {
		sc.Metadata.RefreshFrequency = c.metadataRefresh
	}

	p := &sc.Producer
	p.Idempotent = true
	p.RequiredAcks = sarama.WaitForAll
	p.Timeout = c.RequestTimeout
	p.MaxMessageBytes = c.MaxMessageBytes
	p.Compression = codec
	p.Partitioner = newPartitioner
	p.Return.Successes = true
	p.Return.Errors = true
	p.Flush.Bytes = max(c.FlushBytes, 0)
	p.Flush.Messages = max(c.FlushMessages, 0)
	if c.SingleRecordBatches {
		p.Flush.MaxMessages = 1
		p.Flush.Messages = 0 // sarama wants it at most MaxMessages
	}
	p.Flush.Frequency = max(c.FlushFrequency, 0)
	p.Retry.Max = c.RetryMax
	// Backoff is still read directly when a partition abandons its broker.
	p.Retry.Backoff = c.RetryBackoff
	p.Retry.BackoffFunc = backoff(c.RetryBackoff, c.RetryBackoffMax)
	// Every record in the retry buffer is also unacknowledged, so AckBuffer
	// records fit (sarama raises anything below 4096 to 4096); the slack
	// covers sarama's own marker messages, which share the buffer.
	p.Retry.MaxBufferLength = 2 * c.AckBuffer
	// sarama gives every channel it makes this capacity: its input and
	// outputs, and one input per topic and one per partition it has
	// produced to. Those are buffers of pointers that the garbage collector
	// scans in every cycle, allocated once per topic and partition, so they
	// stay small; Send never waits for them, as the Producer's own queue
	// (AckBuffer records) stands in front of sarama's input. With AckBuffer
	// here, a thousand topics of three partitions held 256 MB of buffers,
	// and the collector spent half the CPU scanning them.
	sc.ChannelBufferSize = saramaChannelBuffer
	p.Retry.MaxBufferBytes = c.RetryBufferBytes
	// InitProducerId (at the start, and to bump the epoch after a
	// sequence error) retries with the records' backoff, a few times:
	// about sarama's own 5 s with the defaults. New starts sarama's
	// producer again for as long as its context lasts, which sarama's loop
	// does not honour.
	p.Transaction.Retry.Max = initProducerIDRetries
	p.Transaction.Retry.Backoff = c.RetryBackoff
	p.Transaction.Retry.BackoffFunc = backoff(c.RetryBackoff, c.RetryBackoffMax)
	if c.ExactlyOnce && c.TransactionalID != "" {
		// Retrying a record for longer than the transaction may stay
		// open is useless: the coordinator aborts it at the timeout. And
		// order needs no long retries here: a record that fails aborts
		// its transaction, and the relay resends from the position Kafka
		// holds, so no read_committed consumer sees a gap.
		p.Retry.Max = min(p.Retry.Max, c.txnRetries())
		p.Transaction.ID = c.TransactionalID
		p.Transaction.Timeout = c.TransactionTimeout
		// The transaction requests (AddPartitionsToTxn, EndTxn,
		// InitProducerId) retry as long as records do. The first retry
		// comes soon: a transaction's first AddPartitionsToTxn is answered
		// CONCURRENT_TRANSACTIONS while the markers of the one before are
		// still being written, and sarama's fixed 20 ms for that case is
		// most of a commit's latency.
		p.Transaction.Retry.Max = c.txnRetries()
		p.Transaction.Retry.Backoff = txnRetryBackoff
		p.Transaction.Retry.BackoffFunc = backoff(txnRetryBackoff, c.RetryBackoffMax)
		// A metadata lookup sarama's transaction manager makes when the
		// coordinator is not available (of __consumer_offsets, which may
		// not exist) would otherwise retry metadata.retry.max times: bound
		// each lookup by the transaction's own timeout.
		if sc.Metadata.Timeout == 0 || sc.Metadata.Timeout > c.TransactionTimeout {
			sc.Metadata.Timeout = c.TransactionTimeout
		}
	}

	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafka: sarama rejected the configuration: %w", err)
	}
	return sc, nil
}

func init() {
	// sarama records go-metrics meters and histograms for every request
	// unless told not to; nothing reads them (pgoutbox exports its own
	// metrics), and they cost CPU and memory on every produce.
	gometrics.UseNilMetrics = true
}

// ValidateExplicit reports the options that are 0 (or empty) in a Config
// that started from Defaults, as the relay's configuration does: there a
// zero was written by the user, and taking it silently as the default (as
// Defaults would) hides a mistake; -1 turns the flush triggers off.
func (c *Config) ValidateExplicit() error {
	var errs []error
	for _, f := range []struct {
		option string
		zero   bool
		hint   string
	}{
		{"max.message.bytes", c.MaxMessageBytes == 0, "use 1 to " + fmt.Sprint(sarama.MaxRequestSize-1)},
		{"flush.bytes", c.FlushBytes == 0, "use -1 to turn the trigger off"},
		{"flush.messages", c.FlushMessages == 0, "use -1 to turn the trigger off"},
		{"flush.frequency", c.FlushFrequency == 0, "use -1ms to turn the timer off"},
		{"retry.max", c.RetryMax == 0, "the idempotent producer needs at least 1"},
		{"retry.buffer.bytes", c.RetryBufferBytes == 0, "use a positive size"},
		{"dial.timeout", c.DialTimeout == 0, "use a positive duration"},
		{"read.timeout", c.ReadTimeout == 0, "use a positive duration"},
		{"write.timeout", c.WriteTimeout == 0, "use a positive duration"},
		{"request.timeout", c.RequestTimeout == 0, "use a positive duration"},
		{"topic.missing.timeout", c.TopicMissingTimeout == 0, "use a positive duration"},
		{"transaction.timeout", c.TransactionTimeout == 0, "use a positive duration"},
		{"transaction.interval", c.TransactionInterval == 0, "use -1ms to commit at every transaction boundary"},
		{"transaction.max.records", c.TransactionMaxRecords == 0, "use a positive count"},
		{"offsets.topic", c.OffsetsTopic == "", "name a topic"},
		{"version", c.Version == "", "use a Kafka version such as 4.0.0"},
		{"compression", c.Compression == "", "use none, gzip, snappy, lz4 or zstd"},
	} {
		if f.zero {
			errs = append(errs, fmt.Errorf("kafka: %s: 0 or empty is not a value (%s; leave it out for the default)", f.option, f.hint))
		}
	}
	return errors.Join(errs...)
}
