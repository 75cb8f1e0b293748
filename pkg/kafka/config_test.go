package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.yaml.in/yaml/v3"
)

func TestDefaultsFillOnlyZeroFields(t *testing.T) {
	c := Config{Brokers: []string{"b:9092"}, ClientID: "mine", FlushFrequency: 5 * time.Millisecond}
	c.Defaults()
	if c.ClientID != "mine" || c.FlushFrequency != 5*time.Millisecond {
		t.Errorf("Defaults overwrote set fields: %+v", c)
	}
	want := Config{
		Brokers: []string{"b:9092"}, ClientID: "mine", Version: "4.0.0", MaxMessageBytes: 1 << 20,
		Compression: "none", FlushBytes: 256 << 10, FlushMessages: 1000, FlushFrequency: 5 * time.Millisecond,
		RetryMax: 1000, RetryBackoff: 100 * time.Millisecond, RetryBackoffMax: time.Second, MetadataRetryMax: 1000,
		AckBuffer: 8192, RetryBufferBytes: 256 << 20,
		DialTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		RequestTimeout: 10 * time.Second, TopicMissingTimeout: time.Minute,
		TransactionTimeout: time.Minute, OffsetsTopic: "pgoutbox.offsets", TransactionInterval: 5 * time.Millisecond,
		TransactionMaxRecords: 10000,
		Security:              Security{Protocol: "PLAINTEXT", SSLEndpointIdentification: "https"},
	}
	if got, w := strings.Join(strings.Fields(stringOf(c)), " "), strings.Join(strings.Fields(stringOf(want)), " "); got != w {
		t.Errorf("after Defaults:\n got %s\nwant %s", got, w)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

func stringOf(c Config) string {
	b, _ := yaml.Marshal(c)
	return string(b)
}

func TestValidateNamesTheOption(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Config)
		want   string // substring of the error
	}{
		{"no brokers", func(c *Config) { c.Brokers = nil }, "kafka: brokers: at least one broker"},
		{"broker without port", func(c *Config) { c.Brokers = []string{"localhost"} }, `kafka: brokers: "localhost" is not host:port`},
		{"version garbage", func(c *Config) { c.Version = "four" }, `kafka: version: "four" is not a Kafka version`},
		{"version 2.0", func(c *Config) { c.Version = "2.0.0" }, "kafka: version: 2.0.0 is below 2.1.0"},
		{"version 0.11", func(c *Config) { c.Version = "0.11.0.2" }, "kafka: version: 0.11.0.2 is below 2.1.0"},
		{"message bytes too big", func(c *Config) { c.MaxMessageBytes = 200 << 20 }, "kafka: max.message.bytes:"},
		{"message bytes negative", func(c *Config) { c.MaxMessageBytes = -1 }, "kafka: max.message.bytes:"},
		{"compression", func(c *Config) { c.Compression = "brotli" }, `kafka: compression: "brotli" is not one of`},
		{"flush bytes", func(c *Config) { c.FlushBytes = 200 << 20 }, "kafka: flush.bytes:"},
		{"thresholds without timer", func(c *Config) { c.FlushFrequency = -1 }, "kafka: flush.frequency: must be set"},
		{"retry max", func(c *Config) { c.RetryMax = -1 }, "kafka: retry.max: -1 must be at least 1"},
		{"retry backoff", func(c *Config) { c.RetryBackoff = -time.Second }, "kafka: retry.backoff:"},
		{"backoff max below base", func(c *Config) { c.RetryBackoff, c.RetryBackoffMax = time.Second, time.Millisecond }, "kafka: retry.backoff.max: 1ms is below retry.backoff 1s"},
		{"metadata retry", func(c *Config) { c.MetadataRetryMax = -1 }, "kafka: metadata.retry.max:"},
		{"ack buffer", func(c *Config) { c.AckBuffer = -5 }, "kafka: ack.buffer: -5 must be at least 1"},
		{"retry buffer", func(c *Config) { c.RetryBufferBytes = -5 }, "kafka: retry.buffer.bytes:"},
		{"dial timeout", func(c *Config) { c.DialTimeout = -time.Second }, "kafka: dial.timeout:"},
		{"request timeout resolution", func(c *Config) { c.RequestTimeout = 1500 * time.Microsecond }, "kafka: request.timeout: 1.5ms is not a whole number"},
		{"read timeout", func(c *Config) { c.ReadTimeout = 5 * time.Second }, "kafka: read.timeout: 5s must exceed request.timeout 10s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Brokers: []string{"127.0.0.1:9092"}}
			tc.modify(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := Config{Version: "1.0.0", Compression: "brotli"}
	err := c.Validate()
	for _, option := range []string{"brokers", "version", "compression"} {
		if err == nil || !strings.Contains(err.Error(), "kafka: "+option+":") {
			t.Errorf("Validate() = %v, missing %s", err, option)
		}
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Config)
	}{
		{"version 2.1", func(c *Config) { c.Version = "2.1.0" }},
		{"version 4.1", func(c *Config) { c.Version = "4.1.0" }},
		{"every codec", func(c *Config) { c.Compression = "zstd" }},
		{"all flush triggers off", func(c *Config) { c.FlushBytes, c.FlushMessages, c.FlushFrequency = -1, -1, -1 }},
		{"only the timer", func(c *Config) { c.FlushBytes, c.FlushMessages = -1, -1 }},
		{"IPv6 broker", func(c *Config) { c.Brokers = []string{"[::1]:9092"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Brokers: []string{"kafka-1:9092"}}
			tc.modify(&c)
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			c.Defaults()
			if _, err := c.sarama(); err != nil {
				t.Fatalf("sarama() = %v", err)
			}
		})
	}
}

func TestNewRefusesVersionBelow2_1(t *testing.T) {
	// No broker needed: the version is checked before any connection.
	_, err := New(context.Background(), Config{Brokers: []string{"127.0.0.1:1"}, Version: "2.0.1"}, nil)
	if err == nil || !strings.Contains(err.Error(), "version: 2.0.1 is below 2.1.0") {
		t.Fatalf("New = %v, want the version refused", err)
	}
}

func TestConfigDecodesFromYAML(t *testing.T) {
	const doc = `
brokers: [kafka-1:9092, kafka-2:9092]
client.id: relay-eu
version: 3.9.0
max.message.bytes: 2097152
compression: zstd
flush.bytes: 65536
flush.messages: 500
flush.frequency: 2ms
retry.max: 10
retry.backoff: 50ms
retry.backoff.max: 2s
metadata.retry.max: 12
ack.buffer: 4096
retry.buffer.bytes: 1048576
auto.create.topics: true
dial.timeout: 3s
read.timeout: 20s
write.timeout: 20s
request.timeout: 15s
`
	var c Config
	if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	want := Config{
		Brokers: []string{"kafka-1:9092", "kafka-2:9092"}, ClientID: "relay-eu", Version: "3.9.0",
		MaxMessageBytes: 2 << 20, Compression: "zstd", FlushBytes: 65536, FlushMessages: 500,
		FlushFrequency: 2 * time.Millisecond, RetryMax: 10, RetryBackoff: 50 * time.Millisecond,
		RetryBackoffMax: 2 * time.Second, MetadataRetryMax: 12, AckBuffer: 4096, RetryBufferBytes: 1 << 20,
		AutoCreateTopics: true, DialTimeout: 3 * time.Second, ReadTimeout: 20 * time.Second,
		WriteTimeout: 20 * time.Second, RequestTimeout: 15 * time.Second,
	}
	if stringOf(c) != stringOf(want) {
		t.Errorf("decoded:\n%s\nwant:\n%s", stringOf(c), stringOf(want))
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}

func TestSaramaConfigIsSafeForARelay(t *testing.T) {
	c := Config{Brokers: []string{"b:9092"}, Compression: "lz4", AckBuffer: 10000}
	c.Defaults()
	sc, err := c.sarama()
	if err != nil {
		t.Fatal(err)
	}
	p := sc.Producer
	checks := []struct {
		name string
		ok   bool
	}{
		{"Idempotent", p.Idempotent},
		{"RequiredAcks=WaitForAll", p.RequiredAcks == sarama.WaitForAll},
		{"Net.MaxOpenRequests=1", sc.Net.MaxOpenRequests == 1},
		{"Retry.Max unlimited", p.Retry.Max == 1000},
		{"Return.Successes", p.Return.Successes},
		{"Return.Errors", p.Return.Errors},
		{"Version=4.0.0", sc.Version == sarama.V4_0_0_0},
		{"MaxMessageBytes", p.MaxMessageBytes == 1<<20},
		{"Compression=lz4", p.Compression == sarama.CompressionLZ4},
		{"Retry.MaxBufferLength covers AckBuffer", p.Retry.MaxBufferLength >= 10000},
		{"Retry.MaxBufferBytes", p.Retry.MaxBufferBytes == 256<<20},
		{"Flush.Frequency", p.Flush.Frequency == time.Millisecond},
		{"Metadata.Retry.Max unlimited", sc.Metadata.Retry.Max == 1000},
		// The retries ride out 16 minutes of a cluster that answers no
		// metadata; kafka.metadata.timeout (none by default) cuts that.
		{"Metadata.Timeout none", sc.Metadata.Timeout == 0},
		{"no auto topic creation", !sc.Metadata.AllowAutoTopicCreation},
		{"partitioner consistent", p.Partitioner("t").RequiresConsistency()},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("sarama config: %s does not hold", c.name)
		}
	}
}

func TestBackoffDoublesUpToTheCap(t *testing.T) {
	f := backoff(100*time.Millisecond, time.Second)
	want := []time.Duration{100, 100, 200, 400, 800, 1000, 1000, 1000} // ms, retries 0..7
	for retries, w := range want {
		if got := f(retries, 40); got != w*time.Millisecond {
			t.Errorf("backoff(%d) = %v, want %v", retries, got, w*time.Millisecond)
		}
	}
	// The producer counts retries from 1: about 37 s over the default 40.
	var total time.Duration
	for r := 1; r <= DefaultRetryMax; r++ {
		total += backoff(DefaultRetryBackoff, DefaultRetryBackoffMax)(r, DefaultRetryMax)
	}
	if total < 30*time.Second {
		t.Errorf("default retries back off for %v in total, less than a 30 s outage", total)
	}
	// The README's advice for many topics (retry.max 250, backoff cap 4 s)
	// rides out about as long an outage as the defaults.
	var tuned time.Duration
	for r := 1; r <= 250; r++ {
		tuned += backoff(DefaultRetryBackoff, 4*time.Second)(r, 250)
	}
	if d := tuned - total; d < -time.Minute || d > time.Minute {
		t.Errorf("retry.max 250 with a 4 s cap backs off for %v, the defaults for %v", tuned, total)
	}
	if got := backoff(0, 0)(5, 10); got != 0 {
		t.Errorf("zero backoff = %v", got)
	}
}

func TestSingleRecordBatchesIsAValidSaramaConfiguration(t *testing.T) {
	c := Config{Brokers: []string{"b:9092"}, SingleRecordBatches: true}
	c.Defaults()
	sc, err := c.sarama()
	if err != nil {
		t.Fatal(err)
	}
	if sc.Producer.Flush.MaxMessages != 1 {
		t.Fatalf("Flush.MaxMessages = %d, want 1", sc.Producer.Flush.MaxMessages)
	}
}

// A record the broker refuses for what it is (too large, a timestamp out of
// the topic's range, a bad topic, no permission) is poison; an outage, a
// leader change or a timeout is retried, never poison.
func TestIsPoisonTellsTheRecordFromTheBroker(t *testing.T) {
	for _, c := range []struct {
		err    error
		poison bool
	}{
		{&ProduceError{Err: sarama.ErrInvalidTimestamp}, true},
		{&ProduceError{Err: sarama.ErrMessageSizeTooLarge}, true},
		{&ProduceError{Err: sarama.ErrTopicAuthorizationFailed}, true},
		{&RecordTooLargeError{Size: 2, Limit: 1}, true},
		{ErrTopicMissing, true},
		{&ProduceError{Err: sarama.ErrNotLeaderForPartition}, false},
		{&ProduceError{Err: sarama.ErrNotEnoughReplicas}, false},
		{&ProduceError{Err: sarama.ErrRequestTimedOut}, false},
		{&ProduceError{Err: sarama.ErrOutOfBrokers}, false},
	} {
		if got := IsPoison(c.err); got != c.poison {
			t.Errorf("IsPoison(%v) = %v, want %v", c.err, got, c.poison)
		}
	}
}
