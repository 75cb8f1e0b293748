package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestPollStopsAgainAfterARestartWhileItsOldTableHoldsUnpublishedRows:
// the poll table is renamed away with an unpublished row and another
// table made under its name, while the relay runs or while it is
// stopped. The relay stops with the fatal error naming the old table, and
// so does every new relay (a supervisor's restart) on the same
// configuration, with the same error, until the operator has done what it
// says: the rows copied into the new table and the old one dropped, or
// the old one attached as a partition of the new one. Then the next
// start goes on and every event arrives. A table renamed away with every
// row published is no reason to stop. The relay knew the table it had
// checked only in memory: a restart took the table the name named then,
// and the old table's rows were never relayed, without a word.
func TestPollStopsAgainAfterARestartWhileItsOldTableHoldsUnpublishedRows(t *testing.T) {
	const first, left, after = "00000000-0000-4000-8000-0000000000d1", "00000000-0000-4000-8000-0000000000d2", "00000000-0000-4000-8000-0000000000d3"
	const insert = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', 'k', 'T', '{}')"
	defaults := DefaultConfig()
	create, err := migrations.RenderPoll(migrations.PollParams{Table: "public.outbox", Channel: defaults.Poll.Channel("public.outbox")})
	if err != nil {
		t.Fatal(err)
	}
	partitioned := []string{
		"ALTER TABLE outbox_old DROP CONSTRAINT outbox_pkey CASCADE",
		"CREATE TABLE outbox (LIKE outbox_old INCLUDING DEFAULTS INCLUDING IDENTITY) PARTITION BY RANGE (seq)",
		"ALTER TABLE outbox ALTER COLUMN seq RESTART WITH 1000000",
	}
	for _, c := range []struct {
		name    string
		running bool // renamed while the first relay runs (else while it is stopped)
		leave   bool // with an unpublished row in the old table
		change  []string
		fix     []string // nil: no stop expected
	}{
		{"renamed away while running, then its rows copied into the new table and it dropped", true, true,
			append([]string{"ALTER TABLE outbox RENAME TO outbox_old"}, create...),
			[]string{"INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) SELECT id, aggregatetype, aggregateid, type, payload, created_at FROM outbox_old WHERE published_at IS NULL ORDER BY seq",
				"DROP TABLE outbox_old"}},
		{"renamed away while stopped, then its rows copied into the new table and it dropped", false, true,
			append([]string{"ALTER TABLE outbox RENAME TO outbox_old"}, create...),
			[]string{"INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) SELECT id, aggregatetype, aggregateid, type, payload, created_at FROM outbox_old WHERE published_at IS NULL ORDER BY seq",
				"DROP TABLE outbox_old"}},
		{"renamed away while stopped, then attached as a partition of a partitioned table under its name", false, true,
			append(append([]string{"ALTER TABLE outbox RENAME TO outbox_old"}, partitioned...), create...),
			// The partitioned table's keep trigger is cloned to it.
			[]string{"DROP TRIGGER " + migrations.KeepTrigger + " ON outbox_old",
				"ALTER TABLE outbox ATTACH PARTITION outbox_old FOR VALUES FROM (MINVALUE) TO (1000000)",
				"CREATE TABLE outbox_new PARTITION OF outbox FOR VALUES FROM (1000000) TO (MAXVALUE)"}},
		{"renamed away while stopped with every row published", false, false,
			append([]string{"ALTER TABLE outbox RENAME TO outbox_old"}, create...), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			cfg, conn := scriptedPollDatabase(t, func(cfg *Config) { cfg.Poll.RebalanceInterval = 100 * time.Millisecond })
			be := &scriptedPollBackend{}
			acked := func(id string) func() (bool, string) {
				return func() (bool, string) { return len(be.ackedBy(id)) > 0, "row " + id + " not relayed" }
			}
			exec := func(qs ...string) {
				t.Helper()
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
				for _, q := range qs {
					if _, err := tx.Exec(ctx, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			run := startPollRelay(t, be, cfg)
			if _, err := conn.Exec(ctx, insert, first); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(first))
			change := c.change
			if c.leave {
				change = append([]string{strings.Replace(insert, "$1", "'"+left+"'", 1)}, change...)
			}
			stopped := func(run *pollRelayRun, what string) error {
				t.Helper()
				ok, err := run.wait(30 * time.Second)
				if !ok {
					t.Fatalf("%s: the relay did not stop", what)
				}
				return err
			}
			if !c.running {
				if err := run.stop(); err != nil {
					t.Fatalf("the first relay's stop: %v", err)
				}
			}
			exec(change...)
			if c.fix == nil {
				// Nothing to stop for: a new relay goes on with the new
				// table.
				run = startPollRelay(t, be, cfg)
				if _, err := conn.Exec(ctx, insert, after); err != nil {
					t.Fatal(err)
				}
				testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(after))
				if err := run.stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}
				return
			}
			var want error
			if c.running {
				want = stopped(run, "the rename while it ran")
			}
			// A supervisor's restarts, each a new relay on the same
			// configuration.
			for i := range 3 {
				run = startPollRelay(t, be, cfg)
				err := stopped(run, "a restart while the old table holds an unpublished row")
				var fe *FatalError
				if !errors.As(err, &fe) || !errors.Is(err, poll.ErrTableReplaced) || !strings.Contains(err.Error(), "1 unpublished row") || !strings.Contains(err.Error(), "outbox_old") {
					t.Fatalf("restart %d: Run ended with %v; want the fatal error naming the old table and its unpublished row", i+1, err)
				}
				if want == nil {
					want = err
				}
				if err.Error() != want.Error() {
					t.Fatalf("restart %d: Run ended with\n%v\nwant the same error as before:\n%v", i+1, err, want)
				}
			}
			if len(be.ackedBy(left)) > 0 {
				t.Fatal("the old table's row was relayed before the fix")
			}
			exec(c.fix...)
			run = startPollRelay(t, be, cfg)
			if _, err := conn.Exec(ctx, insert, after); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(left))
			testenv.Eventually(t, time.Minute, 20*time.Millisecond, acked(after))
			if err := run.stop(); err != nil {
				t.Fatalf("Run after the fix: %v", err)
			}
		})
	}
}

// scriptedPollDatabase creates a database with the poll migration's
// outbox table and returns the configuration a scripted poll source runs
// with on it (polling every 50 ms; mutate, if not nil, changes it before
// the migration), and a connection to it.
func scriptedPollDatabase(t *testing.T, mutate func(*Config)) (Config, *pgx.Conn) {
	t.Helper()
	env := testenv.Require(t)
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
	if err := migrations.ApplyPoll(context.Background(), conn, migrations.PollParams{Table: "public.outbox", Channel: cfg.Poll.Channel("public.outbox")}); err != nil {
		t.Fatal(err)
	}
	return cfg, conn
}

// pollRelayRun is a relay's Run on its goroutine, which stop ends.
type pollRelayRun struct {
	*scriptedRun
	cancel context.CancelFunc
}

// stop stops the relay and returns Run's result.
func (p *pollRelayRun) stop() error {
	p.cancel()
	if ok, err := p.wait(time.Minute); !ok {
		return errors.New("the relay did not stop within a minute")
	} else {
		return err
	}
}

// startPollRelay runs a new relay of cfg with be (set up with the live
// backend under it, the first time), as a new process would, until it
// stops or the test ends.
func startPollRelay(t *testing.T, be *scriptedPollBackend, cfg Config) *pollRelayRun {
	t.Helper()
	if be.liveBackend == nil {
		be.liveBackend, be.acked = &liveBackend{log: zap.NewNop()}, map[string][]bool{}
	}
	seen, logs := observer.New(zap.InfoLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel), zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, seen) })))
	r, err := New(cfg, log, withBackend(be, realClock{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &pollRelayRun{scriptedRun: &scriptedRun{done: make(chan error, 1), logs: logs}, cancel: cancel}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if ok, _ := run.wait(time.Minute); !ok {
			t.Error("the relay did not stop within a minute")
		}
	})
	return run
}
