package replication

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SnapshotSlot is a temporary logical slot created on a replication
// connection of its own together with an exported snapshot: the snapshot
// sees exactly the transactions committed before the slot's consistent
// point, and the slot decodes exactly those committed after it. Reading
// the outbox tables in the snapshot and then streaming from the slot sees
// every row once (Debezium's snapshot.mode=initial).
//
// The slot is temporary so that a relay that dies before it finished
// publishing the snapshot leaves no slot of that name behind, and the next
// start takes a new snapshot. What only WAL holds after the first
// attempt's consistent point (rows deleted by their own transaction,
// table-less messages) is in no later snapshot: Anchor copies the first
// attempt's slot into a permanent one (AnchorSlot) that keeps that point
// until the snapshot is published, and the permanent slot is made as a
// copy of it (Persist).
//
// Concurrency: owned by one goroutine. The snapshot stays valid while the
// replication connection is open and idle: nothing but Close may use it
// after CreateSnapshotSlot.
type SnapshotSlot struct {
	conn *pgconn.PgConn
	// Name is the temporary slot's name; Snapshot the exported snapshot's
	// (for SET TRANSACTION SNAPSHOT); ConsistentPoint where the slot
	// starts.
	Name            string
	Snapshot        string
	ConsistentPoint LSN
}

// CreateSnapshotSlot creates the temporary slot of cfg.Slot (plugin
// pgoutput) with an exported snapshot.
func CreateSnapshotSlot(ctx context.Context, cfg Config) (*SnapshotSlot, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, err := connectReplication(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// A name of its own: another instance's temporary slot, kept across
	// its attempts, may be there.
	name := cfg.Slot
	if len(name) > 50 {
		name = name[:50]
	}
	name += fmt.Sprintf("_snap_%06x", rand.Uint32()&0xffffff)
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("replication: create slot %q with a snapshot: %w", name, err)
	}
	at, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("replication: slot %q: consistent point %q: %w", name, res.ConsistentPoint, err)
	}
	return &SnapshotSlot{conn: conn, Name: name, Snapshot: res.SnapshotName, ConsistentPoint: LSN(at)}, nil
}

// SnapshotLock names the advisory lock (pg_advisory_lock(hashtext(name)))
// held while an initial snapshot of slot is read and its slot made: a
// slot made by anyone else meanwhile would start after the snapshot's
// consistent point.
func SnapshotLock(slot string) string { return "pgoutbox.snapshot:" + slot }

// AnchorSlot names the permanent slot that keeps the consistent point of
// the first attempt at an initial snapshot of slot until the snapshot is
// published: at most 62 bytes, the slot's name (cut) and a hash of it.
func AnchorSlot(slot string) string {
	h := fnv.New32a()
	h.Write([]byte(slot))
	prefix := slot
	if len(prefix) > 44 {
		prefix = prefix[:44]
	}
	return fmt.Sprintf("%s_snapshot_%08x", prefix, h.Sum32())
}

// Anchor copies the temporary slot into the permanent slot named anchor
// (AnchorSlot), at the same consistent point, over conn (an ordinary
// connection).
func (s *SnapshotSlot) Anchor(ctx context.Context, conn *pgx.Conn, anchor string) (SlotState, error) {
	return Persist(ctx, conn, s.Name, s.ConsistentPoint, anchor)
}

// Persist makes the permanent slot named slot a copy of from (the anchor,
// or the temporary slot) at its position at, over conn (an ordinary
// connection), and returns it.
func Persist(ctx context.Context, conn *pgx.Conn, from string, at LSN, slot string) (SlotState, error) {
	if err := ValidateSlotName(slot); err != nil {
		return SlotState{}, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2, false)", from, slot); err != nil {
		return SlotState{}, fmt.Errorf("replication: copy slot %q to %q: %w", from, slot, err)
	}
	st, err := ReadSlot(ctx, conn, slot)
	if err != nil {
		return st, err
	}
	if st.ConfirmedFlushLSN != at {
		return st, fmt.Errorf("replication: slot %q starts at %s, not at %s, where %q is", slot, st.ConfirmedFlushLSN, at, from)
	}
	return st, nil
}

// DropSlot drops slot if it exists and no one streams from it, over conn
// (an ordinary connection).
func DropSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE slot_name = $1 AND NOT active`, slot); err != nil {
		return fmt.Errorf("replication: drop slot %q: %w", slot, err)
	}
	return nil
}

// Alive says whether the replication connection, which holds the
// temporary slot and keeps the exported snapshot valid, is still open as
// far as the client knows (a server that ended it says so at the next
// import of the snapshot).
func (s *SnapshotSlot) Alive() bool { return !s.conn.IsClosed() }

// Close ends the replication connection: the temporary slot and the
// snapshot go with it.
func (s *SnapshotSlot) Close(ctx context.Context) {
	s.conn.Close(context.WithoutCancel(ctx))
}
