package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

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

// TestPollStopsWhenItsTableIsRenamedAwayWithUnpublishedRows: while the
// poll source runs, its table is renamed or moved to another schema with
// an unpublished row in it (in the transaction that writes the row), and
// a new table may take its name. The relay follows the name, so the row
// would never be relayed: it stops with a fatal error naming the old
// table by its name now and how many rows it holds unpublished. Renamed
// with every row published, or dropped, it goes on with the table the
// name names; a drop is said at Error (what the table held unpublished
// is gone with it). The relay once went on in every case with a warning
// of a session restarted, and the old table's rows were never relayed.
func TestPollStopsWhenItsTableIsRenamedAwayWithUnpublishedRows(t *testing.T) {
	const first, left, after = "00000000-0000-4000-8000-0000000000c1", "00000000-0000-4000-8000-0000000000c2", "00000000-0000-4000-8000-0000000000c3"
	const insert = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', 'k', 'T', '{}')"
	defaults := DefaultConfig()
	create, err := migrations.RenderPoll(migrations.PollParams{Table: "public.outbox", Channel: defaults.Poll.Channel("public.outbox")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		// change runs in one transaction; leave: a row written in it
		// that the old table keeps unpublished.
		change []string
		leave  bool
		want   []string // in Run's fatal error; nil: the relay goes on
		logged string   // with nil want: logged at Error
	}{
		{"renamed away and another created in its place", append([]string{"ALTER TABLE outbox RENAME TO outbox_old"}, create...), true,
			[]string{"public.outbox_old", "1 unpublished row", "INSERT INTO public.outbox", "postgres.tables"}, ""},
		{"renamed away and another made like it", []string{"ALTER TABLE outbox RENAME TO outbox_old", "CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL)"}, true,
			[]string{"public.outbox_old", "1 unpublished row"}, ""},
		{"moved to another schema", []string{"CREATE SCHEMA archive", "ALTER TABLE outbox SET SCHEMA archive"}, true,
			[]string{"archive.outbox", "1 unpublished row", "public.outbox no longer exists"}, ""},
		{"renamed away with every row published and another created in its place", append([]string{"ALTER TABLE outbox RENAME TO outbox_old"}, create...), false, nil, ""},
		{"dropped and created again", append([]string{"DROP TABLE outbox"}, create...), true, nil, "gone with it"},
		// Turned into a partitioned table: renamed, a partitioned table
		// made under its name, the old one attached. Claims on the new
		// table read the old one's rows: nothing is left behind, and the
		// relay goes on (it stopped, and its advice to copy the rows into
		// the new table and drop the old one would have dropped them).
		{"made a partition of a partitioned table under its name", append([]string{
			"ALTER TABLE outbox RENAME TO outbox_old",
			"ALTER TABLE outbox_old DROP CONSTRAINT outbox_pkey CASCADE",
			"CREATE TABLE outbox (LIKE outbox_old INCLUDING DEFAULTS INCLUDING IDENTITY) PARTITION BY RANGE (seq)",
			"ALTER TABLE outbox ALTER COLUMN seq RESTART WITH 1000000",
			"ALTER TABLE outbox ATTACH PARTITION outbox_old FOR VALUES FROM (MINVALUE) TO (MAXVALUE)",
		}, create...), true, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			be := &scriptedPollBackend{}
			conn, run := startScriptedPoll(t, be, func(cfg *Config) { cfg.Poll.RebalanceInterval = 100 * time.Millisecond })
			acked := func(id string) func() (bool, string) {
				return func() (bool, string) { return len(be.ackedBy(id)) > 0, "row " + id + " not relayed" }
			}
			if _, err := conn.Exec(ctx, insert, first); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(first))
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c.leave {
				if _, err := tx.Exec(ctx, insert, left); err != nil {
					t.Fatal(err)
				}
			}
			for _, q := range c.change {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if c.want == nil {
				if _, err := conn.Exec(ctx, insert, after); err != nil {
					t.Fatal(err)
				}
				testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(after))
				if c.logged == "" {
					if c.leave {
						// Its table is read through the new one, and the
						// look between claims says so and goes on.
						testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(left))
						testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
							for _, e := range run.logs.FilterLevelExact(zap.WarnLevel).All() {
								if strings.Contains(fmt.Sprint(e.ContextMap()["error"]), "a partition or child of") {
									return true, ""
								}
							}
							return false, "no warning that the old table is read through the new one"
						})
						if ok, err := run.wait(0); ok {
							t.Fatalf("Run ended with %v; the old table's rows are read through the new one", err)
						}
					}
					return
				}
				// A claim may take the new table's row before the look
				// between claims notices the drop.
				testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
					for _, e := range run.logs.FilterLevelExact(zap.ErrorLevel).All() {
						if strings.Contains(fmt.Sprint(e.ContextMap()["error"]), c.logged) {
							return true, ""
						}
					}
					return false, fmt.Sprintf("after the table was %s with an unpublished row, no Error saying %q", c.name, c.logged)
				})
				return
			}
			ok, err := run.wait(30 * time.Second)
			var fe *FatalError
			if !ok || !errors.As(err, &fe) || !errors.Is(err, poll.ErrTableReplaced) {
				t.Fatalf("after the table was %s with an unpublished row: Run ended %v with %v; want a fatal error naming the table it is now", c.name, ok, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run's fatal error %q does not say %q", err, w)
				}
			}
		})
	}
}
