package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outbox"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestLibraryModesAreDeliveredThroughTheRelay writes events with pkg/outbox
// in each mode (rows, rows deleted again in the same transaction, logical
// decoding messages) and checks the relay delivers every one of them.
func TestLibraryModesAreDeliveredThroughTheRelay(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 2)
	runRelay(t, f.config())
	f.waitStreaming(t)
	c := env.NewConsumer(t, f.topics)
	ctx := context.Background()
	var committed []outboxtest.Event
	for _, mode := range []outbox.Mode{outbox.ModeTable, outbox.ModeTableDeleteAfterInsert, outbox.ModeMessage} {
		w, err := outbox.NewWriter(outbox.Config{Table: "public.outbox", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			tx, err := f.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			payload := json.RawMessage(fmt.Sprintf(`{"mode": %q, "i": %d}`, mode, i))
			ev := outbox.Event{AggregateType: f.shape.AggregateTypes[i%2], AggregateID: fmt.Sprintf("%s-%d", mode, i), Type: "Created", Payload: payload}
			ids, err := w.Write(ctx, tx, ev)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			committed = append(committed, outboxtest.Event{ID: ids[0], AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Payload: string(payload), Seq: len(committed)})
		}
	}
	var n int64
	if err := f.conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil || n != 3 {
		t.Fatalf("outbox table holds %d rows (%v), want only the 3 of table mode", n, err)
	}
	w := &outboxtest.Writer{Committed: committed, RolledBack: map[string]outboxtest.Event{}}
	waitAll(t, c, w, time.Minute)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), nil)
	if !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("library modes: %s", rep)
	}
}
