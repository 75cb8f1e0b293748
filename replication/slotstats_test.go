package replication_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

func connectStats(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := replication.ConnectSQL(ctx, replication.Config{DSN: dsn}, "pgoutbox-test", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestReadSlotStatsReportsRetainedWAL creates an unused slot, writes WAL,
// and checks that the slot reports the WAL it holds back, its status and
// positions consistent with the server's own.
func TestReadSlotStatsReportsRetainedWAL(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	conn := connectStats(t, dsn)
	ctx := context.Background()
	slot := strings.ToLower(testenv.UniqueName(t, "s"))
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	before, err := replication.ReadSlotStats(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	if before.Name != slot || before.Active || before.WALStatus != "reserved" {
		t.Fatalf("fresh slot: %+v, want inactive and reserved", before)
	}
	if before.RestartLSN == 0 || before.ConfirmedFlushLSN == 0 || before.CurrentLSN < before.RestartLSN {
		t.Fatalf("fresh slot positions: %+v", before)
	}
	if got, want := before.RetainedWALBytes, int64(before.CurrentLSN-before.RestartLSN); got != want {
		t.Fatalf("retained %d bytes, want current - restart = %d", got, want)
	}
	var keep string
	if err := conn.QueryRow(ctx, "SHOW max_slot_wal_keep_size").Scan(&keep); err != nil {
		t.Fatal(err)
	}
	if (keep == "-1") != (before.SafeWALSize == nil) {
		t.Fatalf("max_slot_wal_keep_size %s but safe_wal_size %v", keep, before.SafeWALSize)
	}

	// About 2 MB of WAL that nothing consumes from this slot.
	if _, err := conn.Exec(ctx, "CREATE TABLE filler (note text); INSERT INTO filler SELECT repeat(md5(g::text), 8) FROM generate_series(1, 5000) g"); err != nil {
		t.Fatal(err)
	}
	after, err := replication.ReadSlotStats(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	if after.RestartLSN != before.RestartLSN {
		t.Fatalf("restart_lsn moved from %s to %s without a consumer", before.RestartLSN, after.RestartLSN)
	}
	if grew := after.RetainedWALBytes - before.RetainedWALBytes; grew < 1<<20 {
		t.Fatalf("retained WAL grew by %d bytes after writing rows, want at least 1 MB (before %+v, after %+v)", grew, before, after)
	}
}

// TestReadSlotStatsOfMissingSlotIsErrSlotMissing.
func TestReadSlotStatsOfMissingSlotIsErrSlotMissing(t *testing.T) {
	env := testenv.Require(t)
	conn := connectStats(t, env.NewDatabase(t))
	_, err := replication.ReadSlotStats(context.Background(), conn, "no_such_slot_here")
	if !errors.Is(err, replication.ErrSlotMissing) {
		t.Fatalf("got %v, want ErrSlotMissing", err)
	}
}

// TestConnectSQLDoesNotQuoteAnInvalidDSN: the DSN may hold a password.
func TestConnectSQLDoesNotQuoteAnInvalidDSN(t *testing.T) {
	_, err := replication.ConnectSQL(context.Background(), replication.Config{DSN: "postgres://u:s3cret@host:notaport/db"}, "x", time.Second)
	if err == nil {
		t.Fatal("no error for an invalid DSN")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error quotes the password: %v", err)
	}
}

// TestReadSlotStatsReportsALostSlot lowers max_slot_wal_keep_size so far
// that a checkpoint removes WAL an unused slot still needs, and checks the
// slot then reads as lost. It changes a server setting for the duration, so
// it runs alone.
func TestReadSlotStatsReportsALostSlot(t *testing.T) {
	env := testenv.RequireExclusive(t)
	dsn := env.NewDatabase(t)
	conn := connectStats(t, dsn)
	ctx := context.Background()
	slot := strings.ToLower(testenv.UniqueName(t, "s"))
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	env.LoseSlot(t, dsn, slot)
	st, err := replication.ReadSlotStats(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	if st.WALStatus != "lost" {
		t.Fatalf("slot stats %+v, want wal_status lost", st)
	}
	if st.RetainedWALBytes != 0 || st.SafeWALSize != nil {
		t.Fatalf("lost slot: %+v, want no retained WAL and no safe_wal_size", st)
	}

	// PostgreSQL 17+ also names the reason, and the relay's error says it.
	major, _ := env.ServerVersion(t)
	s, err := replication.ReadSlot(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	if major >= 17 {
		want = "wal_removed"
	}
	if s.WALStatus != "lost" || s.InvalidationReason != want {
		t.Fatalf("ReadSlot: wal_status %q, invalidation_reason %q; want lost, %q", s.WALStatus, s.InvalidationReason, want)
	}
	cfg := replication.DefaultConfig()
	cfg.DSN, cfg.Slot, cfg.Publication, cfg.Tables = dsn, slot, slot, []string{"public.testenv_wal_filler"}
	_, err = replication.Prepare(ctx, cfg, zap.NewNop())
	if !errors.Is(err, replication.ErrSlotLost) || (want != "" && !strings.Contains(err.Error(), "invalidation_reason "+want)) {
		t.Fatalf("Prepare on the lost slot: %v; want ErrSlotLost naming invalidation_reason %q", err, want)
	}
	t.Logf("PostgreSQL %d: %v", major, err)
}

func TestLimitUsage(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	cases := []struct {
		st      replication.SlotStats
		usage   float64
		limited bool
	}{
		{replication.SlotStats{RetainedWALBytes: 10 << 20}, 0, false},                             // no limit
		{replication.SlotStats{RetainedWALBytes: 48 << 20, SafeWALSize: n(16 << 20)}, 0.75, true}, // 48 of 64 MB
		{replication.SlotStats{RetainedWALBytes: 0, SafeWALSize: n(64 << 20)}, 0, true},
		{replication.SlotStats{RetainedWALBytes: 80 << 20, SafeWALSize: n(-16 << 20)}, 1.25, true}, // past the limit
		{replication.SlotStats{RetainedWALBytes: 0, SafeWALSize: n(0)}, 1, true},
	}
	for _, c := range cases {
		u, l := c.st.LimitUsage()
		if u != c.usage || l != c.limited {
			t.Errorf("%+v: LimitUsage() = %v, %v; want %v, %v", c.st, u, l, c.usage, c.limited)
		}
	}
}

// TestSQLConnectionsRunWithoutRowSecurity: every SQL connection sets
// row_security off once connected (not as a startup parameter, which
// PgBouncer refuses), so that a query row-level security would filter
// fails instead.
func TestSQLConnectionsRunWithoutRowSecurity(t *testing.T) {
	env := testenv.Require(t)
	conn := connectStats(t, env.NewDatabase(t))
	var v string
	if err := conn.QueryRow(context.Background(), "SHOW row_security").Scan(&v); err != nil || v != "off" {
		t.Fatalf("row_security = %q (%v), want off", v, err)
	}
	if got := conn.Config().RuntimeParams["row_security"]; got != "" {
		t.Fatalf("row_security sent as a startup parameter (%q)", got)
	}
}
