package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SlotReport is everything pg_replication_slots says about one slot, with
// the server's current WAL position the lag and retention are measured
// from. It is read by one query (slotReportSQL) that the relay's session
// start, its slot poller, status and validate all use. Pointers are NULL
// columns; columns PostgreSQL 17 added are NULL before 17.
type SlotReport struct {
	Name               string
	Plugin             *string
	SlotType           *string
	Database           *string
	Active             bool
	ActivePID          *int32
	RestartLSN         *LSN
	ConfirmedFlushLSN  *LSN
	WALStatus          *string
	SafeWALSize        *int64
	Failover           *bool
	InvalidationReason *string
	// TwoPhase is the slot's two_phase flag.
	TwoPhase *bool
	// CurrentLSN is pg_current_wal_lsn() on a primary, and on a standby
	// (which holds logical slots from PostgreSQL 16 on, and synchronized
	// failover slots from 17 on) the last replayed position: what a slot
	// there can have reached.
	CurrentLSN LSN
	InRecovery bool
}

const slotReportSQL = `SELECT s.slot_name::text, s.plugin::text, s.slot_type, s.database::text, s.active, s.active_pid,
	s.restart_lsn::text, s.confirmed_flush_lsn::text, s.wal_status, s.safe_wal_size,
	(to_jsonb(s) ->> 'failover')::bool, to_jsonb(s) ->> 'invalidation_reason', w.lsn::text, w.recovery,
	(to_jsonb(s) ->> 'two_phase')::bool
	FROM pg_replication_slots s,
	(SELECT pg_is_in_recovery() AS recovery,
		CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w
	WHERE s.slot_name = $1`

// ReadSlotReport reads the slot's row; a slot that does not exist is
// ErrSlotMissing.
func ReadSlotReport(ctx context.Context, conn *pgx.Conn, slot string) (SlotReport, error) {
	r := SlotReport{Name: slot}
	var restart, confirmed, current *string
	err := conn.QueryRow(ctx, slotReportSQL, slot).Scan(&r.Name, &r.Plugin, &r.SlotType, &r.Database, &r.Active, &r.ActivePID,
		&restart, &confirmed, &r.WALStatus, &r.SafeWALSize, &r.Failover, &r.InvalidationReason, &current, &r.InRecovery, &r.TwoPhase)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: %q", ErrSlotMissing, slot)
	}
	if err != nil {
		return r, fmt.Errorf("replication: read slot %q: %w", slot, err)
	}
	for _, f := range []struct {
		name string
		text *string
		dst  **LSN
	}{{"restart_lsn", restart, &r.RestartLSN}, {"confirmed_flush_lsn", confirmed, &r.ConfirmedFlushLSN}} {
		if f.text == nil {
			continue
		}
		l, err := parseLSN(*f.text)
		if err != nil {
			return r, fmt.Errorf("replication: slot %q %s: %w", slot, f.name, err)
		}
		*f.dst = &l
	}
	if current != nil {
		if r.CurrentLSN, err = parseLSN(*current); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Lag is CurrentLSN minus confirmed_flush_lsn: WAL written since the last
// confirmed position (nil when the slot has none).
func (r SlotReport) Lag() *int64 { return r.since(r.ConfirmedFlushLSN) }

// Retained is CurrentLSN minus restart_lsn: WAL kept on disk for the slot.
func (r SlotReport) Retained() *int64 { return r.since(r.RestartLSN) }

func (r SlotReport) since(l *LSN) *int64 {
	if l == nil || r.CurrentLSN == 0 {
		return nil
	}
	d := int64(r.CurrentLSN) - int64(*l)
	return &d
}

// State returns the report as a SlotState.
func (r SlotReport) State() SlotState {
	s := SlotState{Name: r.Name, Plugin: deref(r.Plugin), SlotType: deref(r.SlotType), Database: deref(r.Database),
		Active: r.Active, WALStatus: deref(r.WALStatus), InvalidationReason: deref(r.InvalidationReason)}
	if r.ActivePID != nil {
		s.ActivePID = *r.ActivePID
	}
	if r.RestartLSN != nil {
		s.RestartLSN = *r.RestartLSN
	}
	if r.ConfirmedFlushLSN != nil {
		s.ConfirmedFlushLSN = *r.ConfirmedFlushLSN
	}
	s.Failover = r.Failover != nil && *r.Failover
	s.TwoPhase = r.TwoPhase != nil && *r.TwoPhase
	return s
}

// Stats returns the report as SlotStats.
func (r SlotReport) Stats() SlotStats {
	st := r.State()
	s := SlotStats{Name: r.Name, Active: r.Active, WALStatus: st.WALStatus, SafeWALSize: r.SafeWALSize,
		RestartLSN: st.RestartLSN, ConfirmedFlushLSN: st.ConfirmedFlushLSN, CurrentLSN: r.CurrentLSN}
	if ret := r.Retained(); ret != nil && *ret > 0 && r.RestartLSN != nil {
		s.RetainedWALBytes = *ret
	}
	return s
}
