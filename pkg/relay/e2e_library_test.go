package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outbox"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// countingObserver counts what the relay reports, for failure messages.
type countingObserver struct {
	relay.NopObserver
	routed, acked, dropped, progress atomic.Int64
	last                             atomic.Pointer[relay.Progress]
}

func (o *countingObserver) Routed(string, string)  { o.routed.Add(1) }
func (o *countingObserver) Dropped(string, string) { o.dropped.Add(1) }
func (o *countingObserver) Acked(string, int, time.Duration, time.Duration) {
	o.acked.Add(1)
}
func (o *countingObserver) Progress(p relay.Progress) {
	o.progress.Add(1)
	o.last.Store(&p)
}

// TestLibraryModesAreDeliveredThroughTheRelay writes events with pkg/outbox
// in each mode (rows, rows deleted again in the same transaction, logical
// decoding messages) and checks the relay delivers every one of them.
func TestLibraryModesAreDeliveredThroughTheRelay(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 2)
	obs := &countingObserver{}
	runRelay(t, f.config(), relay.WithObserver(obs))
	f.waitStreaming(t)
	t.Cleanup(func() {
		if t.Failed() {
			confirmed, active := f.slotState(t)
			t.Logf("relay saw: %d routed, %d acked, %d dropped, %d progress reports, last %+v; slot confirmed %s active %v",
				obs.routed.Load(), obs.acked.Load(), obs.dropped.Load(), obs.progress.Load(), obs.last.Load(), confirmed, active)
		}
	})
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
