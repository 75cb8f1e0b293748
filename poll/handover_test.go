package poll_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestMarkRelayedKnowsThePeekedIDsByTheirOutputText: the slot's pending
// inserts name their ids as pgoutput sends them, in the type's output
// text; rows so named stay unpublished, whatever a cast to text would make
// of the id (a char(n) loses its padding, an inet gains a /32), and rows
// without an id are never marked.
func TestMarkRelayedKnowsThePeekedIDsByTheirOutputText(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
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
