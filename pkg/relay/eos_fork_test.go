package relay

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
)

// forkBackend serves startTransactional alone: an offsets topic that
// holds stored for the slot.
type forkBackend struct {
	backend
	stored   checkpoint.LSN
	timeline int32 // the stored record's
	// fork and known answer TimelineFork for any pair of timelines.
	fork  checkpoint.LSN
	known bool
	// walEnd answers WALEnd.
	walEnd checkpoint.LSN
}

func (b forkBackend) WALEnd(context.Context, replication.Config) (checkpoint.LSN, error) {
	return b.walEnd, nil
}

func (b forkBackend) TimelineFork(context.Context, replication.Config, int32, int32) (checkpoint.LSN, bool, error) {
	return b.fork, b.known, nil
}

func (b forkBackend) EnsureOffsetsTopic(context.Context, kafka.Config) error { return nil }

func (b forkBackend) NewTxnProducer(context.Context, kafka.Config, kafka.SlotIdentity) (txnProducer, error) {
	return &forkProducer{stored: b.stored, timeline: b.timeline}, nil
}

type forkProducer struct {
	txnProducer
	stored   checkpoint.LSN
	timeline int32
	closed   bool
}

func (p *forkProducer) Stored() (uint64, bool)      { return uint64(p.stored), true }
func (p *forkProducer) StoredTimeline() int32       { return p.timeline }
func (p *forkProducer) StoredAt() time.Time         { return time.Time{} }
func (p *forkProducer) Close(context.Context) error { p.closed = true; return nil }

// startEOS starts exactly-once mode's producer for start with r, and
// checks the verdict: started, or refused (fatal, ErrTimelineForked,
// naming the way on).
func startEOS(t *testing.T, r *Relay, start replication.Start, refused bool) {
	t.Helper()
	kcfg := r.cfg.Kafka
	p, err := r.startTransactional(context.Background(), &kcfg, start, time.Time{})
	if !refused {
		if err != nil || p == nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	var fe *FatalError
	if !errors.As(err, &fe) || !errors.Is(err, ErrTimelineForked) || !strings.Contains(err.Error(), "remove the slot's record") {
		t.Fatalf("want a fatal ErrTimelineForked naming the way on, got %v", err)
	}
}

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
			startEOS(t, r, start, c.refused)
		})
	}
}

// TestExactlyOnceRefusesAStoredPositionFromAnotherHistory: the state row's
// timeline says nothing once migrate --recreate-slot recorded the new one
// (the way the error of a vanished slot points to after a promotion), and
// a restore from a disk snapshot starts no new timeline at all. The stored
// record's own timeline, and the end of the server's WAL, still tell: a
// position written on a timeline the server left before it, or past the
// end of the server's WAL, is refused; one on a timeline the server left
// after it, on the server's timeline, or from a version that wrote no
// timeline, is used.
func TestExactlyOnceRefusesAStoredPositionFromAnotherHistory(t *testing.T) {
	const slot, stored = checkpoint.LSN(0x1000), checkpoint.LSN(0x3000)
	for _, c := range []struct {
		name     string
		recorded int32 // the stored record's timeline (0: not written)
		fork     checkpoint.LSN
		known    bool
		walEnd   checkpoint.LSN
		refused  bool
		walNow   checkpoint.LSN // read again (0: as walEnd)
	}{
		{"recorded on a timeline left before it", 1, 0x2000, true, 0x9000, true, 0},
		{"recorded on a timeline not in the history", 1, 0, false, 0x9000, true, 0},
		{"recorded on a timeline left after it", 1, 0x4000, true, 0x9000, false, 0},
		{"recorded on the server's timeline", 2, 0, false, 0x9000, false, 0},
		{"no timeline recorded", 0, 0, false, 0x9000, false, 0},
		{"past the end of the server's WAL", 2, 0, false, 0x2000, true, 0},
		{"at the end of the server's WAL", 2, 0, false, stored, false, 0},
		// Another instance streamed past the end read at Prepare before
		// this one read the offsets topic.
		{"past the end of WAL read at Prepare, not past it now", 2, 0, false, 0x2000, false, 0x9000},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Postgres.DSN, cfg.Kafka.Brokers, cfg.Kafka.ExactlyOnce = "postgres://fork", []string{"fork:9092"}, true
			r, err := New(cfg, zap.NewNop(), withBackend(forkBackend{stored: stored, timeline: c.recorded, fork: c.fork, known: c.known, walEnd: cmp.Or(c.walNow, c.walEnd)}, realClock{}))
			if err != nil {
				t.Fatal(err)
			}
			// The state row agrees with the server: recreated since.
			start := replication.Start{
				Slot:     replication.SlotState{Name: "s", ConfirmedFlushLSN: slot},
				Identity: replication.ServerIdentity{SystemIdentifier: "1", Database: "d", Timeline: 2, WALEnd: c.walEnd},
				State:    replication.State{Timeline: 2}, HadState: true,
			}
			startEOS(t, r, start, c.refused)
		})
	}
}

// TestSlotFromAnotherHistoryIsRefused: a restored or rewound data
// directory keeps pg_replslot as it was, so a slot may hold a position past
// the end of the server's WAL, or past where the server left the timeline
// the last session streamed on. PostgreSQL would skip the transactions
// committed since up to that position: the start stops (fatal). A slot at
// the end of WAL, or at the fork, starts.
func TestSlotFromAnotherHistoryIsRefused(t *testing.T) {
	for _, c := range []struct {
		name           string
		slot, walEnd   checkpoint.LSN
		recorded, now  int32
		fork           checkpoint.LSN
		known, created bool
		refused        bool
	}{
		{"past the end of WAL", 0x3000, 0x2000, 1, 1, 0, false, false, true},
		{"at the end of WAL", 0x3000, 0x3000, 1, 1, 0, false, false, false},
		{"end of WAL not known", 0x3000, 0, 1, 1, 0, false, false, false},
		{"past the fork", 0x3000, 0x9000, 1, 2, 0x2000, true, false, true},
		{"at the fork", 0x2000, 0x9000, 1, 2, 0x2000, true, false, false},
		{"fork not known", 0x3000, 0x9000, 1, 2, 0, false, false, false},
		{"created on this timeline", 0x3000, 0x9000, 1, 2, 0x2000, true, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Postgres.DSN, cfg.Kafka.Brokers = "postgres://fork", []string{"fork:9092"}
			r, err := New(cfg, zap.NewNop(), withBackend(forkBackend{}, realClock{}))
			if err != nil {
				t.Fatal(err)
			}
			start := replication.Start{
				Slot:     replication.SlotState{Name: "s", ConfirmedFlushLSN: c.slot},
				Identity: replication.ServerIdentity{SystemIdentifier: "1", Database: "d", Timeline: c.now, WALEnd: c.walEnd},
				State:    replication.State{Timeline: c.recorded}, HadState: true,
				Fork: c.fork, ForkKnown: c.known, Created: c.created,
			}
			err = r.checkHistory(start)
			var fe *FatalError
			if c.refused != (err != nil) || (err != nil && (!errors.As(err, &fe) || !errors.Is(err, replication.ErrSlotAdvanced))) {
				t.Fatalf("checkHistory: %v; want refused %v (fatal, ErrSlotAdvanced)", err, c.refused)
			}
		})
	}
}

// emptyOffsets is an offsets topic that holds no record for the slot.
type emptyOffsets struct{ forkBackend }

func (b emptyOffsets) NewTxnProducer(context.Context, kafka.Config, kafka.SlotIdentity) (txnProducer, error) {
	return &noRecordProducer{}, nil
}

type noRecordProducer struct{ forkProducer }

func (p *noRecordProducer) Stored() (uint64, bool) { return 0, false }

// TestExactlyOnceWarnsOfAMissingRecordAfterEarlierSessions: exactly-once
// starts at the slot's position when the offsets topic holds no record for
// it. That is the first start; after earlier sessions (the state row says
// so) it may also be a record that is gone (the topic deleted and
// recreated, renamed, or not compacted): then what Kafka holds past the
// slot is sent again, visible twice to read_committed consumers. That was
// said at Info; it is a warning now, once per process (a record missing at
// a later session of the same process is one its first session has not
// committed yet), and at every start after a session of the process
// committed one. Seam-level: the offsets topic is scripted.
func TestExactlyOnceWarnsOfAMissingRecordAfterEarlierSessions(t *testing.T) {
	for _, hadState := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Postgres.DSN, cfg.Kafka.Brokers, cfg.Kafka.ExactlyOnce = "postgres://fork", []string{"fork:9092"}, true
		core, logs := observer.New(zapcore.InfoLevel)
		r, err := New(cfg, zap.New(core), withBackend(emptyOffsets{}, realClock{}))
		if err != nil {
			t.Fatal(err)
		}
		start := replication.Start{
			Slot:     replication.SlotState{Name: "s", ConfirmedFlushLSN: 0x1000},
			Identity: replication.ServerIdentity{SystemIdentifier: "1", Database: "d", Timeline: 1},
			HadState: hadState, State: replication.State{Timeline: 1, Instance: "other"},
		}
		startEOS(t, r, start, false)
		startEOS(t, r, start, false)
		warned := logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("holds no position for the slot").Len()
		if want := map[bool]int{false: 0, true: 1}[hadState]; warned != want {
			t.Errorf("state row %v: %d warnings over two starts; want %d", hadState, warned, want)
		}
		// Once a session of this process committed a position, a record
		// missing at a later start is gone (the offsets topic deleted
		// while the relay ran), whatever the state row says. That was
		// said at Info.
		r.eosCommitted = true
		startEOS(t, r, start, false)
		after := logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("holds no position for the slot").Len()
		if after != warned+1 {
			t.Errorf("state row %v: a start after this process committed a position gave %d more warnings; want 1", hadState, after-warned)
		}
	}
}
