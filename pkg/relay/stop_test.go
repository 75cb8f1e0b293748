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

// TestStreamEndLeavesTheProducerItsGraceAndTheFinalStatusItsMoment: the
// steps that end the stream stop at the budget less the producer's close
// grace, so that a stop with both servers hung fits the budget; with a
// budget whose reserve is under twice the grace (a diff review: under
// 2.5 s the stream's deadline fell before the drain's end, and the final
// status, which confirms what Kafka acknowledged, was skipped), they get
// half of the reserve, after the drain.
func TestStreamEndLeavesTheProducerItsGraceAndTheFinalStatusItsMoment(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		timeout, want time.Duration // want: before the budget's end
	}{
		{10 * time.Second, kafka.CloseGrace},
		{5 * time.Second, kafka.CloseGrace},
		{2 * time.Second, 200 * time.Millisecond},
		{time.Second, 100 * time.Millisecond},
	} {
		cfg := DefaultConfig()
		cfg.Relay.ShutdownTimeout = c.timeout
		// The drain is over: now is within the reserve.
		s := &session{r: &Relay{cfg: cfg}, clock: &stepClock{now: now}, stopping: true, stopBy: now.Add(c.timeout / 10)}
		got := s.stopBy.Sub(s.streamEndBy())
		if got != c.want {
			t.Errorf("timeout %s: the stream's steps end %s before the budget's end, want %s", c.timeout, got, c.want)
		}
		if !s.streamEndBy().After(s.drainBy()) {
			t.Errorf("timeout %s: the stream's steps end at %s, not after the drain's end %s", c.timeout, s.streamEndBy(), s.drainBy())
		}
	}
}
