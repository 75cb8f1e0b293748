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
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

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
	// refuseAlone: a producer of one record per request refuses the
	// record of event refuse too (not its dead-letter record): it is too
	// large on its own.
	refuseAlone bool

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
	if (!p.single || p.b.refuseAlone && rec.Topic != scriptedDeadLetterTopic) && string(rec.EventID) == p.b.refuse {
		a.Err = &kafka.ProduceError{Topic: rec.Topic, Err: sarama.ErrMessageSizeTooLarge}
		if !p.single {
			p.b.refused++
		}
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

// scriptedDeadLetterTopic is relay.dead.letter.topic in tests of the
// scripted poll backend that dead-letter.
const scriptedDeadLetterTopic = "pgoutbox.dead-letters"

// TestPollSendsOneRecordPerRequestUntilTheRefusedRowIsGone: the broker
// refuses the batch of row A, and A on its own as well (too large
// whatever batch it is in). The relay sends one record per request until
// A is dead-lettered, after poll.max.attempts attempts, with one whole
// batch refused in all; then batches again (row C, written after, goes in
// a normal batch). The mode once ended at the first claim that went
// through: A, refused alone, went back into a normal batch at each retry,
// the broker refused the whole batch again (the rows acknowledged in it
// sent twice, their keys' order broken), up to poll.max.attempts times.
func TestPollSendsOneRecordPerRequestUntilTheRefusedRowIsGone(t *testing.T) {
	ctx := context.Background()
	const a, b, c = "00000000-0000-4000-8000-00000000001a", "00000000-0000-4000-8000-00000000001b", "00000000-0000-4000-8000-00000000001c"
	const maxAttempts = 4
	be := &scriptedPollBackend{refuse: a, refuseAlone: true}
	conn, _ := startScriptedPoll(t, be, func(cfg *Config) {
		cfg.Poll.MaxAttempts = maxAttempts
		cfg.Poll.RetryBackoff, cfg.Poll.RetryBackoffMax = 20*time.Millisecond, 50*time.Millisecond
		cfg.Relay.PoisonPolicy, cfg.Relay.DeadLetterTopic = "dead-letter", scriptedDeadLetterTopic
	})
	const insert = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', $2, 'T', '{}')"
	// A and B (another key) in one transaction: one batch.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range [][2]string{{a, "k"}, {b, "other"}} {
		if _, err := tx.Exec(ctx, insert, row[0], row[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	state := func(id string) (published bool, attempts int) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT published_at IS NOT NULL, attempts FROM outbox WHERE id = $1", id).Scan(&published, &attempts); err != nil {
			t.Fatal(err)
		}
		return published, attempts
	}
	status := func() string {
		be.mu.Lock()
		defer be.mu.Unlock()
		return fmt.Sprintf("whole batches refused %d; producers made (true: one record per request) %v", be.refused, be.sessions)
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		done, n := state(a)
		return done, fmt.Sprintf("row A not dead-lettered: %d attempts; %s", n, status())
	})
	if done, _ := state(b); !done {
		t.Fatalf("row B (another key) not published while A was tried; %s", status())
	}
	if _, n := state(a); n != maxAttempts {
		t.Fatalf("row A dead-lettered after %d attempts, want poll.max.attempts=%d", n, maxAttempts)
	}
	be.mu.Lock()
	refused := be.refused
	be.mu.Unlock()
	if refused != 1 {
		t.Fatalf("%s; want the whole batch refused once: A, refused on its own too, went back into normal batches", status())
	}
	if _, err := conn.Exec(ctx, insert, c, "k"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		done, _ := state(c)
		return done, "row C, written after A was dead-lettered, not published; " + status()
	})
	if by := be.ackedBy(c); len(by) != 1 || by[0] {
		t.Fatalf("row C acknowledged by producers %v (%s); want one of normal batches: A is dead-lettered, single-record mode should have ended", by, status())
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
	ctx := context.Background()
	cfg, conn := scriptedPollDatabase(t, mutate)
	be.liveBackend, be.acked = &liveBackend{log: zap.NewNop()}, map[string][]bool{}
	seen, logs := observer.New(zap.InfoLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel), zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, seen) })))
	r, err := New(cfg, log, withBackend(be, realClock{}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	run := &scriptedRun{done: make(chan error, 1), logs: logs}
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
	logs  *observer.ObservedLogs // what it logged at Info and above
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
