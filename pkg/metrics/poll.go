package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// The poll source's metrics and readiness (relay.source: poll): the
// backlog of the outbox table, read by PollBacklog, and the claim loop's
// progress, reported through relay.PollObserver.

var _ relay.PollObserver = (*Metrics)(nil)

// pollMetrics are the poll source's collectors.
type pollMetrics struct {
	unpublished   prometheus.Gauge
	oldestAge     prometheus.Gauge
	failedRows    prometheus.Gauge
	backlogErrors prometheus.Counter
	members       prometheus.Gauge
	owned         prometheus.Gauge
	claims        prometheus.Counter
	published     prometheus.Counter
	attempts      prometheus.Counter
	cleanedUp     prometheus.Counter
}

// pollState is what the poll source's readiness is computed from; guarded
// by Metrics.mu.
type pollState struct {
	active     bool // the relay reports as a poll source
	table      string
	progress   relay.PollProgress
	lastCommit time.Time // when a claim transaction last ended
	backlog    poll.Backlog
	backlogAt  time.Time // zero: never read
}

func (m *Metrics) buildPoll() {
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		m.all = append(m.all, g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		m.all = append(m.all, c)
		return c
	}
	m.poll = pollMetrics{
		unpublished:   gauge("pgoutbox_outbox_unpublished_rows", "Rows of the poll source's outbox table not yet published (published_at NULL), at the last backlog read."),
		oldestAge:     gauge("pgoutbox_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished row of the poll source's outbox table (by its created_at), at the last backlog read; 0 when there is none."),
		failedRows:    gauge("pgoutbox_outbox_failed_rows", "Unpublished rows of the poll source's outbox table that failed at least one attempt."),
		backlogErrors: counter("pgoutbox_outbox_backlog_read_errors_total", "Failed reads of the poll source's backlog."),
		members:       gauge("pgoutbox_poll_instances", "Instances relaying the poll source's table, this one included."),
		owned:         gauge("pgoutbox_poll_buckets_owned", "Key buckets of the poll source's table this instance owns."),
		claims:        counter("pgoutbox_poll_claims_total", "Claim transactions the poll source committed (including those that found nothing)."),
		published:     counter("pgoutbox_poll_rows_published_total", "Rows the poll source marked published (or deleted) after Kafka acknowledged them."),
		attempts:      counter("pgoutbox_poll_failed_attempts_total", "Failed attempts to publish a row (the router could not map it, or Kafka can never accept its record)."),
		cleanedUp:     counter("pgoutbox_poll_cleanup_deleted_rows_total", "Published rows the relay's cleanup deleted after poll.retention."),
	}
}

// PollProgress implements relay.PollObserver.
func (m *Metrics) PollProgress(p relay.PollProgress) {
	m.poll.members.Set(float64(p.Members))
	m.poll.owned.Set(float64(p.Owned))
	m.inflightRecords.Set(float64(p.InFlightRecords))
	if p.Committed {
		m.poll.claims.Inc()
		m.poll.published.Add(float64(p.Published))
		m.poll.attempts.Add(float64(p.Failed))
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.st.poll
	s.active, s.table, s.progress = true, p.Table, p
	if p.Committed {
		s.lastCommit = now
	}
}

// CleanedUp implements relay.PollObserver.
func (m *Metrics) CleanedUp(rows int64) { m.poll.cleanedUp.Add(float64(rows)) }

// ObserveBacklog records the poll source's backlog as ReadBacklog read it
// (PollBacklog calls it).
func (m *Metrics) ObserveBacklog(table string, b poll.Backlog) {
	m.poll.unpublished.Set(float64(b.Unpublished))
	m.poll.oldestAge.Set(b.OldestAge.Seconds())
	m.poll.failedRows.Set(float64(b.Attempted))
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.st.poll
	s.active, s.table, s.backlog, s.backlogAt = true, table, b, now
}

// pollReady is Ready for the poll source; m.mu is held. The relay is
// ready while its session runs, a claim transaction ended within
// ReadyStaleAfter (or it waits for rows), and the oldest unpublished row
// is younger than ReadyBacklogMaxAge.
func (m *Metrics) pollReady(now time.Time) (bool, string) {
	s := &m.st
	p := &s.poll
	if !s.streaming {
		return false, "not streaming: " + s.lastCause
	}
	// A reading older than a few read intervals is not used either way:
	// reads that keep failing (pgoutbox_outbox_backlog_read_errors_total,
	// the alert PgoutboxOutboxBacklogUnreadable) would otherwise hold the
	// last answer, an old backlog long published or a young one long
	// grown old.
	unread := ""
	if b := p.backlog; !p.backlogAt.IsZero() {
		if age := now.Sub(p.backlogAt); age > m.backlogStale() {
			unread = fmt.Sprintf("; backlog unknown, last read %s ago", human(age))
		} else if b.OldestKnown && b.OldestAge > m.cfg.ReadyBacklogMaxAge {
			return false, fmt.Sprintf("backlog: the oldest unpublished row of %s was written %s ago (metrics.ready.backlog.max.age %s); %d rows unpublished, %d of them failed at least once",
				p.table, human(b.OldestAge), m.cfg.ReadyBacklogMaxAge, b.Unpublished, b.Attempted)
		}
	}
	stuck := now.Sub(p.lastCommit)
	if p.lastCommit.IsZero() {
		stuck = now.Sub(s.lastAdvance) // the session's start
	}
	if stuck <= m.cfg.ReadyStaleAfter {
		return true, fmt.Sprintf("polling %s: last claim ended %s ago; %d of %d buckets owned, %d instances%s", p.table, human(stuck), p.progress.Owned, p.progress.Buckets, p.progress.Members, unread)
	}
	if n := p.progress.InFlightRecords; n > 0 {
		return false, fmt.Sprintf("kafka: %d records unacknowledged, no claim of %s ended for %s%s", n, p.table, human(stuck), unread)
	}
	return false, fmt.Sprintf("stalled: no claim of %s ended for %s%s", p.table, human(stuck), unread)
}

// backlogStale is how old a backlog reading may be and still count for
// readiness: three read intervals, and at least ReadyStaleAfter.
func (m *Metrics) backlogStale() time.Duration {
	return max(3*m.cfg.BacklogPollInterval, m.cfg.ReadyStaleAfter)
}

// PollBacklog reads the backlog of t (poll.ReadBacklog) over its own
// connection, at once and then every interval until ctx ends, and records
// it with ObserveBacklog: the pgoutbox_outbox_* gauges, and readiness,
// which an oldest unpublished row older than ReadyBacklogMaxAge turns to
// 503. It reconnects on the next tick after an error; errors are counted
// in pgoutbox_outbox_backlog_read_errors_total and logged (a repeated one
// at debug level). every <= 0 means Config.BacklogPollInterval's default.
//
// The caller owns the goroutine, as for PollSlot: start it with go, cancel
// ctx, and wait for PollBacklog to return.
func (m *Metrics) PollBacklog(ctx context.Context, pg replication.Config, t *poll.Table, every time.Duration, log *zap.Logger) {
	if every <= 0 {
		every = DefaultConfig().BacklogPollInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
	}()
	lastErr := ""
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		err := func() error {
			pctx, cancel := context.WithTimeout(ctx, pollTimeout)
			defer cancel()
			if conn == nil {
				c, err := replication.ConnectSQL(pctx, pg, "pgoutbox-backlog", pollTimeout)
				if err != nil {
					return err
				}
				conn = c
				if err := t.Check(pctx, conn); err != nil {
					return err
				}
			}
			b, err := poll.ReadBacklog(pctx, conn, t)
			if err != nil {
				_ = conn.Close(context.WithoutCancel(pctx))
				conn = nil
				return err
			}
			m.ObserveBacklog(t.Name, b)
			return nil
		}()
		switch {
		case err == nil:
			lastErr = ""
		case ctx.Err() != nil:
		default:
			m.poll.backlogErrors.Inc()
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				log.Warn("read the outbox table's backlog", zap.String("table", t.Name), zap.Error(err))
			} else {
				log.Debug("read the outbox table's backlog", zap.String("table", t.Name), zap.Error(err))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
