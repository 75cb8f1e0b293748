package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/router"
)

// TestAbortedProducerEndsAtOnce: a producer aborted with records in flight
// to a cluster that is gone fails them all and ends within seconds, not
// after sarama's retries of records and metadata (1000 each, with backoffs
// up to a second, about 16 minutes), which kept it, its records and the
// WAL they pin alive beside the next session's producer (a reviewer's
// finding). kfake stands in for the cluster: a real broker cannot be made
// to hold a produce request on demand.
func TestAbortedProducerEndsAtOnce(t *testing.T) {
	c := newCluster(t, map[string]int32{"orders": 1})
	held := make(chan struct{})
	release := make(chan struct{})
	first := true
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if first {
			first = false
			close(held)
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	// The retry defaults of production.
	p, err := New(context.Background(), Config{Brokers: c.ListenAddrs(), AckBuffer: 100, ReadTimeout: time.Minute}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rec := &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v"), Partition: -1}
	const n = 50
	for i := range n {
		rec.EventID = fmt.Appendf(nil, "ev-%d", i)
		p.Send(rec, Meta{Ref: uint64(i)})
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no produce request reached the cluster")
	}
	close(release)
	c.Close() // the cluster is gone: sarama retries
	p.Abort()
	ended, end := context.WithCancel(context.Background())
	end()
	_ = p.Close(ended)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the aborted producer was still retrying 15 s after Abort")
	}
	got := 0
	for a := range p.acks {
		if a.Err == nil {
			t.Fatalf("record %d acknowledged after the abort", a.Ref)
		}
		got++
	}
	if got != n {
		t.Fatalf("%d acks, want %d failures", got, n)
	}
}
