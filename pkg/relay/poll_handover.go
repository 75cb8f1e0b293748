package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// handover takes over from a WAL-source relay (poll.handover.slot) before
// anything is claimed: every unpublished row its slot relayed is marked
// published, then the slot is dropped.
//
// A row was relayed when its transaction committed before the slot's
// confirmed position; the slot's pending changes are exactly the others.
// In one repeatable-read transaction: read the WAL insert position L (past
// the commit of every transaction the snapshot sees), peek at the slot's
// inserts up to L (without consuming them), and mark published every
// unpublished row the snapshot sees but the peek does not name. Rows
// committed later are invisible to the transaction and stay unpublished.
// Doing it again is harmless while the slot exists and nobody consumes
// it, so instances starting together need no more than a lock to take
// turns; the first one drops the slot, and the others find nothing to do.
func (pr *pollRunner) handover(ctx context.Context, conn *pgx.Conn) error {
	r, t := pr.r, pr.table
	slot := r.cfg.Poll.HandoverSlot
	if slot == "" {
		return nil
	}
	if err := poll.LockHandover(ctx, conn, t.Name); err != nil {
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = poll.UnlockHandover(uctx, conn, t.Name)
		cancel()
	}()
	st, err := replication.ReadSlot(ctx, conn, slot)
	if errors.Is(err, replication.ErrSlotMissing) {
		r.log.Info("poll.handover.slot does not exist (any more): nothing to take over from it", zap.String("slot", slot))
		return nil
	}
	if err != nil {
		return err
	}
	if st.Active {
		return fmt.Errorf("%w: a WAL relay still streams from slot %q (walsender PID %d); stop it (SIGTERM), and this relay takes over", errWaitingForOthers, slot, st.ActivePID)
	}
	// The peek sees the pending inserts only through a publication that
	// carries every one of them: through any other (missing, which
	// PostgreSQL 18 only warns about; without the table; not publishing
	// inserts; filtering rows) it names fewer, and every row it does not
	// name would be marked published without ever being relayed.
	pcfg := r.cfg.Postgres
	pcfg.Tables = []string{t.Name}
	cat, err := replication.ReadCatalog(ctx, conn, pcfg)
	if err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	if p := cat.Problems(pcfg); len(p) > 0 {
		return &FatalError{Err: fmt.Errorf("relay: handover from slot %q reads its pending inserts through publication %q (postgres.publication.name: set it to the WAL relay's), which cannot show them all, so rows it relayed cannot be told from rows it did not: %w",
			slot, pcfg.Publication, &replication.CatalogError{Publication: pcfg.Publication, Problems: p, Err: replication.ErrCatalogUnusable})}
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	var upto int64
	if err := tx.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint").Scan(&upto); err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	lsn := replication.LSN(upto)
	pending, err := replication.PeekInserted(ctx, tx, slot, r.cfg.Postgres.Publication, t.Name, t.IDColumn, lsn)
	if err != nil {
		return err
	}
	n, err := poll.MarkRelayed(ctx, tx, t, pending)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	r.log.Info("took over from the WAL source: marked the rows its slot relayed as published",
		zap.String("slot", slot), zap.String("slot_confirmed_lsn", st.ConfirmedFlushLSN.String()), zap.Int64("rows_marked", n),
		zap.Int("rows_not_relayed", len(pending)), zap.Stringer("upto", lsn))
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		return fmt.Errorf("relay: handover done; drop slot %q: %w (drop it yourself: it keeps WAL)", slot, err)
	}
	r.log.Info("dropped the WAL source's slot", zap.String("slot", slot))
	return nil
}
