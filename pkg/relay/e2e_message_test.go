package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

func emit(t *testing.T, f *fixture, transactional, commit bool, events ...outboxtest.Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "INSERT INTO outbox_other (note) VALUES ('business change')"); err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		body := fmt.Sprintf(`{"id": %q, "aggregatetype": %q, "aggregateid": %q, "type": %q, "payload": %s}`, e.ID, e.AggregateType, e.AggregateID, e.Type, e.Payload)
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message($1, 'outbox', $2)", transactional, body); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func messageEvents(f *fixture, n int, seq0 int) []outboxtest.Event {
	evs := make([]outboxtest.Event, n)
	for i := range evs {
		evs[i] = outboxtest.Event{ID: outboxtest.NewID(), AggregateType: f.shape.AggregateTypes[i%len(f.shape.AggregateTypes)],
			AggregateID: fmt.Sprintf("agg-%d", i%4), Type: "Created", Payload: fmt.Sprintf(`{"seq": %d}`, seq0+i), Seq: seq0 + i}
	}
	return evs
}

// TestTablelessOutboxMessagesAreRoutedLikeRows writes events with
// pg_logical_emit_message(true, 'outbox', ...) in committed and rolled-back
// transactions: the committed ones arrive exactly like outbox rows would,
// the rolled-back ones never.
func TestTablelessOutboxMessagesAreRoutedLikeRows(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 2)
	runRelay(t, f.config())
	f.waitStreaming(t)
	committed := messageEvents(f, 6, 0)
	emit(t, f, true, true, committed[:3]...)
	rolledBack := messageEvents(f, 2, 100)
	emit(t, f, true, false, rolledBack...)
	emit(t, f, true, true, committed[3:]...)
	c := env.NewConsumer(t, f.topics)
	w := &outboxtest.Writer{Committed: committed, RolledBack: map[string]outboxtest.Event{}}
	for _, e := range rolledBack {
		w.RolledBack[e.ID] = e
	}
	waitAll(t, c, w, time.Minute)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), nil)
	if !rep.OK() || rep.Duplicates != 0 || rep.Verified != len(committed) {
		t.Fatalf("table-less outbox: %s", rep)
	}
}

// TestNonTransactionalMessageIsRefusedByDefault: a message written with
// transactional = false is not tied to a transaction's outcome; by default
// the relay stops with an error that names the option, and with
// messages.nontransactional=accept it routes it.
func TestNonTransactionalMessageIsRefusedByDefault(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	stop := runRelay(t, f.config())
	f.waitStreaming(t)
	emit(t, f, false, true, messageEvents(f, 1, 0)...)
	var err error
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		_, active := f.slotState(t)
		return !active, "relay still streaming"
	})
	err = stop()
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "messages.nontransactional=accept") {
		t.Fatalf("want a fatal error naming messages.nontransactional, got %v", err)
	}

	cfg := f.config()
	cfg.Messages.NonTransactional = "accept"
	runRelay(t, cfg)
	c := env.NewConsumer(t, f.topics)
	ev := messageEvents(f, 1, 0)
	emit(t, f, false, false, ev...) // even though the transaction rolls back
	w := &outboxtest.Writer{Committed: ev, RolledBack: map[string]outboxtest.Event{}}
	waitAll(t, c, w, time.Minute)
}
