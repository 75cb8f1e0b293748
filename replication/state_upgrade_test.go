package replication_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestStateTableOfAnEarlierVersion: a state table made before stopped_lsn
// keeps working (writes and reads go on without the column, and where the
// session stopped is not recorded), and EnsureStateTable adds the column
// for a role that owns the table; from then on the stop is kept, and a
// session's own record clears it.
func TestStateTableOfAnEarlierVersion(t *testing.T) {
	env := testenv.Require(t)
	conn := connectStats(t, env.NewDatabase(t))
	ctx := context.Background()
	const table = "public.state_old"
	ddl, err := replication.StateTableDDL(table)
	if err != nil {
		t.Fatal(err)
	}
	create, _, ok := strings.Cut(ddl, ";")
	old := strings.Replace(create, ",\n\tstopped_lsn        pg_lsn", "", 1)
	if !ok || old == create {
		t.Fatalf("unexpected DDL %q", ddl)
	}
	if _, err := conn.Exec(ctx, old); err != nil {
		t.Fatal(err)
	}
	st := replication.State{Slot: "s1", SystemIdentifier: "1", Database: "db", Timeline: 1, ConfirmedLSN: 0x100,
		ConfirmedAt: time.Now(), Instance: "a", SessionStartedAt: time.Now(), StoppedLSN: 0x200}
	if err := replication.WriteState(ctx, conn, table, st); err != nil {
		t.Fatalf("write to the old table: %v", err)
	}
	if err := replication.RecordStopped(ctx, conn, table, "s1", "a", 0x300); err != nil {
		t.Fatalf("record the stop in the old table: %v", err)
	}
	got, had, err := replication.ReadState(ctx, conn, table, "s1")
	if err != nil || !had || got.StoppedLSN != 0 || got.ConfirmedLSN != 0x100 {
		t.Fatalf("read the old table: %+v %v %v, want the row without a stop", got, had, err)
	}

	if err := replication.EnsureStateTable(ctx, conn, table); err != nil {
		t.Fatal(err)
	}
	if err := replication.RecordStopped(ctx, conn, table, "s1", "a", 0x300); err != nil {
		t.Fatal(err)
	}
	if err := replication.RecordStopped(ctx, conn, table, "s1", "b", 0x400); err != nil { // not b's row
		t.Fatal(err)
	}
	if got, _, err = replication.ReadState(ctx, conn, table, "s1"); err != nil || got.StoppedLSN != 0x300 {
		t.Fatalf("after the upgrade: stopped %s (%v), want 0/300", got.StoppedLSN, err)
	}
	st.StoppedLSN = 0 // a new session
	if err := replication.WriteState(ctx, conn, table, st); err != nil {
		t.Fatal(err)
	}
	if got, _, err = replication.ReadState(ctx, conn, table, "s1"); err != nil || got.StoppedLSN != 0 {
		t.Fatalf("a session's record: stopped %s (%v), want none", got.StoppedLSN, err)
	}
}
