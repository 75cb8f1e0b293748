package replication

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SlotStats is what a slot costs the server: how much WAL it holds back and
// how close that is to the limit (max_slot_wal_keep_size) past which
// PostgreSQL removes the WAL anyway and the slot is lost.
type SlotStats struct {
	Name string
	// Active says whether a walsender (normally this relay) holds the slot.
	Active bool
	// WALStatus is pg_replication_slots.wal_status: "reserved", "extended",
	// "unreserved" or "lost" ("" if the server reports none).
	WALStatus string
	// RetainedWALBytes is the server's current WAL position minus the
	// slot's restart_lsn: the WAL the slot keeps from being recycled. It is
	// 0 when restart_lsn is NULL (a lost slot).
	RetainedWALBytes int64
	// SafeWALSize is pg_replication_slots.safe_wal_size: how many more bytes
	// of WAL can be written before the slot is in danger of being lost. Nil
	// when the server reports NULL (max_slot_wal_keep_size = -1, no limit,
	// or a lost slot).
	SafeWALSize *int64
	// RestartLSN is the oldest WAL position the slot still needs.
	RestartLSN LSN
	// ConfirmedFlushLSN is the position the relay last confirmed.
	ConfirmedFlushLSN LSN
	// CurrentLSN is the server's current WAL position (the last replayed
	// position on a standby), which RetainedWALBytes is measured from.
	CurrentLSN LSN
}

// LimitUsage is the share of what max_slot_wal_keep_size lets the slot
// retain that it retains now: RetainedWALBytes over RetainedWALBytes plus
// SafeWALSize (the server computes safe_wal_size as the limit's end minus
// the current position, so the sum is the slot's allowance). limited is
// false when the server sets no limit (or the slot is already lost). A
// usage of 1 or more means the next checkpoint may invalidate the slot.
func (s SlotStats) LimitUsage() (usage float64, limited bool) {
	if s.SafeWALSize == nil {
		return 0, false
	}
	allowance := s.RetainedWALBytes + *s.SafeWALSize
	if allowance <= 0 {
		return 1, true
	}
	return float64(s.RetainedWALBytes) / float64(allowance), true
}

// ReadSlotStats reads the slot's WAL usage on an ordinary (non-replication)
// connection (see ReadSlotReport). A slot that does not exist is
// ErrSlotMissing. It is cheap enough to run every few seconds.
func ReadSlotStats(ctx context.Context, conn *pgx.Conn, slot string) (SlotStats, error) {
	r, err := ReadSlotReport(ctx, conn, slot)
	return r.Stats(), err
}

// ConnectSQL opens an ordinary (non-replication) connection for queries
// such as ReadSlotStats, with cfg's DSN and password, named in
// pg_stat_activity by applicationName unless the DSN names one, bounded by
// timeout. An invalid DSN's error does not quote it, since it may hold a
// password.
func ConnectSQL(ctx context.Context, cfg Config, applicationName string, timeout time.Duration) (*pgx.Conn, error) {
	pcfg, err := cfg.SQLConfig()
	if err != nil {
		return nil, err
	}
	pcfg.ConnectTimeout = timeout
	if pcfg.RuntimeParams == nil {
		pcfg.RuntimeParams = map[string]string{}
	}
	if pcfg.RuntimeParams["application_name"] == "" && applicationName != "" {
		pcfg.RuntimeParams["application_name"] = applicationName
	}
	// A query on a table whose row-level security applies to the role
	// fails instead of returning only the rows the policies allow: rows
	// hidden from the poll source or the initial snapshot would pass
	// unseen (see ErrRowSecurity). Set after connecting, not as a startup
	// parameter, which connection poolers (PgBouncer) refuse.
	after := setValueFormat(pcfg.AfterConnect)
	pcfg.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if err := after(ctx, c); err != nil {
			return err
		}
		return c.Exec(ctx, "SET row_security = off").Close()
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, newConnectError(&pcfg.Config, false, err)
	}
	return conn, nil
}
