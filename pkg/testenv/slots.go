package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SetServerSetting sets a reloadable server setting (ALTER SYSTEM, then
// pg_reload_conf) for the rest of the test and resets it at the end. The
// setting is server-wide: the test must hold the environment with
// RequireExclusive.
func (e *Env) SetServerSetting(t testing.TB, name, value string) {
	t.Helper()
	t.Cleanup(func() {
		if err := e.superExec("ALTER SYSTEM RESET "+pgx.Identifier{name}.Sanitize(), "SELECT pg_reload_conf()"); err != nil {
			t.Errorf("testenv: reset %s: %v", name, err)
		}
	})
	if err := e.superExec("ALTER SYSTEM SET "+pgx.Identifier{name}.Sanitize()+" = '"+value+"'", "SELECT pg_reload_conf()"); err != nil {
		t.Fatalf("testenv: set %s: %v", name, err)
	}
}

func (e *Env) superExec(sqls ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	c, err := pgx.Connect(ctx, e.PGDSN)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for _, sql := range sqls {
		if _, err := c.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// LoseSlot makes PostgreSQL invalidate the unused slot in the database of
// dsn for real: it lowers max_slot_wal_keep_size to 1MB for the rest of the
// test, then writes WAL, switches segments and checkpoints until the slot's
// wal_status is "lost" (within a minute). The test must hold the
// environment with RequireExclusive.
func (e *Env) LoseSlot(t testing.TB, dsn, slot string) {
	t.Helper()
	e.SetServerSetting(t, "max_slot_wal_keep_size", "1MB")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS testenv_wal_filler (note text)"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 60*time.Second, 10*time.Millisecond, func() (bool, string) {
		// Each round fills and switches a WAL segment and checkpoints,
		// which invalidates slots that retain more than the limit.
		for _, sql := range []string{
			"INSERT INTO testenv_wal_filler SELECT repeat(md5(g::text), 8) FROM generate_series(1, 2000) g",
			"SELECT pg_switch_wal()",
			"CHECKPOINT",
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return false, fmt.Sprintf("%s: %v", sql, err)
			}
		}
		var status *string
		if err := conn.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil {
			return false, fmt.Sprintf("read slot %s: %v", slot, err)
		}
		if status == nil {
			return false, "slot " + slot + " has no wal_status"
		}
		return *status == "lost", "slot " + slot + " has wal_status " + *status
	})
}
