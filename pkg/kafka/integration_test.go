package kafka

// Integration tests against the real single-node Kafka 4 of
// scripts/testenv.sh. Run them with
//
//	scripts/testenv.sh exec -- go test -race -count=1 ./pkg/kafka/
//
// Without the environment they skip.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/router"
)

// sent is what the test sent for one ref.
type sent struct {
	key   string
	value string
}

// produceAndCheck sends one record per entry of order, waits for every ack,
// and checks them: no error, each key on want(key) if want is set, and per
// key offsets increasing in send order. It returns the acks by ref.
func produceAndCheck(t *testing.T, p *Producer, topic string, order []sent, want func(key string) int32) map[uint64]Ack {
	t.Helper()
	acks := map[uint64]Ack{}
	read := func(a Ack) {
		if a.Err != nil {
			t.Fatalf("ack %d (key %s): %v", a.Ref, order[a.Ref].key, a.Err)
		}
		if _, dup := acks[a.Ref]; dup {
			t.Fatalf("ref %d acked twice", a.Ref)
		}
		acks[a.Ref] = a
	}
	rec := &router.Record{}
	for i, s := range order {
		// Respect the contract: never more than AckBuffer unacked.
		for i-len(acks) >= p.AckBuffer() {
			read(<-p.Acks())
		}
		*rec = router.Record{Topic: topic, Key: []byte(s.key), Value: []byte(s.value), Partition: -1,
			Timestamp: time.Now(), EventID: []byte(s.value)}
		p.Send(rec, Meta{Ref: uint64(i)})
	}
	timeout := time.After(2 * time.Minute)
	for len(acks) < len(order) {
		select {
		case a := <-p.Acks():
			read(a)
		case <-timeout:
			t.Fatalf("%d of %d acks", len(acks), len(order))
		}
	}

	for i, s := range order {
		a := acks[uint64(i)]
		if a.Topic != topic || string(a.EventID) != s.value {
			t.Errorf("ref %d: ack %+v", i, a)
		}
		if want != nil && a.Partition != want(s.key) {
			t.Errorf("key %s: partition %d, the Java client picks %d", s.key, a.Partition, want(s.key))
		}
	}
	checkOrder(t, order, acks)
	return acks
}

func TestKeyedRecordsKeepJavaPartitionsAndOrderOnKafka(t *testing.T) {
	env := testenv.Require(t)
	topic := testenv.UniqueName(t, "kafka-keys")
	env.CreateTopic(t, topic, 6)

	p := newTestProducer(t, Config{Brokers: env.KafkaBrokers})
	st, err := CheckTopics(context.Background(), Config{Brokers: env.KafkaBrokers}, []string{topic})
	if err != nil || st[0].Partitions != 6 {
		t.Fatalf("CheckTopics = %+v, %v", st, err)
	}

	vs := loadVectors(t)
	keys := integrationKeys()
	order := make([]sent, 1000)
	for i := range order {
		order[i] = sent{key: keys[i%len(keys)], value: fmt.Sprintf("v%04d", i)}
	}
	acks := produceAndCheck(t, p, topic, order, func(key string) int32 { return vectorPartitionFor(t, vs, key, 6) })

	// Read the topic back: every record once, where its ack said.
	msgs := env.ConsumeAll(t, []string{topic}, time.Minute, func(n int) bool { return n >= len(order) })
	if len(msgs) != len(order) {
		t.Fatalf("topic holds %d records, want %d", len(msgs), len(order))
	}
	at := map[string]string{}
	for _, m := range msgs {
		at[fmt.Sprintf("%d/%d", m.Partition, m.Offset)] = string(m.Value)
	}
	for ref, a := range acks {
		if got := at[fmt.Sprintf("%d/%d", a.Partition, a.Offset)]; got != order[ref].value {
			t.Errorf("ref %d acked at %d/%d, which holds %q", ref, a.Partition, a.Offset, got)
		}
	}
}

func TestEveryCompressionCodecIsAcceptedByKafka(t *testing.T) {
	env := testenv.Require(t)
	for _, codec := range []string{"none", "gzip", "snappy", "lz4", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			topic := testenv.UniqueName(t, "kafka-"+codec)
			env.CreateTopic(t, topic, 2)
			p := newTestProducer(t, Config{Brokers: env.KafkaBrokers, Compression: codec})
			order := make([]sent, 100)
			for i := range order {
				order[i] = sent{key: fmt.Sprint(i % 10), value: fmt.Sprintf("%s-%d", codec, i)}
			}
			produceAndCheck(t, p, topic, order, nil)
		})
	}
}

// TestRidesOutABrokerRestart stops the broker while records are in flight
// and starts it again: with the default retry settings every record must be
// acknowledged, none fail, per-key order holds and no record is written
// twice.
func TestRidesOutABrokerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts the broker")
	}
	env := testenv.RequireExclusive(t)
	topic := testenv.UniqueName(t, "kafka-restart")
	env.CreateTopic(t, topic, 3)
	p := newTestProducer(t, Config{Brokers: env.KafkaBrokers})

	order := make([]sent, 3000)
	for i := range order {
		order[i] = sent{key: fmt.Sprintf("k%d", i%20), value: fmt.Sprintf("v%05d", i)}
	}
	// Send in paced batches from another goroutine, so that records are in
	// flight before, during and after the outage. 3000 < AckBuffer: the acks
	// can wait in the channel until the end.
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		for i, s := range order {
			p.Send(&router.Record{Topic: topic, Key: []byte(s.key), Value: []byte(s.value), Partition: -1,
				EventID: []byte(s.value)}, Meta{Ref: uint64(i)})
			if i%100 == 99 {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	start := time.Now()
	time.Sleep(500 * time.Millisecond)
	env.KafkaStop(t, "TERM")
	time.Sleep(3 * time.Second)
	env.KafkaStart(t)
	outage := time.Since(start) - 500*time.Millisecond
	<-sendDone

	acks := map[uint64]Ack{}
	timeout := time.After(3 * time.Minute)
	for len(acks) < len(order) {
		select {
		case a := <-p.Acks():
			if a.Err != nil {
				t.Fatalf("ack %d: %v", a.Ref, a.Err)
			}
			if _, dup := acks[a.Ref]; dup {
				t.Fatalf("ref %d acked twice", a.Ref)
			}
			acks[a.Ref] = a
		case <-timeout:
			t.Fatalf("%d of %d acks", len(acks), len(order))
		}
	}
	t.Logf("%d records acked in %v around a broker outage of %v", len(order), time.Since(start), outage)
	checkOrder(t, order, acks)

	msgs := env.ConsumeAll(t, []string{topic}, time.Minute, func(n int) bool { return n >= len(order) })
	seen := map[string]int{}
	for _, m := range msgs {
		seen[string(m.Value)]++
	}
	for _, s := range order {
		if seen[s.value] != 1 {
			t.Errorf("record %s is in the topic %d times", s.value, seen[s.value])
		}
	}
}

// checkOrder checks that each key's acks have increasing offsets on one
// partition in send order.
func checkOrder(t *testing.T, order []sent, acks map[uint64]Ack) {
	t.Helper()
	last := map[string]Ack{}
	for i, s := range order {
		a := acks[uint64(i)]
		if prev, ok := last[s.key]; ok && (a.Partition != prev.Partition || a.Offset <= prev.Offset) {
			t.Errorf("key %s: ref %d at %d/%d after ref %d at %d/%d", s.key, i, a.Partition, a.Offset,
				prev.Ref, prev.Partition, prev.Offset)
		}
		last[s.key] = a
	}
}

// BenchmarkSendKafka measures Send to acknowledgement against the real
// broker, with the default flush settings and with every flush trigger off
// (sarama's defaults: each record is sent as soon as no request is open).
func BenchmarkSendKafka(b *testing.B) {
	env := testenv.Require(b)
	for _, tc := range []struct {
		name  string
		flush func(*Config)
	}{
		{"flush=default", func(*Config) {}},
		{"flush=off", func(c *Config) { c.FlushBytes, c.FlushMessages, c.FlushFrequency = -1, -1, -1 }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			topic := testenv.UniqueName(b, "kafka-bench")
			env.CreateTopic(b, topic, 6)
			cfg := Config{Brokers: env.KafkaBrokers}
			tc.flush(&cfg)
			p, err := New(context.Background(), cfg, zap.NewNop())
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			rec := benchRecord(2)
			rec.Topic = topic
			keys := make([][]byte, 64)
			for i := range keys {
				keys[i] = []byte(fmt.Sprintf("key-%d", i))
			}
			inFlight := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for inFlight >= p.AckBuffer() {
					if a := <-p.Acks(); a.Err != nil {
						b.Fatal(a.Err)
					}
					inFlight--
				}
				rec.Key = keys[i%len(keys)]
				p.Send(rec, Meta{Ref: uint64(i)})
				inFlight++
			}
			for ; inFlight > 0; inFlight-- {
				if a := <-p.Acks(); a.Err != nil {
					b.Fatal(a.Err)
				}
			}
		})
	}
}
