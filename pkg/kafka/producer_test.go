package kafka

// The tests in this file run the producer against kfake, franz-go's fake
// Kafka cluster, over TCP. kfake is used because a real broker cannot
// produce these faults on demand: a produce request answered with a chosen
// error code, a lost acknowledgement, a topic that never appears. The
// happy path against a real Kafka is in integration_test.go.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/router"
)

// newCluster starts a one-broker kfake cluster with the given topics and
// partition counts.
func newCluster(t *testing.T, topics map[string]int32, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)
	for name, n := range topics {
		opts = append(opts, kfake.SeedTopics(n, name))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// testConfig gives up quickly: the fault tests want the error, not the ride.
func testConfig(brokers []string) Config {
	return Config{
		Brokers:          brokers,
		RetryMax:         3,
		RetryBackoff:     10 * time.Millisecond,
		RetryBackoffMax:  50 * time.Millisecond,
		MetadataRetryMax: 2,
		DialTimeout:      2 * time.Second,
		AckBuffer:        1024,
	}
}

func newTestProducer(t *testing.T, cfg Config) *Producer {
	t.Helper()
	p, err := New(context.Background(), cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// waitAcks reads n acks or fails the test after timeout.
func waitAcks(t *testing.T, p *Producer, n int, timeout time.Duration) []Ack {
	t.Helper()
	deadline := time.After(timeout)
	acks := make([]Ack, 0, n)
	for len(acks) < n {
		select {
		case a, ok := <-p.Acks():
			if !ok {
				t.Fatalf("Acks closed after %d of %d acks", len(acks), n)
			}
			acks = append(acks, a)
		case <-deadline:
			t.Fatalf("got %d of %d acks within %v", len(acks), n, timeout)
		}
	}
	return acks
}

func keyed(topic, key, value string) *router.Record {
	return &router.Record{Topic: topic, Key: []byte(key), Value: []byte(value), Partition: -1,
		EventID: []byte("ev-" + value)}
}

func TestSuccessfulAcksCarryRefTopicPartitionAndOffset(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 3})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	const n = 200
	rec := &router.Record{}
	for i := range n {
		// One Record reused for every Send, as the relay does.
		*rec = *keyed("orders", fmt.Sprintf("k%d", i%7), fmt.Sprint(i))
		p.Send(rec, Meta{Ref: uint64(1000 + i)})
	}
	acks := waitAcks(t, p, n, 10*time.Second)

	seen := map[uint64]bool{}
	nextOffset := map[int32]int64{}
	keyPartition := map[string]int32{}
	byRef := map[uint64]Ack{}
	for _, a := range acks {
		if a.Err != nil {
			t.Fatalf("ack %d: %v", a.Ref, a.Err)
		}
		if seen[a.Ref] {
			t.Fatalf("ref %d acked twice", a.Ref)
		}
		seen[a.Ref] = true
		byRef[a.Ref] = a
	}
	for i := range n {
		a, ok := byRef[uint64(1000+i)]
		if !ok {
			t.Fatalf("no ack for ref %d", 1000+i)
		}
		if a.Topic != "orders" {
			t.Errorf("ref %d: topic %q", a.Ref, a.Topic)
		}
		if string(a.EventID) != fmt.Sprint("ev-", i) {
			t.Errorf("ref %d: event ID %q", a.Ref, a.EventID)
		}
		if a.Partition < 0 || a.Partition >= 3 {
			t.Fatalf("ref %d: partition %d", a.Ref, a.Partition)
		}
		// In send order, each partition's offsets count up from 0.
		if a.Offset != nextOffset[a.Partition] {
			t.Errorf("ref %d: offset %d on partition %d, want %d", a.Ref, a.Offset, a.Partition, nextOffset[a.Partition])
		}
		nextOffset[a.Partition] = a.Offset + 1
		key := fmt.Sprintf("k%d", i%7)
		if prev, ok := keyPartition[key]; ok && prev != a.Partition {
			t.Errorf("key %s on partitions %d and %d", key, prev, a.Partition)
		}
		keyPartition[key] = a.Partition
	}
}

func TestExplicitPartitionIsHonoured(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 6})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	for i := range 30 {
		rec := keyed("orders", fmt.Sprintf("key-%d", i), "v")
		rec.Partition = int32(i % 2 * 5) // 0 or 5, whatever the key hashes to
		p.Send(rec, Meta{Ref: uint64(i)})
	}
	// No key, explicit partition.
	p.Send(&router.Record{Topic: "orders", Value: []byte("v"), Partition: 4}, Meta{Ref: 100})
	for _, a := range waitAcks(t, p, 31, 10*time.Second) {
		if a.Err != nil {
			t.Fatalf("ack %d: %v", a.Ref, a.Err)
		}
		want := int32(a.Ref % 2 * 5)
		if a.Ref == 100 {
			want = 4
		}
		if a.Partition != want {
			t.Errorf("ref %d: partition %d, want %d", a.Ref, a.Partition, want)
		}
	}
}

func TestPartitionBeyondTopicFailsWithErrorAck(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 3})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	rec := keyed("orders", "k", "v")
	rec.Partition = 3
	p.Send(rec, Meta{Ref: 7})
	a := waitAcks(t, p, 1, 10*time.Second)[0]
	if a.Ref != 7 || a.Err == nil {
		t.Fatalf("ack = %+v, want an error for ref 7", a)
	}
	if !errors.Is(a.Err, sarama.ErrInvalidPartition) {
		t.Errorf("error %v does not wrap sarama.ErrInvalidPartition", a.Err)
	}
}

func TestKeyedRecordsLandOnJavaMurmur2Partitions(t *testing.T) {
	vs := loadVectors(t)
	topics := map[string]int32{}
	for _, n := range vs.PartitionCounts {
		topics[fmt.Sprintf("t%d", n)] = n
	}
	c := newCluster(t, topics)
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	type want struct {
		key       []byte
		partition int32
	}
	wants := map[uint64]want{}
	ref := uint64(0)
	for _, v := range vs.Vectors {
		for i, n := range vs.PartitionCounts {
			k := v.key(t)
			p.Send(&router.Record{Topic: fmt.Sprintf("t%d", n), Key: k, Value: []byte("v"), Partition: -1}, Meta{Ref: ref})
			wants[ref] = want{k, v.Partitions[i]}
			ref++
		}
	}
	for _, a := range waitAcks(t, p, len(wants), 20*time.Second) {
		if a.Err != nil {
			t.Fatalf("ack %d: %v", a.Ref, a.Err)
		}
		if w := wants[a.Ref]; a.Partition != w.partition {
			t.Errorf("key %x on %s: partition %d, Java picks %d", w.key, a.Topic, a.Partition, w.partition)
		}
	}
}

func TestRecordOverMaxMessageBytesFailsWithErrorAck(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 1})
	cfg := testConfig(c.ListenAddrs())
	cfg.MaxMessageBytes = 1024
	p := newTestProducer(t, cfg)

	p.Send(keyed("orders", "k", strings.Repeat("x", 2000)), Meta{Ref: 1})
	a := waitAcks(t, p, 1, 10*time.Second)[0]
	if a.Ref != 1 || a.Err == nil || a.Offset != -1 {
		t.Fatalf("ack = %+v, want an error for ref 1", a)
	}
	var pe *ProduceError
	if !errors.As(a.Err, &pe) || pe.Topic != "orders" {
		t.Errorf("error %v is not a *ProduceError for topic orders", a.Err)
	}
	var tl *RecordTooLargeError
	if !errors.As(a.Err, &tl) || !strings.Contains(a.Err.Error(), "kafka.max.message.bytes") || !IsPoison(a.Err) {
		t.Errorf("error %v is not a poison *RecordTooLargeError naming kafka.max.message.bytes", a.Err)
	}
}

// TestRecordForAPartitionTheTopicLacksIsPoison: a record placed on a
// partition the topic does not have (table.fields.additional.placement
// ...:partition) can never be sent until the topic grows: poison, under
// the poison policy, rather than an error retried for ever (the poll
// source sent its whole batch again each time).
func TestRecordForAPartitionTheTopicLacksIsPoison(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 1})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))
	rec := keyed("orders", "k", "v")
	rec.Partition = 5
	p.Send(rec, Meta{Ref: 1})
	a := waitAcks(t, p, 1, 10*time.Second)[0]
	if a.Err == nil || !IsPoison(a.Err) || !strings.Contains(a.Err.Error(), "partition 5 does not exist") {
		t.Fatalf("ack = %+v (%v), want a poison error naming the partition", a, a.Err)
	}
}

func TestCheckTopicsReportsMissingTopicsAndPartitions(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 6})
	st, err := CheckTopics(context.Background(), testConfig(c.ListenAddrs()), []string{"no-such-topic", "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(st[0].Err, ErrTopicMissing) || !IsPoison(st[0].Err) {
		t.Errorf("no-such-topic: %+v, want ErrTopicMissing", st[0])
	}
	if st[1].Err != nil || st[1].Partitions != 6 {
		t.Errorf("orders: %+v, want 6 partitions", st[1])
	}
}

// failNextProduce makes the cluster answer the next produce request with
// code for every partition in it, without appending anything.
func failNextProduce(c *kfake.Cluster, code int16) {
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

func TestFatalProduceErrorFailsWithErrorAck(t *testing.T) {
	for _, tc := range []struct {
		name string
		code *kerr.Error
		want error
	}{
		{"INVALID_TOPIC_EXCEPTION", kerr.InvalidTopicException, sarama.ErrInvalidTopic},
		{"RECORD_LIST_TOO_LARGE", kerr.RecordListTooLarge, sarama.ErrMessageSetSizeTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, map[string]int32{"orders": 1})
			p := newTestProducer(t, testConfig(c.ListenAddrs()))

			failNextProduce(c, tc.code.Code)
			p.Send(keyed("orders", "k", "first"), Meta{Ref: 1})
			a := waitAcks(t, p, 1, 10*time.Second)[0]
			t.Logf("error ack: %v", a.Err)
			if a.Ref != 1 || !errors.Is(a.Err, tc.want) {
				t.Fatalf("ack = %+v, want ref 1 failing with %v", a, tc.want)
			}

			// Why an error must stop the relay: sarama carries on, and the
			// next record on the same partition is acked after the gap.
			p.Send(keyed("orders", "k", "second"), Meta{Ref: 2})
			a = waitAcks(t, p, 1, 10*time.Second)[0]
			if a.Ref != 2 || a.Err != nil || a.Partition != 0 {
				t.Fatalf("ack = %+v, want ref 2 acked on partition 0", a)
			}
		})
	}
}

func TestRetriableProduceErrorIsRetriedAndAckedOnce(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 1})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	f := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Err: kerr.NotLeaderForPartition})
	p.Send(keyed("orders", "k", "v"), Meta{Ref: 5})
	a := waitAcks(t, p, 1, 10*time.Second)[0]
	if a.Ref != 5 || a.Err != nil || a.Offset != 0 {
		t.Fatalf("ack = %+v, want ref 5 acked at offset 0", a)
	}
	if f.Hits() != 1 {
		t.Errorf("fault hit %d times, want 1", f.Hits())
	}
	select {
	case extra := <-p.Acks():
		t.Fatalf("second ack %+v", extra)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestLostAckIsRetriedWithoutDuplicate(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 1})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	// kfake appends the batch, then answers REQUEST_TIMED_OUT: the ack is
	// lost, sarama retries, and idempotence must keep the log at one copy.
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Err: kerr.RequestTimedOut})
	p.Send(keyed("orders", "k", "v"), Meta{Ref: 9})
	a := waitAcks(t, p, 1, 10*time.Second)[0]
	if a.Ref != 9 || a.Err != nil || a.Offset != 0 {
		t.Fatalf("ack = %+v, want ref 9 acked at offset 0", a)
	}
	p.Send(keyed("orders", "k", "w"), Meta{Ref: 10})
	if a := waitAcks(t, p, 1, 10*time.Second)[0]; a.Err != nil || a.Offset != 1 {
		t.Fatalf("ack = %+v, want ref 10 at offset 1 (one copy of ref 9 before it)", a)
	}
	if got := consume(t, c.ListenAddrs(), "orders", 2); len(got) != 2 {
		t.Fatalf("log has %d records, want 2", len(got))
	}
}

func TestCloseDeliversOutstandingAcksThenClosesChannel(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 3})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	const n = 500
	for i := range n {
		p.Send(keyed("orders", fmt.Sprint(i), "v"), Meta{Ref: uint64(i)})
	}
	// Close without reading Acks first: the acks wait in the buffer.
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got := map[uint64]bool{}
	for a := range p.Acks() { // ends only if Close closed the channel
		if a.Err != nil {
			t.Fatalf("ack %d: %v", a.Ref, a.Err)
		}
		got[a.Ref] = true
	}
	if len(got) != n {
		t.Fatalf("%d acks after Close, want %d", len(got), n)
	}
	if err := p.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("Send after Close did not panic")
		}
	}()
	p.Send(keyed("orders", "k", "v"), Meta{Ref: 1})
}

func TestRecordFieldsReachKafka(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 1})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))

	ts := time.Date(2026, 11, 3, 12, 30, 45, 123_000_000, time.UTC)
	headers := []router.Header{{Key: "id", Value: []byte("e1")}, {Key: "type", Value: []byte("OrderCreated")},
		{Key: "null", Value: nil}, {Key: "", Value: []byte("empty key")}, {Key: "fifth", Value: []byte("5")}}
	p.Send(&router.Record{Topic: "orders", Key: []byte("k1"), Value: []byte(`{"a":1}`),
		Headers: headers, Partition: -1, Timestamp: ts}, Meta{Ref: 1})
	p.Send(&router.Record{Topic: "orders", Key: []byte("k1"), Value: nil, Partition: -1, Timestamp: ts}, Meta{Ref: 2}) // tombstone
	p.Send(&router.Record{Topic: "orders", Key: nil, Value: []byte{}, Partition: -1, Timestamp: ts}, Meta{Ref: 3})     // no key, empty value
	for _, a := range waitAcks(t, p, 3, 10*time.Second) {
		if a.Err != nil {
			t.Fatalf("ack %d: %v", a.Ref, a.Err)
		}
	}

	recs := consume(t, c.ListenAddrs(), "orders", 3)
	r := recs[0]
	if string(r.Key) != "k1" || string(r.Value) != `{"a":1}` || !r.Timestamp.Equal(ts) {
		t.Errorf("record 0 = key %q value %q ts %v", r.Key, r.Value, r.Timestamp)
	}
	if len(r.Headers) != len(headers) {
		t.Fatalf("record 0 has %d headers, want %d", len(r.Headers), len(headers))
	}
	for i, h := range r.Headers {
		if h.Key != headers[i].Key || string(h.Value) != string(headers[i].Value) || (h.Value == nil) != (headers[i].Value == nil) {
			t.Errorf("header %d = %q:%q, want %q:%q", i, h.Key, h.Value, headers[i].Key, headers[i].Value)
		}
	}
	if recs[1].Value != nil || string(recs[1].Key) != "k1" {
		t.Errorf("record 1 = key %q value %q, want a tombstone for k1", recs[1].Key, recs[1].Value)
	}
	if recs[2].Key != nil || recs[2].Value == nil || len(recs[2].Value) != 0 {
		t.Errorf("record 2 = key %q value %#v, want no key and an empty value", recs[2].Key, recs[2].Value)
	}
}

// consume reads n records of topic from the start with franz-go, a client
// independent of the one under test.
func consume(t *testing.T, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(10 * time.Second)
	for len(recs) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	if len(recs) < n {
		t.Fatalf("consumed %d of %d records from %s", len(recs), n, topic)
	}
	return recs
}

func TestNewFailsNamingUnreachableBrokers(t *testing.T) {
	// Port 1 on loopback: nothing listens there, and no other test can
	// bind it (a port freed by this test could be taken by another one).
	addr := "127.0.0.1:1"
	start := time.Now()
	_, err := New(context.Background(), testConfig([]string{addr}), nil)
	if err == nil {
		t.Fatal("New succeeded without a cluster")
	}
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("error %q does not name the broker %s", err, addr)
	}
	if !strings.Contains(err.Error(), "check that Kafka runs") {
		t.Errorf("error %q does not say what to check for a refused connection", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("New took %v to fail", d)
	}
}

func TestAckBufferIsTheConfiguredOne(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 6})
	p := newTestProducer(t, testConfig(c.ListenAddrs()))
	if p.AckBuffer() != 1024 {
		t.Errorf("AckBuffer = %d", p.AckBuffer())
	}
}

// A broker name that does not resolve: the test may not ask a DNS server,
// so the resolver's answer is built by hand; the hint is what is tested.
func TestBrokerHintSaysWhatToCheck(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("dial tcp: %w", &net.DNSError{Err: "no such host", Name: "kafka-1.example.test", IsNotFound: true}), "host names in kafka.brokers"},
		{fmt.Errorf("dial tcp 127.0.0.1:1: %w", syscall.ECONNREFUSED), "check that Kafka runs"},
		{fmt.Errorf("dial tcp: %w", context.DeadlineExceeded), "kafka.dial.timeout"},
		{errors.New("something else"), "broker's log"},
	}
	for _, c := range cases {
		if got := brokerHint(c.err); !strings.Contains(got, c.want) {
			t.Errorf("brokerHint(%v) = %q, want it to mention %q", c.err, got, c.want)
		}
	}
}

// A broker that accepts connections and never answers (paused, or in a long
// garbage-collection pause) is named as such, with what to check, instead of
// a bare i/o timeout.
func TestSilentBrokerIsNamedAsSuch(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 8)
	go func() { // owned by the listener: ends when it is closed
		defer close(held)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	defer func() {
		l.Close()
		for c := range held {
			c.Close()
		}
	}()
	cfg := Config{Brokers: []string{l.Addr().String()}, ReadTimeout: 1500 * time.Millisecond, RequestTimeout: time.Second, DialTimeout: time.Second}
	err = Ping(context.Background(), cfg)
	if err == nil {
		t.Fatal("Ping succeeded against a silent listener")
	}
	for _, want := range []string{l.Addr().String(), "accepted the connection but did not answer within kafka.read.timeout", "paused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestSendNeverWaitsForABrokerThatHoldsItsAnswer: sarama's channels hold 256
// records each; the producer's queue holds AckBuffer. While the broker
// holds its answer to the first produce request, AckBuffer records of
// 20 KB (a partition's batch is at most 1 MB, so sarama's channels fill
// after about 900) are sent without Send waiting, and once the broker
// answers every one is acknowledged once, in order. A real broker cannot
// be made to hold one answer on demand; kfake can.
func TestSendNeverWaitsForABrokerThatHoldsItsAnswer(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 1})
	release := make(chan struct{})
	held := false
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !held {
			held = true
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	cfg := testConfig(c.ListenAddrs())
	cfg.AckBuffer = 2000
	cfg.ReadTimeout = time.Minute
	p := newTestProducer(t, cfg)
	value := strings.Repeat("v", 20<<10)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		rec := &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte(value), Partition: -1}
		for i := range cfg.AckBuffer {
			rec.EventID = fmt.Appendf(nil, "ev-%d", i)
			p.Send(rec, Meta{Ref: uint64(i)})
		}
	}()
	select {
	case <-sent:
	case <-time.After(20 * time.Second):
		close(release)
		<-sent
		t.Fatalf("Send waited for the broker's answer")
	}
	close(release)
	for i, a := range waitAcks(t, p, cfg.AckBuffer, time.Minute) {
		if a.Err != nil || a.Ref != uint64(i) {
			t.Fatalf("ack %d: %+v, want ref %d acked", i, a, i)
		}
	}
}

// TestNewWaitsForTheClusterToGiveAProducerID: a KRaft broker answers
// InitProducerId with COORDINATOR_LOAD_IN_PROGRESS until the controller
// granted it a block of IDs, which after a controller's death takes longer
// than sarama's own retries (pgoutbox exited at start-up so in a test that
// killed a broker). kfake gives those answers here, as a real broker cannot
// on demand: New must ride them out and deliver, log that it waits, and,
// when they never end, fail once its context ends with both the cause and
// the last answer.
func TestNewWaitsForTheClusterToGiveAProducerID(t *testing.T) {
	const refusals = 3*initProducerIDRetries + 5 // more than one start of sarama's producer can take
	loading := func(c *kfake.Cluster, n *atomic.Int32, limit int32) {
		c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if n.Add(1) > limit {
				return nil, nil, false
			}
			resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
			resp.ErrorCode = kerr.CoordinatorLoadInProgress.Code
			return resp, nil, true
		})
	}

	t.Run("rides out", func(t *testing.T) {
		c := newCluster(t, map[string]int32{"orders": 1})
		var asked atomic.Int32
		loading(c, &asked, refusals)
		core, logs := observer.New(zap.InfoLevel)
		cfg := testConfig(c.ListenAddrs())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := New(ctx, cfg, zap.New(core))
		if err != nil {
			t.Fatalf("New: %v (InitProducerId asked %d times)", err, asked.Load())
		}
		defer p.Close(context.Background())
		if n := asked.Load(); n <= refusals {
			t.Fatalf("InitProducerId asked %d times, want more than the %d refusals", n, refusals)
		}
		if logs.FilterMessageSnippet("cannot give the producer an ID yet").Len() == 0 {
			t.Errorf("no warning that the producer waits for its ID: %v", logs.All())
		}
		p.Send(&router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v"), EventID: []byte("e"), Partition: -1}, Meta{Ref: 7})
		if a := waitAcks(t, p, 1, 30*time.Second)[0]; a.Err != nil || a.Ref != 7 {
			t.Fatalf("ack %+v, want ref 7 acknowledged", a)
		}
	})

	t.Run("until the context ends", func(t *testing.T) {
		c := newCluster(t, map[string]int32{"orders": 1})
		var asked atomic.Int32
		loading(c, &asked, math.MaxInt32)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		begun := time.Now()
		_, err := New(ctx, testConfig(c.ListenAddrs()), zaptest.NewLogger(t))
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sarama.ErrOffsetsLoadInProgress) {
			t.Fatalf("New: %v, want the deadline and COORDINATOR_LOAD_IN_PROGRESS", err)
		}
		if took := time.Since(begun); took > 10*time.Second {
			t.Errorf("New returned %s after a 2 s deadline", took.Round(time.Millisecond))
		}
	})

	t.Run("a refusal that stays ends it at once", func(t *testing.T) {
		c := newCluster(t, map[string]int32{"orders": 1})
		c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
			resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
			return resp, nil, true
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		begun := time.Now()
		_, err := New(ctx, testConfig(c.ListenAddrs()), zaptest.NewLogger(t))
		if !errors.Is(err, sarama.ErrClusterAuthorizationFailed) {
			t.Fatalf("New: %v, want CLUSTER_AUTHORIZATION_FAILED", err)
		}
		if took := time.Since(begun); took > 10*time.Second {
			t.Errorf("New took %s to give up on a refusal that stays", took.Round(time.Millisecond))
		}
	})
}
