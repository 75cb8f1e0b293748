package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/router"
)

func benchRecord(headers int) *router.Record {
	rec := &router.Record{
		Topic:     "orders",
		Key:       []byte("f47ac10b-58cc-4372-a567-0e02b2c3d479"),
		Value:     []byte(`{"order_id":42,"status":"created","amount":"19.99"}`),
		Partition: -1,
		Timestamp: time.Now(),
		EventID:   []byte("0b9e0c1e-2f7a-4c55-9d43-6c1f4f1c9a10"),
	}
	for i := range headers {
		rec.Headers = append(rec.Headers, router.Header{Key: fmt.Sprintf("h%d", i), Value: []byte("value")})
	}
	return rec
}

func TestNewMessageAllocatesOnlyTheMessage(t *testing.T) {
	for _, tc := range []struct {
		headers int
		allocs  float64
	}{
		{0, 1}, {inlineHeaders, 1}, {inlineHeaders + 1, 2}, // beyond the inline array: the headers slice
	} {
		rec := benchRecord(tc.headers)
		var sink *message
		got := testing.AllocsPerRun(1000, func() { sink = newMessage(rec, Meta{Ref: 1}) })
		if got != tc.allocs {
			t.Errorf("%d headers: %v allocations per message, want %v", tc.headers, got, tc.allocs)
		}
		_ = sink
	}
}

func TestNewMessageCopiesTheRecordFields(t *testing.T) {
	rec := benchRecord(5)
	rec.Partition = 3
	m := newMessage(rec, Meta{Ref: 77})
	*rec = router.Record{} // the caller reuses its Record
	pm := &m.pm
	key, _ := pm.Key.Encode()
	value, _ := pm.Value.Encode()
	if pm.Topic != "orders" || pm.Partition != 3 || string(key) != "f47ac10b-58cc-4372-a567-0e02b2c3d479" ||
		len(value) == 0 || len(pm.Headers) != 5 || string(pm.Headers[4].Key) != "h4" || pm.Timestamp.IsZero() {
		t.Errorf("message = %+v", pm)
	}
	if a := ack(pm, nil); a.Ref != 77 || string(a.EventID) != "0b9e0c1e-2f7a-4c55-9d43-6c1f4f1c9a10" {
		t.Errorf("ack = %+v", a)
	}
	tomb := newMessage(&router.Record{Topic: "t", Partition: -1}, Meta{Ref: 1})
	if tomb.pm.Key != nil || tomb.pm.Value != nil || tomb.pm.Headers != nil {
		t.Errorf("nil key and value must stay nil interfaces: %+v", tomb.pm)
	}
}

// BenchmarkNewMessage measures turning a record into a sarama message, the
// per-record work of Send before sarama's channel.
func BenchmarkNewMessage(b *testing.B) {
	for _, headers := range []int{2, 6} {
		b.Run(fmt.Sprintf("headers=%d", headers), func(b *testing.B) {
			rec := benchRecord(headers)
			b.ReportAllocs()
			var sink *sarama.ProducerMessage
			for i := 0; b.Loop(); i++ {
				sink = &newMessage(rec, Meta{Ref: uint64(i)}).pm
			}
			_ = sink
		})
	}
}

// BenchmarkSendKfake measures Send through sarama to kfake and back to
// Acks, keeping at most AckBuffer records in flight as the relay must.
func BenchmarkSendKfake(b *testing.B) {
	c, err := newBenchCluster()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cfg := Config{Brokers: c.ListenAddrs(), AckBuffer: 4096}
	p, err := New(context.Background(), cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())

	rec := benchRecord(2)
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
}

func newBenchCluster() (*kfake.Cluster, error) {
	return kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, "orders"))
}
