package poll

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestRelayedKeepsRowsPastTheXIDHorizon: the WAL source's cleanup deletes
// the rows whose transaction precedes a mark's oldest running transaction.
// On a server whose transaction ids are in their second epoch (pg_resetwal
// -e 1 on a fresh cluster: 64-bit ids just past 2^32, which a real server
// reaches after 4 billion transactions), a mark 2^31 + 1000 transactions
// old has a 32-bit id that looks 2^31 - 1000 transactions in the future;
// comparing 32-bit ages (age(xmin) > age(mark)) then took every row, those
// written long after the mark included, for relayed, and deleted it. The
// oracle is 64-bit arithmetic on the ids the server reports.
func TestRelayedKeepsRowsPastTheXIDHorizon(t *testing.T) {
	env := testenv.Require(t)
	srv := env.NewServer(t, "-e", "1")
	ctx := context.Background()
	conn := testenv.ConnectPG(t, srv.ServerDSN(srv.PrimaryPort, "postgres"))
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE TABLE outbox (id int)")
	nextXID := func() (x uint64) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	before := nextXID()
	exec("INSERT INTO outbox SELECT generate_series(1, 50)")
	next := nextXID()
	if next < 1<<32 {
		t.Fatalf("the next transaction id is %d: pg_resetwal -e 1 did not put it in epoch 1", next)
	}
	count := func() (n int) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	c := Cleanup{BatchSize: 1000, MaxBatches: 1000}
	// A mark older than every row, by more than 2^31 transactions: nothing
	// precedes it.
	n, err := c.Relayed(ctx, conn, "public.outbox", Mark{SnapshotXmin: next - (1 << 31) - 1000})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 || count() != 50 {
		t.Fatalf("a mark 2^31+1000 transactions old deleted %d rows written after it (%d of 50 left)", n, count())
	}
	// A mark at the rows' transaction, which it does not precede: nothing
	// either.
	if n, err = c.Relayed(ctx, conn, "public.outbox", Mark{SnapshotXmin: before}); err != nil || n != 0 {
		t.Fatalf("a mark at the rows' own transaction deleted %d rows (%v)", n, err)
	}
	// A mark from another cluster, after the next id here: refused.
	if n, err = c.Relayed(ctx, conn, "public.outbox", Mark{SnapshotXmin: next + 1000}); err == nil || n != 0 || count() != 50 {
		t.Fatalf("a mark after the next transaction id: %d deleted, %v; want an error and nothing deleted", n, err)
	}
	// A mark after them: all go.
	if n, err = c.Relayed(ctx, conn, "public.outbox", Mark{SnapshotXmin: next}); err != nil || n != 50 || count() != 0 {
		t.Fatalf("a mark after every row deleted %d of 50 (%v)", n, err)
	}
}

// TestXID64PutsA32BitIDInItsEpoch checks xid64's SQL on the server against
// 64-bit arithmetic, where the low 32 bits of the next id have wrapped past
// the row's (the server of the test above cannot reach that point: its ids
// start just past 2^32).
func TestXID64PutsA32BitIDInItsEpoch(t *testing.T) {
	env := testenv.Require(t)
	conn := testenv.ConnectPG(t, env.NewDatabase(t))
	const e = uint64(1) << 32
	for _, c := range []struct {
		next, id uint64 // id: the row's true 64-bit id, below next
		want     uint64 // what xid64 must give
	}{
		{next: 1000, id: 3, want: 3},
		{next: e + 5, id: e - 10, want: e - 10},                   // the low bits wrapped since the row
		{next: e + 5, id: e + 4, want: e + 4},                     // the same epoch
		{next: 3*e + 100, id: 3*e - e/2 + 1, want: 3*e - e/2 + 1}, // 2^31 - 99 old
		{next: 2*e + 7, id: e + 7, want: 2*e + 7},                 // 2^32 old (a frozen row): younger, kept
		{next: 2*e + 7, id: e + 3, want: e + e + 3},               // older still: younger, kept
	} {
		var got uint64
		sql := "SELECT " + xid64("$1::bigint", "$2::bigint")
		if err := conn.QueryRow(context.Background(), sql, int64(c.next), int64(c.id%e)).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("next %d, row %d (low bits %d): got %d, want %d", c.next, c.id, c.id%e, got, c.want)
		}
		if got < c.id {
			t.Errorf("next %d, row %d: %d makes the row older than it is", c.next, c.id, got)
		}
	}
}
