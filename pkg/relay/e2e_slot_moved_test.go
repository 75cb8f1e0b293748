package relay_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestSlotMovedToBeforeTheOldCaughtUpIsRefused: a configuration moved to a
// new slot (postgres.slot.name changed; a Helm stream renamed changes the
// slot and the publication) while the old slot still held events. The new
// slot starts at the present and never sees them: a prober lost 50 of 150
// events so, without a word, and pgoutbox cleanup then deleted their rows
// as relayed. Now the start on the new slot, migrate and cleanup refuse,
// status names it among the problems,
// naming the old slot, while it is idle behind where the new one started;
// the way on the refusal gives (run the old slot until it is past that
// point, then move) loses nothing.
func TestSlotMovedToBeforeTheOldCaughtUpIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	old := f.slot
	relayed(t, f, c, "first.log", 41, 10)
	pending := outboxtest.NewWriter(f.conn, "outbox", f.shape, 42)
	for range 5 { // only the old slot holds these
		if err := pending.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.slot = old + "_v2"
	startRefused(t, f, "moved.log", "with the old slot behind", "slot \""+old+"\"", "is idle at", "in slot \""+old+"\" only", "pg_drop_replication_slot('"+old+"')")
	bin := pgoutboxBinary(t)
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = f.environ()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("migrate"); err == nil || !strings.Contains(out, "refuses to start") || !strings.Contains(out, old) {
		t.Fatalf("migrate on the new slot: %v\n%s", err, out)
	}
	if out, _ := run("status"); !strings.Contains(out, "slot \""+old+"\", which relayed public.outbox") || !strings.Contains(out, "refuses to start") {
		t.Fatalf("status on the new slot does not name the old one:\n%s", out)
	}
	var rows int
	count := func() int {
		t.Helper()
		var n int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rows = count()
	for range 2 { // the first run would take a mark, the second delete by it
		if out, err := run("cleanup", "--retention", "0s"); err == nil || !strings.Contains(out, "relayed by neither") || !strings.Contains(out, old) {
			t.Fatalf("cleanup on the new slot: %v\n%s", err, out)
		}
	}
	if n := count(); n != rows {
		t.Fatalf("%d outbox rows after the refused cleanups, %d before", n, rows)
	}

	// The refused start wrote the new slot's state row: the next start is
	// refused all the same.
	startRefused(t, f, "moved-twice.log", "with the old slot behind, again", "slot \""+old+"\"", "is idle at")

	// A relay of another table, on a slot of its own, is not stopped by
	// the old slot, although both relay messages with the default
	// messages.prefix (a review found every such start refused).
	if err := outboxtest.Setup(ctx, f.conn, "outbox2"); err != nil {
		t.Fatal(err)
	}
	other := startBinaryWith(t, f, "other-table.log", "PGOUTBOX_POSTGRES_SLOT_NAME=other_"+old[len(old)-10:],
		"PGOUTBOX_POSTGRES_PUBLICATION_NAME=other_"+old[len(old)-10:], "PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=public.outbox2")
	other.waitLog(t, `"msg":"replication started"`, time.Minute)
	other.terminate(t, time.Minute)

	// The way on: the old slot until it is past the new one's start, then
	// the new one.
	f.slot = old
	relayed(t, f, c, "back.log", 43, 5)
	waitAll(t, c, pending, time.Minute)
	f.slot = old + "_v2"
	relayed(t, f, c, "moved-again.log", 44, 5)

	// A slot made by hand (slot.create: false) beside the old one, now
	// behind it again: its first start and every start until a session
	// streams are refused (the first writes its state row, with no
	// session; a review found the second start let through).
	if err := pending.Txn(ctx); err != nil {
		t.Fatal(err)
	}
	f.slot = old + "_v3"
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot)
	for _, log := range []string{"by-hand.log", "by-hand-again.log"} {
		p := startBinaryWith(t, f, log, "PGOUTBOX_POSTGRES_SLOT_CREATE=false")
		if code := p.wait(t, time.Minute); code == 0 {
			t.Fatalf("%s: exit 0 beside the old slot", log)
		}
		if last := lastLine(t, p); !strings.Contains(last, "slot \""+old+"\"") || !strings.Contains(last, "is idle at") {
			t.Fatalf("%s: last line %q does not name the old slot", log, last)
		}
	}
}

// TestSlotMadeBesideAnIdleSlotPgoutboxDoesNotKnowIsWarnedOf: a relay's
// first start beside an idle slot no state row records (a Debezium
// connector's, whose slot.name this configuration does not name): the new
// slot starts at the present, and whatever the other holds from its
// position on is not in it. pgoutbox cannot tell which tables that slot
// relayed, so it warns, naming it and the in-place migration.
func TestSlotMadeBesideAnIdleSlotPgoutboxDoesNotKnowIsWarnedOf(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	other := "dbz_" + f.slot[len(f.slot)-10:] // (a name is cut to 63 bytes)
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", other)
	t.Cleanup(func() {
		_, _ = f.checkDB.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", other)
	})
	pending := outboxtest.NewWriter(f.conn, "outbox", f.shape, 45)
	if err := pending.Txn(ctx); err != nil { // held by the other slot only
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	r, err := relay.New(f.config(), zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		for _, e := range logs.FilterMessageSnippet("which pgoutbox does not know, is idle behind").All() {
			if v, _ := e.ContextMap()["other_slot"].(string); strings.HasPrefix(v, other+" (plugin pgoutput, idle at ") {
				return true, ""
			}
		}
		return false, "no warning naming slot " + other
	})
}
