package metrics

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// caughtUpSlack is how far the confirmed LSN of an idle relay may trail
// the server's WAL end in its last progress report and still count as
// caught up: between a keepalive that moves the WAL end and the status
// update that confirms it, a report can see the two apart.
const caughtUpSlack = 64 << 10

// Ready reports whether the relay is ready, and why or why not in one
// line. See the package documentation for the rules.
func (m *Metrics) Ready() (ready bool, reason string) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.st
	if s.poll.active {
		return m.pollReady(now)
	}
	if s.slotLost {
		return false, fmt.Sprintf("slot lost: replication slot %q has wal_status lost; the WAL it needed was removed and events may be gone", s.slot)
	}
	if !s.streaming && s.standby {
		// Not ready, as it relays nothing; /rolloutz counts it as up.
		return false, "not streaming: standing by, another instance streams from the slot"
	}
	if !s.streaming {
		return false, "not streaming: " + s.lastCause
	}
	stale := m.cfg.ReadyStaleAfter
	stuck := now.Sub(s.lastAdvance)
	if stuck <= stale {
		return true, fmt.Sprintf("streaming: confirmed LSN %s advanced %s ago", s.confirmed, human(stuck))
	}
	p := s.progress
	fresh := s.haveProgress && now.Sub(s.progressAt) <= stale
	end := walEnd(p)
	if fresh && p.Idle && end <= p.Confirmed+caughtUpSlack && p.Behind == 0 {
		return true, fmt.Sprintf("idle and caught up: confirmed LSN %s, server WAL end %s", p.Confirmed, end)
	}
	switch {
	case !fresh:
		last := "none this session"
		if s.haveProgress {
			last = human(now.Sub(s.progressAt)) + " ago"
		}
		return false, fmt.Sprintf("stalled: no progress report from the relay (last: %s), confirmed LSN stuck at %s for %s", last, s.confirmed, human(stuck))
	case p.InFlightRecords > 0:
		return false, fmt.Sprintf("kafka: %d records (%d bytes) unacknowledged for %s, confirmed LSN stuck at %s", p.InFlightRecords, p.InFlightBytes, human(stuck), s.confirmed)
	case !p.Idle:
		return false, fmt.Sprintf("transaction open: confirmed LSN stuck at %s for %s, received up to %s", s.confirmed, human(stuck), p.Received)
	case p.Behind > 0:
		// The walsender's own WAL end (its keepalives) says nothing of
		// WAL it has not decoded yet: a walsender waiting for a standby
		// in synchronized_standby_slots, decoding a large transaction, or
		// hung, sends nothing, and looked idle and caught up.
		return false, fmt.Sprintf("behind: the server's WAL was at %s at the relay's last check, %d bytes past what the walsender has sent (%s), and the confirmed LSN %s has not advanced for %s: the walsender is decoding a large transaction, waiting for a standby named in synchronized_standby_slots, or hung",
			p.ServerWAL, p.Behind, max(p.Received, p.ServerWALEnd), p.Confirmed, human(stuck))
	default:
		return false, fmt.Sprintf("behind: confirmed LSN %s is %d bytes behind the server's WAL end %s and has not advanced for %s", p.Confirmed, lagBytes(p), end, human(stuck))
	}
}

// standbyFresh is how recent a standby's report must be for /rolloutz: it
// reports at every poll of the slot (every 1-2 s).
const standbyFresh = time.Minute

// Available reports whether a rolling update may count this instance as
// up (/rolloutz): ready (Ready), or standing by with its last check of
// what a takeover needs passed. A standby with a wrong kafka.brokers or
// credentials, or without its dead-letter topic, is not: a rollout then
// waits instead of replacing the working pods with it. The poll source's
// instances all claim, and are always available (Ready is theirs).
func (m *Metrics) Available() (bool, string) {
	m.mu.Lock()
	poll := m.st.poll.active || m.pollSource
	m.mu.Unlock()
	if poll {
		// Also before its first report, and while it waits for another
		// destination's instances or a WAL relay to leave: a rolling update
		// that waited for it would wait for itself.
		return true, "poll source"
	}
	ready, why := m.Ready()
	if ready {
		return true, why
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.st
	switch {
	case s.streaming:
		return false, why
	case !s.standby:
		return false, "neither streaming nor standing by: " + cmp.Or(s.lastCause, "starting")
	case now.Sub(s.standbyAt) > standbyFresh:
		return false, fmt.Sprintf("standby: no report for %s", human(now.Sub(s.standbyAt)))
	case s.standbyErr != "":
		return false, "standby: a takeover would fail: " + s.standbyErr
	}
	return true, "standing by (or taking the initial snapshot): PostgreSQL and Kafka answer"
}

// Live reports whether the relay's process works, and why not in one line.
// It is not live only when a WAL session streams and its loop has sent no
// progress report for Config.LiveStaleAfter: the loop reports with every
// status update whatever Kafka or PostgreSQL do (a server that stops
// answering ends the session), so that silence means the loop itself is
// stuck, which a restart mends and nothing else reports. Everything a
// restart does not mend (Kafka down, a slot lost, a standby) is readiness'
// business, and keeps the process live. The poll source, whose claim waits
// for Kafka without reporting, is always live.
func (m *Metrics) Live() (live bool, reason string) {
	if m.cfg.LiveStaleAfter <= 0 {
		return true, "ok"
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.st
	if !s.streaming || s.poll.active {
		return true, "ok"
	}
	last, what := s.lastAdvance, "none this session"
	if s.haveProgress {
		last, what = s.progressAt, "last "+human(now.Sub(s.progressAt))+" ago"
	}
	if quiet := now.Sub(last); quiet > m.cfg.LiveStaleAfter {
		return false, fmt.Sprintf("stuck: the relay's loop has sent no progress report for %s (%s; metrics.live.stale.after %s), though it reports with every status update: restart the process", human(quiet), what, m.cfg.LiveStaleAfter)
	}
	return true, "ok"
}

// human rounds a duration for a reason line.
func human(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Handler serves /metrics, /healthz, /readyz and /rolloutz (and a short
// index at /).
func (m *Metrics) Handler() http.Handler { return m.handler }

func (m *Metrics) newHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		Registry:            reg, // counts its own errors there
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := m.Live(); !ok {
			text(w, http.StatusServiceUnavailable, reason)
			return
		}
		text(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, reason := m.Ready()
		if ok {
			text(w, http.StatusOK, "ready: "+reason)
			return
		}
		text(w, http.StatusServiceUnavailable, reason)
	})
	mux.HandleFunc("GET /rolloutz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := m.Available(); !ok {
			text(w, http.StatusServiceUnavailable, reason)
			return
		}
		text(w, http.StatusOK, "available")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		text(w, http.StatusOK, "pgoutbox: /metrics /healthz /readyz /rolloutz")
	})
	return mux
}

func text(w http.ResponseWriter, code int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body+"\n")
}
