package relay

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
)

// forkBackend serves startTransactional alone: an offsets topic that
// holds stored for the slot.
type forkBackend struct {
	backend
	stored checkpoint.LSN
}

func (b forkBackend) EnsureOffsetsTopic(context.Context, kafka.Config) error { return nil }

func (b forkBackend) NewTxnProducer(context.Context, kafka.Config, kafka.SlotIdentity) (txnProducer, error) {
	return &forkProducer{stored: b.stored}, nil
}

type forkProducer struct {
	txnProducer
	stored checkpoint.LSN
	closed bool
}

func (p *forkProducer) Stored() (uint64, bool)      { return uint64(p.stored), true }
func (p *forkProducer) Close(context.Context) error { p.closed = true; return nil }

// TestExactlyOnceRefusesAStoredPositionPastATimelineFork: exactly-once
// skips every transaction committing before the position Kafka holds.
// After a promotion or a restore that left the old timeline below that
// position, the new timeline's transactions there are new ones, never in
// Kafka: the start stops loudly, naming the fork and the way on. A fork at
// or past the stored position, or no change of timeline, starts as before.
func TestExactlyOnceRefusesAStoredPositionPastATimelineFork(t *testing.T) {
	const slot, stored = checkpoint.LSN(0x1000), checkpoint.LSN(0x3000)
	for _, c := range []struct {
		name          string
		recorded, now int32
		fork          checkpoint.LSN
		known         bool
		refused       bool
	}{
		{"fork before the stored position", 1, 2, 0x2000, true, true},
		{"recorded timeline not in the history", 1, 3, 0, false, true},
		{"fork at the stored position", 1, 2, stored, true, false},
		{"fork past the stored position", 1, 2, 0x4000, true, false},
		{"same timeline", 2, 2, 0, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Postgres.DSN, cfg.Kafka.Brokers, cfg.Kafka.ExactlyOnce = "postgres://fork", []string{"fork:9092"}, true
			b := forkBackend{stored: stored}
			r, err := New(cfg, zap.NewNop(), withBackend(b, realClock{}))
			if err != nil {
				t.Fatal(err)
			}
			start := replication.Start{
				Slot:     replication.SlotState{Name: "s", ConfirmedFlushLSN: slot},
				Identity: replication.ServerIdentity{SystemIdentifier: "1", Database: "d", Timeline: c.now},
				State:    replication.State{Timeline: c.recorded}, HadState: true,
				Fork: c.fork, ForkKnown: c.known,
			}
			kcfg := cfg.Kafka
			p, err := r.startTransactional(context.Background(), &kcfg, start)
			if !c.refused {
				if err != nil || p == nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var fe *FatalError
			if !errors.As(err, &fe) || !errors.Is(err, ErrTimelineForked) || !strings.Contains(err.Error(), "remove the slot's record") {
				t.Fatalf("want a fatal ErrTimelineForked naming the way on, got %v", err)
			}
		})
	}
}
