package poll_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestMarkRelayedKnowsThePeekedIDsByTheirOutputText: the slot's pending
// inserts name their ids as pgoutput sends them, in the type's output
// text; rows so named stay unpublished, whatever a cast to text would make
// of the id (a char(n) loses its padding, an inet gains a /32), and rows
// without an id are never marked.
func TestMarkRelayedKnowsThePeekedIDsByTheirOutputText(t *testing.T) {
	ctx := context.Background()
	conn := newDatabase(t)
	for _, c := range []struct {
		typ     string
		pending []string // as pgoutput sends them
		relayed []string
	}{
		{"char(12)", []string{"abc" + strings.Repeat(" ", 9), "pending-2   "}, []string{"relayed"}},
		{"inet", []string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.3"}},
		{"uuid", []string{"406c07f3-26f2-4b0c-9a3a-4d6a5a1c0e01"}, []string{"406c07f3-26f2-4b0c-9a3a-4d6a5a1c0e02"}},
	} {
		t.Run(c.typ, func(t *testing.T) {
			table := "public.h_" + strings.NewReplacer("(", "", ")", "").Replace(c.typ)
			if _, err := conn.Exec(ctx, "CREATE TABLE "+table+" (id "+c.typ+", published_at timestamptz)"); err != nil {
				t.Fatal(err)
			}
			for _, id := range append(append(append([]string{}, c.pending...), c.relayed...), "") {
				var v any = id
				if id == "" {
					v = nil
				}
				if _, err := conn.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1::text::"+c.typ+")", v); err != nil {
					t.Fatal(err)
				}
			}
			tb, err := poll.NewTable(table, "", "id")
			if err != nil {
				t.Fatal(err)
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			n, err := poll.MarkRelayed(ctx, tx, tb, c.pending)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n != int64(len(c.relayed)) {
				t.Errorf("marked %d rows, want the %d relayed ones", n, len(c.relayed))
			}
			var unpublished int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE published_at IS NULL").Scan(&unpublished); err != nil {
				t.Fatal(err)
			}
			if want := len(c.pending) + 1; unpublished != want {
				t.Errorf("%d rows unpublished, want the %d pending and the one without an id", unpublished, want)
			}
		})
	}
}

// TestCheckRefusesPollColumnsWithAnotherMeaning: migrate adds only the poll
// columns that are missing, so a table may already have a published_at
// that every row gets when it is written (an event time, a default of
// now()): its rows would be born published and never relayed, with no
// error. Check must refuse it, and a seq that cannot order the rows (not
// an integer, NULL, numbered by a sequence with a cache, that cycles or
// counts down, its own or one its default takes numbers from).
func TestCheckRefusesPollColumnsWithAnotherMeaning(t *testing.T) {
	ctx := context.Background()
	conn := newDatabase(t)
	if _, err := conn.Exec(ctx, "CREATE SEQUENCE cached CACHE 20; CREATE SEQUENCE down INCREMENT -1; CREATE SEQUENCE up"); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		publishedAt, seq, want string
	}{
		{"timestamptz", "bigint GENERATED ALWAYS AS IDENTITY", ""},
		{"timestamptz NOT NULL DEFAULT now()", "bigint GENERATED ALWAYS AS IDENTITY", "born published"},
		{"timestamptz DEFAULT now()", "bigint GENERATED ALWAYS AS IDENTITY", "born published"},
		{"text", "bigint GENERATED ALWAYS AS IDENTITY", "not timestamptz"},
		{"timestamptz", "text", "not an integer"},
		// The sequence that numbers the rows must hand out its numbers in
		// the order they are asked for, across sessions, and once.
		{"timestamptz", "bigint GENERATED ALWAYS AS IDENTITY (CACHE 20)", "CACHE 20"},
		{"timestamptz", "bigint GENERATED ALWAYS AS IDENTITY (CYCLE)", "cycles"},
		{"timestamptz", "bigserial", ""},
		{"timestamptz", "bigint", "may be NULL"},
		{"timestamptz", "bigint NOT NULL", ""},
		{"timestamptz", "bigint GENERATED ALWAYS AS IDENTITY (INCREMENT -1)", "counts down (INCREMENT -1)"},
		{"timestamptz", "bigint NOT NULL DEFAULT nextval('down')", "counts down (INCREMENT -1)"},
		{"timestamptz", "bigint NOT NULL DEFAULT nextval('cached')", "CACHE 20"},
		{"timestamptz", "bigint NOT NULL DEFAULT nextval('up')", ""},
	} {
		table := fmt.Sprintf("public.c%d", i)
		if _, err := conn.Exec(ctx, "CREATE TABLE "+table+" (id uuid, aggregatetype text, aggregateid text, type text, payload jsonb, seq "+c.seq+
			", published_at "+c.publishedAt+", attempts integer NOT NULL DEFAULT 0, last_error text)"); err != nil {
			t.Fatal(err)
		}
		// The keep triggers (and indexes): the columns stay as written.
		if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: table}); err != nil {
			t.Fatal(err)
		}
		tb, err := poll.NewTable(table, "aggregateid", "id")
		if err != nil {
			t.Fatal(err)
		}
		err = tb.Check(ctx, conn)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("published_at %s, seq %s: %v, want no error", c.publishedAt, c.seq, err)
		case c.want != "" && (!errors.Is(err, poll.ErrLayout) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("published_at %s, seq %s: %v, want a layout error saying %q", c.publishedAt, c.seq, err, c.want)
		}
	}
}

// newDatabase connects to a new database of the test environment, closed
// when the test ends.
func newDatabase(t *testing.T) *pgx.Conn {
	t.Helper()
	return testenv.ConnectPG(t, testenv.Require(t).NewDatabase(t))
}
