package metrics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/replication"
)

// pollTimeout bounds one poll: connecting (when needed) and the query.
const pollTimeout = 10 * time.Second

// The poller warns when the slot retains NearLimitWarn of what
// max_slot_wal_keep_size allows it (SlotStats.LimitUsage), and says so
// again only after the usage fell below nearLimitClear.
const (
	NearLimitWarn  = 0.8
	nearLimitClear = 0.7
)

// PollSlot reads the WAL usage of pg.Slot (replication.ReadSlotStats),
// connecting with pg's DSN and password, at once
// and then every interval until ctx ends, and records it with ObserveSlot:
// the pgoutbox_slot_* gauges, and readiness, which a wal_status of "lost"
// turns to 503. It keeps one ordinary connection open between polls and
// reconnects on the next tick after an error; errors are counted in
// pgoutbox_slot_poll_errors_total and logged (a repeated error at debug
// level). A missing slot is not an error: the relay may not have created
// it yet. every <= 0 means Config.SlotPollInterval's default.
//
// The caller owns the goroutine: start it with go, cancel ctx to stop it,
// and wait for PollSlot to return (it closes its connection first, within
// a few seconds) before the process exits. Stop it after the relay: it has
// nothing to do with the relay's shutdown.
func (m *Metrics) PollSlot(ctx context.Context, pg replication.Config, every time.Duration, log *zap.Logger) {
	if every <= 0 {
		every = DefaultConfig().SlotPollInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	p := &poller{m: m, pg: pg, slot: pg.Slot, log: log.With(zap.String("slot", pg.Slot))}
	defer p.close(ctx)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		p.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type poller struct {
	m          *Metrics
	pg         replication.Config
	slot       string
	log        *zap.Logger
	conn       *pgx.Conn
	lastErr    string
	lastStatus string
	nearLimit  bool
}

func (p *poller) poll(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	if p.conn == nil {
		conn, err := replication.ConnectSQL(pctx, p.pg, "pgoutbox-slot-stats", pollTimeout)
		if err != nil {
			p.failed(ctx, err)
			return
		}
		p.conn = conn
	}
	st, err := replication.ReadSlotStats(pctx, p.conn, p.slot)
	switch {
	case errors.Is(err, replication.ErrSlotMissing):
		p.m.slotMissing(p.slot)
		p.status("missing")
		p.lastErr = ""
		return
	case err != nil:
		p.failed(ctx, err)
		p.close(ctx)
		return
	}
	p.m.ObserveSlot(st)
	p.status(st.WALStatus)
	p.limit(st)
	p.lastErr = ""
}

// limit warns once when the slot's retained WAL approaches
// max_slot_wal_keep_size, before PostgreSQL marks it unreserved or lost:
// the time left to fix a stalled relay.
func (p *poller) limit(st replication.SlotStats) {
	usage, limited := st.LimitUsage()
	switch {
	case limited && !p.nearLimit && usage >= NearLimitWarn:
		p.nearLimit = true
		p.log.Warn("replication slot is approaching max_slot_wal_keep_size: if the relay does not catch up, PostgreSQL will remove WAL the slot needs and events will be lost; check that the relay streams (pgoutbox status), or raise max_slot_wal_keep_size",
			zap.Int64("retained_wal_bytes", st.RetainedWALBytes), zap.Int64("safe_wal_size", *st.SafeWALSize),
			zap.String("usage", fmt.Sprintf("%.0f%%", 100*usage)), zap.String("wal_status", st.WALStatus))
	case p.nearLimit && (!limited || usage < nearLimitClear):
		p.nearLimit = false
		p.log.Info("replication slot is back below max_slot_wal_keep_size's warning level",
			zap.Int64("retained_wal_bytes", st.RetainedWALBytes))
	}
}

// failed counts and logs an error, unless it is only ctx ending.
func (p *poller) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	p.m.slotPollErrors.Inc()
	if msg := err.Error(); msg != p.lastErr {
		p.lastErr = msg
		p.log.Warn("read replication slot WAL usage", zap.Error(err))
		return
	}
	p.log.Debug("read replication slot WAL usage", zap.Error(err))
}

// status logs changes of wal_status: the server's warning that the slot is
// about to cost events, and the news that it has.
func (p *poller) status(s string) {
	if s == p.lastStatus {
		return
	}
	prev := p.lastStatus
	p.lastStatus = s
	switch s {
	case "lost":
		p.log.Error("replication slot is lost: PostgreSQL removed WAL it still needed, so events may be gone; the relay is not ready. Investigate, then drop and recreate the slot deliberately",
			zap.String("wal_status", s))
	case "unreserved":
		p.log.Warn("replication slot retains more WAL than max_slot_wal_keep_size allows: PostgreSQL will remove it at the next checkpoint unless the relay catches up",
			zap.String("wal_status", s))
	case "missing":
		p.log.Info("replication slot does not exist (yet)")
	default:
		if prev != "" {
			p.log.Info("replication slot wal_status changed", zap.String("wal_status", s), zap.String("was", prev))
		}
	}
}

func (p *poller) close(ctx context.Context) {
	if p.conn == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = p.conn.Close(cctx)
	p.conn = nil
}
