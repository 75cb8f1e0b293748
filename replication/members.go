package replication

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// The WAL source's instances on one slot (one streams, the others stand
// by) show that they are there, and where they publish, by each holding a
// shared session-level advisory lock (SlotMembersKey, destination) on a
// connection of its own for as long as the process runs. The server
// releases it when the session ends, however it ends. pg_locks shows it
// with objsubid 2, classid the slot's key and objid the destination.

// SlotMember is an instance of the WAL source that shows it runs on a
// slot (JoinSlot), as pg_locks and pg_stat_activity show it.
type SlotMember struct {
	PID uint32
	// Destination is the objid of its lock: the fingerprint of where it
	// publishes.
	Destination     int32
	ApplicationName string
	ClientAddr      string
	// BackendStart is nil when this role cannot see the session's start
	// (another role's, without pg_read_all_stats).
	BackendStart *time.Time
}

// SlotMembersKey is the first key (classid) of the advisory locks of the
// WAL source's instances on slot in database.
func SlotMembersKey(database, slot string) int32 {
	f := fnv.New32a()
	f.Write([]byte("pgoutbox-wal/" + database + "/" + slot))
	return int32(f.Sum32() & 0x7fffffff)
}

// JoinSlot takes, on conn, the shared advisory lock that shows this
// instance as one on slot publishing to destination (in [1, 2^31)). The
// lock lasts as long as conn's server session; conn must be used for
// nothing that could release it (pg_advisory_unlock_all, DISCARD ALL). It
// returns the session's PID.
func JoinSlot(ctx context.Context, conn *pgx.Conn, slot string, destination int32) (uint32, error) {
	var db string
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT current_database(), pg_backend_pid()").Scan(&db, &pid); err != nil {
		return 0, fmt.Errorf("replication: show this instance on slot %q: %w", slot, err)
	}
	key := SlotMembersKey(db, slot)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared($1::int, $2::int)", key, destination).Scan(&ok); err != nil {
		return 0, fmt.Errorf("replication: show this instance on slot %q: %w", slot, err)
	}
	if !ok {
		return 0, fmt.Errorf("replication: show this instance on slot %q: another session holds the advisory lock (%d, %d) exclusively; pgoutbox takes it shared only: find the holder in pg_locks", slot, key, destination)
	}
	return pid, nil
}

// SlotMembers reads the instances on slot that show themselves (JoinSlot)
// in conn's database, other than conn's own session, ordered by PID.
func SlotMembers(ctx context.Context, conn *pgx.Conn, slot string) ([]SlotMember, error) {
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return nil, fmt.Errorf("replication: read the instances on slot %q: %w", slot, err)
	}
	rows, err := conn.Query(ctx, `SELECT l.pid, l.objid::bigint::int, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), a.backend_start
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.pid <> pg_backend_pid()
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = $1::int::oid
		ORDER BY l.pid`, SlotMembersKey(db, slot))
	if err != nil {
		return nil, fmt.Errorf("replication: read the instances on slot %q: %w", slot, err)
	}
	var out []SlotMember
	var m SlotMember
	if _, err := pgx.ForEachRow(rows, []any{&m.PID, &m.Destination, &m.ApplicationName, &m.ClientAddr, &m.BackendStart}, func() error {
		out = append(out, m)
		m = SlotMember{}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("replication: read the instances on slot %q: %w", slot, err)
	}
	return out, nil
}
