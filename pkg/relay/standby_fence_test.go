package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
)

// takenBackend is a slot that Prepare finds free and the stream then finds
// taken: the active instance came back between two of its sessions. The
// moment cannot be produced on demand with real servers, hence the seam.
type takenBackend struct {
	backend
	producers *int
}

func (b takenBackend) Prepare(_ context.Context, cfg replication.Config) (replication.Start, error) {
	return replication.Start{
		Slot: replication.SlotState{Name: cfg.Slot, SlotType: "logical", Plugin: "pgoutput", ConfirmedFlushLSN: 0x1000, WALStatus: "reserved"},
		Catalog: replication.Catalog{CheckedAt: 0x1000, Publication: 500, Insert: true, ViaRoot: true,
			Tables: []replication.TableInfo{{Name: "public.outbox", OID: 1001, Kind: 'r', Persistence: 'p', Published: true}}},
		Identity: replication.ServerIdentity{SystemIdentifier: "1", Database: "d", Timeline: 1},
	}, nil
}

func (b takenBackend) Open(context.Context, replication.Config, checkpoint.LSN) (stream, error) {
	return nil, replication.ErrSlotInUse
}

func (b takenBackend) EnsureOffsetsTopic(context.Context, kafka.Config) error { return nil }

func (b takenBackend) NewTxnProducer(context.Context, kafka.Config, kafka.SlotIdentity) (txnProducer, error) {
	*b.producers++
	return nil, errors.New("takenBackend: a producer was built")
}

func (b takenBackend) NewProducer(context.Context, kafka.Config) (producer, error) {
	*b.producers++
	return nil, errors.New("takenBackend: a producer was built")
}

// TestStandbyBuildsNoProducerForASlotItCannotTake: building an
// exactly-once producer fences every earlier producer of the transactional
// id, and Kafka then refuses the active instance's transaction. A standby
// that found the slot free for a moment, and built its producer before the
// stream took the slot, made the active instance exit for a takeover that
// never happened. The stream takes the slot first now; one that finds it
// taken builds no producer, and the instance stays a standby.
func TestStandbyBuildsNoProducerForASlotItCannotTake(t *testing.T) {
	for _, eos := range []bool{true, false} {
		cfg := DefaultConfig()
		cfg.Postgres.DSN, cfg.Kafka.Brokers, cfg.Kafka.ExactlyOnce = "postgres://taken", []string{"taken:9092"}, eos
		var producers int
		r, err := New(cfg, zap.NewNop(), withBackend(takenBackend{producers: &producers}, realClock{}))
		if err != nil {
			t.Fatal(err)
		}
		ran, err := r.session(context.Background())
		if ran || !errors.Is(err, replication.ErrSlotInUse) {
			t.Fatalf("exactly-once %v: want a standby's ErrSlotInUse, got ran=%v, %v", eos, ran, err)
		}
		if producers != 0 {
			t.Fatalf("exactly-once %v: %d producers built for a slot the stream could not take (each fences the active instance's transactional producer)", eos, producers)
		}
	}
}

// slowProducerBackend opens a stream that records its status updates and
// builds its producer only once the stream has sent two of them (or gives
// up after a deadline): a broker slow to answer at the start.
type slowProducerBackend struct {
	takenBackend
	st *statusStream
}

type statusStream struct {
	stream
	sent   chan checkpoint.LSN
	closed bool
}

func (s *statusStream) SendStatus(_ context.Context, confirmed checkpoint.LSN, _ bool) error {
	s.sent <- confirmed
	return nil
}

func (s *statusStream) Close(context.Context) error { s.closed = true; return nil }

func (b slowProducerBackend) ReadSlot(_ context.Context, cfg replication.Config) (replication.SlotState, time.Time, error) {
	return replication.SlotState{Name: cfg.Slot, SlotType: "logical", Plugin: "pgoutput", ConfirmedFlushLSN: 0x1000, WALStatus: "reserved", Active: true}, time.Now(), nil
}

func (b slowProducerBackend) Open(context.Context, replication.Config, checkpoint.LSN) (stream, error) {
	return b.st, nil
}

func (b slowProducerBackend) NewProducer(ctx context.Context, _ kafka.Config) (producer, error) {
	deadline := time.After(10 * time.Second)
	for range 2 {
		select {
		case lsn := <-b.st.sent:
			if lsn != 0x1000 {
				return nil, fmt.Errorf("status update confirmed %s, not the slot's 0/1000", lsn)
			}
		case <-deadline:
			return nil, errors.New("no status updates while the producer was built")
		}
	}
	return nil, errSlowProducerDone
}

var errSlowProducerDone = errors.New("slowProducerBackend: two status updates came")

// TestStreamIsKeptAliveWhileTheProducerIsBuilt: the stream is opened
// before the producer is built, and the server ends a stream that says
// nothing for wal_sender_timeout; a broker slow to answer must not cost
// the slot. Status updates confirming the slot's own position keep it.
func TestStreamIsKeptAliveWhileTheProducerIsBuilt(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Postgres.DSN, cfg.Kafka.Brokers = "postgres://slow", []string{"slow:9092"}
	cfg.Postgres.StatusInterval = 10 * time.Millisecond
	st := &statusStream{sent: make(chan checkpoint.LSN, 16)}
	r, err := New(cfg, zap.NewNop(), withBackend(slowProducerBackend{st: st}, realClock{}))
	if err != nil {
		t.Fatal(err)
	}
	ran, err := r.session(context.Background())
	if ran || !errors.Is(err, errSlowProducerDone) {
		t.Fatalf("want the producer built after two status updates, got ran=%v, %v", ran, err)
	}
	if !st.closed {
		t.Fatal("the stream of a session whose producer failed was left open")
	}
}
