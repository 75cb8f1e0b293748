package relay

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/router"
)

// scriptedPollBackend is the live backend for PostgreSQL with a scripted
// Kafka: its producers acknowledge each record as it is sent, except that
// a producer of normal batches refuses the batch of event refuse (the way
// a broker refuses a batch too large as a whole). It records which kind of
// producer acknowledged each event.
type scriptedPollBackend struct {
	*liveBackend
	refuse string

	mu       sync.Mutex
	acked    map[string][]bool // event id: SingleRecordBatches of each producer that acknowledged it
	refused  int
	sessions []bool // SingleRecordBatches of each producer made
}

func (b *scriptedPollBackend) NewProducer(ctx context.Context, cfg kafka.Config) (producer, error) {
	b.mu.Lock()
	b.sessions = append(b.sessions, cfg.SingleRecordBatches)
	b.mu.Unlock()
	return &scriptedPollProducer{b: b, single: cfg.SingleRecordBatches, acks: make(chan kafka.Ack, cfg.AckBuffer)}, nil
}

func (b *scriptedPollBackend) StartTopicChecker(kafka.Config, func()) topicChecker {
	return noTopics{ch: make(chan topicResult)}
}

func (b *scriptedPollBackend) CheckTopics(_ context.Context, _ kafka.Config, topics []string) ([]kafka.TopicState, error) {
	out := make([]kafka.TopicState, len(topics))
	for i, t := range topics {
		out[i] = kafka.TopicState{Topic: t, Partitions: 1}
	}
	return out, nil
}

// ackedBy returns the kinds of producer that acknowledged id (true: one
// record per request).
func (b *scriptedPollBackend) ackedBy(id string) []bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]bool(nil), b.acked[id]...)
}

type scriptedPollProducer struct {
	b      *scriptedPollBackend
	single bool
	acks   chan kafka.Ack
}

func (p *scriptedPollProducer) Send(rec *router.Record, m kafka.Meta) {
	a := kafka.Ack{Meta: m, Topic: rec.Topic, EventID: rec.EventID, Sent: time.Now()}
	p.b.mu.Lock()
	if !p.single && string(rec.EventID) == p.b.refuse {
		a.Err = &kafka.ProduceError{Topic: rec.Topic, Err: sarama.ErrMessageSizeTooLarge}
		p.b.refused++
	} else {
		p.b.acked[string(rec.EventID)] = append(p.b.acked[string(rec.EventID)], p.single)
	}
	p.b.mu.Unlock()
	p.acks <- a // AckBuffer holds a whole claim
}
func (p *scriptedPollProducer) Acks() <-chan kafka.Ack      { return p.acks }
func (p *scriptedPollProducer) Close(context.Context) error { return nil }

// TestPollLeavesSingleRecordModeOnceAClaimWentThrough: the broker refuses
// the batch of row A, the next session sends one record per request and
// gets A through; the session after that batches again, so row B, written
// later, goes in a normal batch. The mode once ended only when the claim's
// rows were still there after the batch was recorded, which they never
// are: a session stayed at one record per request (a fraction of the
// throughput) until it restarted for another reason.
func TestPollLeavesSingleRecordModeOnceAClaimWentThrough(t *testing.T) {
	ctx := context.Background()
	const a, b = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"
	be := &scriptedPollBackend{refuse: a}
	conn, _ := startScriptedPoll(t, be, nil)
	insert := func(id string) {
		t.Helper()
		if _, err := conn.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', 'k', 'T', '{}')", id); err != nil {
			t.Fatal(err)
		}
	}
	published := func(id string) func() (bool, string) {
		return func() (bool, string) {
			var done bool
			if err := conn.QueryRow(ctx, "SELECT published_at IS NOT NULL FROM outbox WHERE id = $1", id).Scan(&done); err != nil && err != pgx.ErrNoRows {
				t.Fatal(err)
			}
			be.mu.Lock()
			defer be.mu.Unlock()
			return done, fmt.Sprintf("row %s unpublished; producers made (true: one record per request) %v, refused %d", id, be.sessions, be.refused)
		}
	}
	insert(a)
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, published(a))
	if by := be.ackedBy(a); len(by) != 1 || !by[0] {
		t.Fatalf("row A acknowledged by producers %v; want one that sends one record per request, after its batch was refused", by)
	}
	insert(b)
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, published(b))
	if by := be.ackedBy(b); len(by) != 1 || by[0] {
		be.mu.Lock()
		defer be.mu.Unlock()
		t.Fatalf("row B acknowledged by producers %v (producers made: %v); want one of normal batches: the claim of A went through, single-record mode should have ended", by, be.sessions)
	}
}

// startScriptedPoll creates a database with the poll migration's outbox
// table and runs the poll source on it with be (set up with the live
// backend under it), polling every 50 ms, until the test ends. mutate, if
// not nil, changes the configuration. It returns a connection to the
// database and the run, whose end the test may wait for; else the end of
// the test stops it, and it must return nil.
func startScriptedPoll(t *testing.T, be *scriptedPollBackend, mutate func(*Config)) (*pgx.Conn, *scriptedRun) {
	t.Helper()
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	conn := testenv.ConnectPG(t, dsn)
	cfg := DefaultConfig()
	cfg.Relay.Source = SourcePoll
	cfg.Postgres.DSN = dsn
	cfg.Postgres.Tables = []string{"public.outbox"}
	cfg.Kafka.Brokers = []string{"127.0.0.1:1"} // never dialled: the producer is scripted
	cfg.Kafka.AutoCreateTopics = true
	cfg.Poll.Interval = 50 * time.Millisecond
	cfg.Relay.RestartBackoff, cfg.Relay.RestartBackoffMax = 50*time.Millisecond, 100*time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: "public.outbox", Channel: cfg.Poll.Channel("public.outbox")}); err != nil {
		t.Fatal(err)
	}
	be.liveBackend, be.acked = &liveBackend{log: zap.NewNop()}, map[string][]bool{}
	r, err := New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), withBackend(be, realClock{}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	run := &scriptedRun{done: make(chan error, 1)}
	go func() { run.done <- r.Run(runCtx) }()
	t.Cleanup(func() {
		ended := run.ended
		cancel()
		ok, err := run.wait(time.Minute)
		switch {
		case !ok:
			t.Error("the relay did not stop within a minute")
		case !ended && err != nil:
			t.Errorf("Run: %v", err)
		}
	})
	return conn, run
}

// scriptedRun is a relay's Run on its goroutine.
type scriptedRun struct {
	done  chan error
	ended bool
	err   error
}

// wait waits up to d for Run to return: true and its result, or false if
// it did not return within d.
func (p *scriptedRun) wait(d time.Duration) (bool, error) {
	if p.ended {
		return true, p.err
	}
	select {
	case p.err = <-p.done:
		p.ended = true
		return true, p.err
	case <-time.After(d):
		return false, nil
	}
}
