package relay

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// stuckProducer is a producer whose records never finish (a frozen
// broker): Close returns only when its context ends.
type stuckProducer struct{ acks chan kafka.Ack }

func (p *stuckProducer) Send(*router.Record, kafka.Meta) {}
func (p *stuckProducer) Acks() <-chan kafka.Ack          { return p.acks }
func (p *stuckProducer) Close(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestASecondStopClosesTheProducerAtOnce: closing the producer waits for
// what it still has in flight, up to the stop's budget; a stop at once (the
// process's second signal) must cut that wait short, during a stop and
// between sessions alike. (The deterministic harness's producer closes at
// once, and this wait runs on the real clock, so the harness cannot see it.)
func TestASecondStopClosesTheProducerAtOnce(t *testing.T) {
	stopping, stop := context.WithCancel(context.Background())
	stop()
	for name, ctx := range map[string]context.Context{
		"during a stop":    stopping,
		"between sessions": context.WithoutCancel(stopping),
	} {
		force := make(chan struct{})
		r := &Relay{cfg: DefaultConfig(), log: zap.NewNop(), clock: realClock{}, force: force}
		r.cfg.Relay.ShutdownTimeout = time.Hour
		done := make(chan struct{})
		go func() {
			r.closeProducer(ctx, &stuckProducer{}, time.Now().Add(time.Hour))
			close(done)
		}()
		close(force)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: closing a stuck producer still waits 10 s after the stop at once (budget 1 h)", name)
		}
	}
}
