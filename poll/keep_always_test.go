package poll_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestKeepTriggersHoldInReplicaMode: a trigger fires by default only in
// sessions whose session_replication_role is origin; a session set to
// replica (a superuser's, pg_restore --disable-triggers, a logical
// replication apply worker writing into the table) deleted and truncated
// unpublished rows unchecked. After poll migrate the keep triggers fire
// always: such a session's DELETE is skipped with the warning and its
// TRUNCATE refused. Keep triggers left firing in origin mode only (by an
// earlier version) let the relay start, named by KeepTriggersNotAlways,
// and migrate run again makes them fire always with an ALTER alone; one
// set to fire in replica mode only is refused like a disabled one.
func TestKeepTriggersHoldInReplicaMode(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Require(t).NewDatabase(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM public.outbox WHERE published_at IS NULL").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	enabled := func() []string {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT tgname || '=' || tgenabled::text FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname = ANY($1) ORDER BY 1`,
			[]string{migrations.KeepTrigger, migrations.KeepTruncateTrigger})
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	always := []string{migrations.KeepTrigger + "=A", migrations.KeepTruncateTrigger + "=A"}
	p := migrations.PollParams{Table: "public.outbox"}
	tb, err := poll.NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	// holds deletes and truncates the rows in a replica session: they stay.
	holds := func(what string) {
		t.Helper()
		exec("INSERT INTO public.outbox (id, aggregatetype, aggregateid, type) VALUES (gen_random_uuid(), 'a', 'k', 't'), (gen_random_uuid(), 'a', 'k', 't')")
		n := count()
		mu.Lock()
		notices = nil
		mu.Unlock()
		exec("SET session_replication_role = replica")
		defer exec("RESET session_replication_role")
		exec("DELETE FROM public.outbox")
		if got := count(); got != n {
			t.Fatalf("%s: DELETE in a replica session left %d of %d unpublished rows, want all (the keep trigger skips it)", what, got, n)
		}
		mu.Lock()
		warned := slices.ContainsFunc(notices, func(m string) bool { return strings.Contains(m, "the delete is skipped") })
		mu.Unlock()
		if !warned {
			t.Fatalf("%s: DELETE in a replica session: notices %q, want the keep trigger's warning", what, notices)
		}
		_, err := conn.Exec(ctx, "TRUNCATE public.outbox")
		if err == nil || !strings.Contains(err.Error(), "TRUNCATE would discard their events") {
			t.Fatalf("%s: TRUNCATE in a replica session: %v, want the keep trigger's refusal", what, err)
		}
		if got := count(); got != n {
			t.Fatalf("%s: TRUNCATE in a replica session left %d of %d unpublished rows", what, got, n)
		}
	}

	if err := migrations.ApplyPoll(ctx, conn, p); err != nil {
		t.Fatal(err)
	}
	if got := enabled(); !slices.Equal(got, always) {
		t.Fatalf("after poll migrate: keep triggers %v, want %v", got, always)
	}
	holds("after poll migrate")
	if err := tb.Check(ctx, conn); err != nil || len(tb.KeepTriggersNotAlways()) > 0 {
		t.Fatalf("Check after poll migrate: %v, not always %v; want no error and none", err, tb.KeepTriggersNotAlways())
	}

	// As an earlier version left them: ENABLE makes them fire in origin
	// mode only. The relay starts (upgrades are not refused), told which.
	exec("ALTER TABLE public.outbox ENABLE TRIGGER " + migrations.KeepTrigger + ", ENABLE TRIGGER " + migrations.KeepTruncateTrigger)
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatalf("Check with keep triggers firing in origin mode only: %v, want no refusal", err)
	}
	if got, want := tb.KeepTriggersNotAlways(), []string{migrations.KeepTrigger, migrations.KeepTruncateTrigger}; !slices.Equal(got, want) {
		t.Fatalf("KeepTriggersNotAlways: %v, want %v", got, want)
	}
	if w := poll.NotAlwaysWarning(tb.Name, tb.KeepTriggersNotAlways()); !strings.Contains(w, "session_replication_role = replica") || !strings.Contains(w, "pgoutbox migrate") {
		t.Fatalf("NotAlwaysWarning: %q, want the cause and the fix", w)
	}
	plan, err := migrations.PlanPoll(ctx, conn, p)
	if err != nil {
		t.Fatal(err)
	}
	if plan.KeepTrigger || plan.KeepTruncateTrigger || !plan.KeepAlways || !plan.KeepTruncateAlways {
		t.Fatalf("plan with keep triggers firing in origin mode only: %+v, want ENABLE ALWAYS alone", plan)
	}
	if c := strings.Join(plan.Changes(), ", "); !strings.Contains(c, "ENABLE ALWAYS of trigger "+migrations.KeepTrigger) {
		t.Fatalf("plan's changes: %s, want the ENABLE ALWAYS named", c)
	}
	if err := migrations.ApplyPoll(ctx, conn, p); err != nil {
		t.Fatal(err)
	}
	if got := enabled(); !slices.Equal(got, always) {
		t.Fatalf("after poll migrate again: keep triggers %v, want %v", got, always)
	}
	holds("after poll migrate again")
	if plan, err := migrations.PlanPoll(ctx, conn, p); err != nil || len(plan.Changes()) > 0 {
		t.Fatalf("plan after poll migrate again: %+v (%v), want nothing to change", plan.Changes(), err)
	}

	// Firing in replica mode only is not firing in an ordinary session:
	// refused like a disabled trigger, and migrate puts it back.
	exec("ALTER TABLE public.outbox ENABLE REPLICA TRIGGER " + migrations.KeepTrigger)
	if err := tb.Check(ctx, conn); !errors.Is(err, poll.ErrLayout) || !strings.Contains(err.Error(), migrations.KeepTrigger) {
		t.Fatalf("Check with the keep trigger firing in replica mode only: %v, want a layout error naming it", err)
	}
	if err := migrations.ApplyPoll(ctx, conn, p); err != nil {
		t.Fatal(err)
	}
	if got := enabled(); !slices.Equal(got, always) {
		t.Fatalf("after poll migrate of a replica-only trigger: keep triggers %v, want %v", got, always)
	}
}
