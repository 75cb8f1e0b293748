package replication_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestStateDestinationOnATableOfAnEarlierVersion: the state row's
// destination column (where the streaming session publishes) is added
// like the columns before it: a table made before it is written and read
// without it (no destination recorded: the next start takes the slot over
// as before), and EnsureStateTable adds it.
func TestStateDestinationOnATableOfAnEarlierVersion(t *testing.T) {
	env := testenv.Require(t)
	conn := connectStats(t, env.NewDatabase(t))
	ctx := context.Background()
	ddl, err := replication.StateTableDDL("public.devf_state")
	if err != nil {
		t.Fatal(err)
	}
	create, _, _ := strings.Cut(ddl, ";")
	const destCol = ",\n\tdestination        text"
	if !strings.Contains(create, destCol) {
		t.Fatalf("unexpected DDL %q", create)
	}
	if _, err := conn.Exec(ctx, strings.Replace(create, destCol, "", 1)); err != nil {
		t.Fatal(err)
	}
	const table = "public.devf_state"
	st := replication.State{Slot: "s1", SystemIdentifier: "1", Database: "db", Timeline: 1, ConfirmedLSN: 0x100,
		ConfirmedAt: time.Now(), Instance: "a", SessionStartedAt: time.Now(), StoppedLSN: 0x200, Destination: "wal-v1 key=1 kafka=2 router=3; x"}
	if err := replication.WriteState(ctx, conn, table, st); err != nil {
		t.Fatalf("write to the old table: %v", err)
	}
	got, had, err := replication.ReadState(ctx, conn, table, "s1")
	if err != nil || !had || got.Destination != "" || got.StoppedLSN != 0x200 {
		t.Fatalf("read the old table: %+v %v %v; want the row, no destination", got, had, err)
	}
	if err := replication.EnsureStateTable(ctx, conn, table); err != nil {
		t.Fatal(err)
	}
	if err := replication.WriteState(ctx, conn, table, st); err != nil {
		t.Fatal(err)
	}
	if got, _, err = replication.ReadState(ctx, conn, table, "s1"); err != nil || got.Destination != st.Destination {
		t.Fatalf("after the upgrade: destination %q (%v); want %q", got.Destination, err, st.Destination)
	}
}
