package replication_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestStateTableOfAnEarlierVersion: a state table made before stopped_lsn,
// or before membership, keeps working (writes and reads go on without the
// missing columns, and what they keep is not recorded), and
// EnsureStateTable adds them for a role that owns the table; from then on
// the stop and the membership are kept, and a session's own record clears
// the stop.
func TestStateTableOfAnEarlierVersion(t *testing.T) {
	env := testenv.Require(t)
	conn := connectStats(t, env.NewDatabase(t))
	ctx := context.Background()
	ddl, err := replication.StateTableDDL("public.state_x")
	if err != nil {
		t.Fatal(err)
	}
	create, _, ok := strings.Cut(ddl, ";")
	const stoppedCol, membershipCol = ",\n\tstopped_lsn        pg_lsn", ",\n\tmembership         jsonb"
	if !ok || !strings.Contains(create, stoppedCol) || !strings.Contains(create, membershipCol) {
		t.Fatalf("unexpected DDL %q", ddl)
	}
	for i, c := range []struct {
		name     string
		drop     []string
		hasFence bool
	}{
		{"before stopped_lsn", []string{stoppedCol, membershipCol}, false},
		{"before membership", []string{membershipCol}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			table := fmt.Sprintf("public.state_old%d", i)
			old := strings.Replace(create, `"state_x"`, fmt.Sprintf(`"state_old%d"`, i), 1)
			for _, col := range c.drop {
				old = strings.Replace(old, col, "", 1)
			}
			if _, err := conn.Exec(ctx, old); err != nil {
				t.Fatal(err)
			}
			st := replication.State{Slot: "s1", SystemIdentifier: "1", Database: "db", Timeline: 1, ConfirmedLSN: 0x100,
				ConfirmedAt: time.Now(), Instance: "a", SessionStartedAt: time.Now(), StoppedLSN: 0x200,
				PublicationOID: 7, PublicationXmin: 900, TableOIDs: map[string]uint32{"public.outbox": 8},
				Membership: map[string]replication.Membership{"public.outbox": {Rel: 9}}}
			if err := replication.WriteState(ctx, conn, table, st); err != nil {
				t.Fatalf("write to the old table: %v", err)
			}
			if err := replication.RecordStopped(ctx, conn, table, "s1", "a", 0x300); err != nil {
				t.Fatalf("record the stop in the old table: %v", err)
			}
			got, had, err := replication.ReadState(ctx, conn, table, "s1")
			wantStop := checkpoint.LSN(0)
			if c.hasFence {
				wantStop = 0x300
			}
			if err != nil || !had || got.StoppedLSN != wantStop || got.ConfirmedLSN != 0x100 || got.Membership != nil || got.PublicationXmin != 0 || got.TableOIDs["public.outbox"] != 8 {
				t.Fatalf("read the old table: %+v %v %v, want the row without membership, stopped at %s", got, had, err, wantStop)
			}

			if err := replication.EnsureStateTable(ctx, conn, table); err != nil {
				t.Fatal(err)
			}
			if err := replication.WriteState(ctx, conn, table, st); err != nil {
				t.Fatal(err)
			}
			if err := replication.RecordStopped(ctx, conn, table, "s1", "a", 0x300); err != nil {
				t.Fatal(err)
			}
			if err := replication.RecordStopped(ctx, conn, table, "s1", "b", 0x400); err != nil { // not b's row
				t.Fatal(err)
			}
			got, _, err = replication.ReadState(ctx, conn, table, "s1")
			if err != nil || got.StoppedLSN != 0x300 || got.PublicationXmin != 900 || got.Membership["public.outbox"] != (replication.Membership{Rel: 9}) {
				t.Fatalf("after the upgrade: %+v (%v), want stopped at 0/300 and the membership", got, err)
			}
			st.StoppedLSN = 0 // a new session
			if err := replication.WriteState(ctx, conn, table, st); err != nil {
				t.Fatal(err)
			}
			if got, _, err = replication.ReadState(ctx, conn, table, "s1"); err != nil || got.StoppedLSN != 0 {
				t.Fatalf("a session's record: stopped %s (%v), want none", got.StoppedLSN, err)
			}
		})
	}
}

// TestGuardSQLRefusesADollarInTheStateTable: the guard's function bodies are
// dollar-quoted, and the state table's name is written into them.
func TestGuardSQLRefusesADollarInTheStateTable(t *testing.T) {
	if _, err := replication.GuardSQL("public.a$pgoutbox_guard$b"); err == nil || !strings.Contains(err.Error(), "cannot name a table with a $") {
		t.Fatalf("GuardSQL with a $ in the state table: %v, want a refusal", err)
	}
	if _, err := replication.GuardSQL("public.pgoutbox_state"); err != nil {
		t.Fatal(err)
	}
}

// TestStartDoesNotReplaceARowWrittenMeanwhile: two instances starting
// together both find no state row; the first to stream records its own
// (its instance, its fence). The other one's start, which writes a row for
// the slot it found, must not replace it: the streaming instance could
// then raise no fence and confirm nothing more, and WAL would pile up.
func TestStartDoesNotReplaceARowWrittenMeanwhile(t *testing.T) {
	env := testenv.Require(t)
	conn := connectStats(t, env.NewDatabase(t))
	ctx := context.Background()
	if err := replication.EnsureStateTable(ctx, conn, "public.state_race"); err != nil {
		t.Fatal(err)
	}
	streaming := replication.State{Slot: "s", SystemIdentifier: "1", Database: "d", Timeline: 1, ConfirmedLSN: 0x100,
		ConfirmedAt: time.Now(), Instance: "a", SessionStartedAt: time.Now(), StoppedLSN: 0x200}
	if err := replication.WriteState(ctx, conn, "public.state_race", streaming); err != nil {
		t.Fatal(err)
	}
	found := streaming
	found.Instance, found.StoppedLSN, found.Note = "", 0, "found the slot already there"
	if err := replication.WriteStateIfAbsent(ctx, conn, "public.state_race", found); err != nil {
		t.Fatal(err)
	}
	st, ok, err := replication.ReadState(ctx, conn, "public.state_race", "s")
	if err != nil || !ok || st.Instance != "a" || st.StoppedLSN != 0x200 {
		t.Fatalf("row after the other start: %+v (%v %v); want instance a's with its fence", st, ok, err)
	}
	if err := replication.WriteStateIfAbsent(ctx, conn, "public.state_race", replication.State{Slot: "t", SystemIdentifier: "1", Database: "d", Timeline: 1}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := replication.ReadState(ctx, conn, "public.state_race", "t"); err != nil || !ok {
		t.Fatalf("a row where there was none: %v %v", ok, err)
	}
}
