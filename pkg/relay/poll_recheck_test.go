package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestPollNoticesItsTableChangedUnderIt: while the poll source runs, its
// table is dropped and created again, or gets a published_at default, with
// rows written after. A table made again like the first is checked and
// relayed; one whose published_at rows get when written (every new row
// looks published) stops the relay with the layout error, within the
// rebalance interval. The claims name the table and the checks ran only at
// a session's start: such rows were never relayed, without a word.
func TestPollNoticesItsTableChangedUnderIt(t *testing.T) {
	const before, after = "00000000-0000-4000-8000-0000000000b0", "00000000-0000-4000-8000-0000000000a1"
	defaults := DefaultConfig()
	params := migrations.PollParams{Table: "public.outbox", Channel: defaults.Poll.Channel("public.outbox")}
	for _, c := range []struct {
		name   string
		change func(ctx context.Context, conn *pgx.Conn) error
		want   string // in Run's fatal error; "": the row written after is relayed
	}{
		{"created again alike", func(ctx context.Context, conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, "DROP TABLE outbox"); err != nil {
				return err
			}
			return migrations.ApplyPoll(ctx, conn, params)
		}, ""},
		{"created again with a published_at default", func(ctx context.Context, conn *pgx.Conn) error {
			// The same columns, so that the claim's cached statement does
			// not fail on a new result type.
			if _, err := conn.Exec(ctx, "DROP TABLE outbox"); err != nil {
				return err
			}
			if err := migrations.ApplyPoll(ctx, conn, params); err != nil {
				return err
			}
			_, err := conn.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN published_at SET DEFAULT now()")
			return err
		}, "born published"},
		{"given a published_at default", func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN published_at SET DEFAULT now()")
			return err
		}, "born published"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			be := &scriptedPollBackend{}
			conn, run := startScriptedPoll(t, be, func(cfg *Config) { cfg.Poll.RebalanceInterval = 100 * time.Millisecond })
			insert := func(id string) {
				t.Helper()
				if _, err := conn.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', 'k', 'T', '{}')", id); err != nil {
					t.Fatal(err)
				}
			}
			acked := func(id string) func() (bool, string) {
				return func() (bool, string) { return len(be.ackedBy(id)) > 0, "row " + id + " not relayed" }
			}
			insert(before)
			testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(before))
			if err := c.change(ctx, conn); err != nil {
				t.Fatal(err)
			}
			insert(after)
			if c.want == "" {
				testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(after))
				return
			}
			ok, err := run.wait(30 * time.Second)
			var fe *FatalError
			if !ok || !errors.As(err, &fe) || !errors.Is(err, poll.ErrLayout) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("after the table was %s: Run ended %v with %v (row written after relayed: %v); want a fatal layout error saying %q",
					c.name, ok, err, len(be.ackedBy(after)) > 0, c.want)
			}
		})
	}
}
