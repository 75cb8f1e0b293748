package relay_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outbox"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// A payload that is the JSON null (what outbox.NewEvent gives for a nil
// map or pointer) is no payload in every mode of pkg/outbox, as nil is:
// here, with route.tombstone.on.empty.payload, a tombstone each time. Before,
// the table modes wrote a jsonb null (the 4-byte value null) and
// ModeMessage a null the relay reads as SQL NULL (a tombstone, deleting the
// key's history in a compacted topic): the same event routed differently
// by mode.
func TestLibraryNullPayloadGivesTheSameRecordInEveryMode(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	cfg := f.config()
	cfg.Router.RouteTombstoneOnEmptyPayload = true
	runRelay(t, cfg)
	f.waitStreaming(t)
	c := env.NewConsumer(t, f.topics)
	ctx := context.Background()

	var nilMap map[string]any
	var nilPointer *struct{ A int }
	payloads := map[string]func() (outbox.Event, error){
		"nil": func() (outbox.Event, error) { return outbox.Event{}, nil },
		"raw-null": func() (outbox.Event, error) {
			return outbox.Event{Payload: json.RawMessage(" null ")}, nil
		},
		"nil-map":     func() (outbox.Event, error) { return outbox.NewEvent("", "", "", nilMap) },
		"nil-pointer": func() (outbox.Event, error) { return outbox.NewEvent("", "", "", nilPointer) },
		"empty-object": func() (outbox.Event, error) {
			return outbox.Event{Payload: json.RawMessage(`{}`)}, nil
		},
	}
	want := map[string]string{} // key → value; "" for a tombstone
	for _, mode := range []outbox.Mode{outbox.ModeTable, outbox.ModeTableDeleteAfterInsert, outbox.ModeMessage} {
		w, err := outbox.NewWriter(outbox.Config{Table: "public.outbox", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		for name, build := range payloads {
			ev, err := build()
			if err != nil {
				t.Fatal(err)
			}
			ev.AggregateType, ev.AggregateID, ev.Type = f.shape.AggregateTypes[0], mode.String()+"/"+name, "T"
			tx, err := f.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(ctx, tx, ev); err != nil {
				_ = tx.Rollback(ctx)
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			want[ev.AggregateID] = ""
			if name == "empty-object" {
				want[ev.AggregateID] = "{}"
			}
		}
	}
	msgs := c.WaitFor(t, len(want), time.Minute)
	got := map[string]string{}
	for _, m := range msgs {
		switch {
		case m.Value == nil:
			got[string(m.Key)] = ""
		case len(m.Value) == 0:
			got[string(m.Key)] = "(empty value)"
		default:
			got[string(m.Key)] = string(m.Value)
		}
	}
	for key, w := range want {
		if g, ok := got[key]; !ok || g != w {
			name := map[bool]string{true: "a tombstone", false: w}
			t.Errorf("%s: value %q (received %v), want %s", key, g, ok, name[w == ""])
		}
	}
}
