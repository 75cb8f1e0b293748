package replication_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	reset := func() error {
		c, err := pgx.Connect(context.Background(), env.PGDSN)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "ALTER SYSTEM RESET max_slot_wal_keep_size"); err != nil {
			return err
		}
		_, err = c.Exec(context.Background(), "SELECT pg_reload_conf()")
		return err
	}
	t.Cleanup(func() {
		if err := reset(); err != nil {
			t.Errorf("reset max_slot_wal_keep_size: %v", err)
		}
	})
	for _, sql := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()", "CREATE TABLE filler (note text)"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var st replication.SlotStats
	testenv.Eventually(t, 60*time.Second, 10*time.Millisecond, func() (bool, string) {
		// Each round fills and switches a WAL segment and checkpoints, which
		// invalidates slots whose restart_lsn lies past the limit.
		for _, sql := range []string{
			"INSERT INTO filler SELECT repeat(md5(g::text), 8) FROM generate_series(1, 2000) g",
			"SELECT pg_switch_wal()",
			"CHECKPOINT",
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return false, fmt.Sprintf("%s: %v", sql, err)
			}
		}
		var err error
		st, err = replication.ReadSlotStats(ctx, conn, slot)
		if err != nil {
			return false, err.Error()
		}
		return st.WALStatus == "lost", fmt.Sprintf("slot stats %+v", st)
	})
	if st.RetainedWALBytes != 0 || st.SafeWALSize != nil {
		t.Fatalf("lost slot: %+v, want no retained WAL and no safe_wal_size", st)
	}
}
