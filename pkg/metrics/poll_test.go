package metrics_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/metrics"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestPollSourceGaugesAndCounters: the claim loop's reports and the
// backlog reads set the poll source's series.
func TestPollSourceGaugesAndCounters(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	m := h.m
	m.SessionStarted(0)
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 4, Owned: 16, Buckets: 64, Claimed: 10, Published: 9, Failed: 1, Committed: true})
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 4, Owned: 16, Buckets: 64, InFlightRecords: 7})
	m.ObserveBacklog("public.outbox", poll.Backlog{Unpublished: 1234, Attempted: 3, OldestAge: 42 * time.Second, OldestKnown: true})
	m.CleanedUp(500)
	f := scrape(t, h.srv.URL)
	f.wantValues(t, map[string]float64{
		"pgoutbox_outbox_unpublished_rows":               1234,
		"pgoutbox_outbox_oldest_unpublished_age_seconds": 42,
		"pgoutbox_outbox_failed_rows":                    3,
		"pgoutbox_poll_instances":                        4,
		"pgoutbox_poll_buckets_owned":                    16,
		"pgoutbox_poll_claims_total":                     1,
		"pgoutbox_poll_rows_published_total":             9,
		"pgoutbox_poll_failed_attempts_total":            1,
		"pgoutbox_poll_cleanup_deleted_rows_total":       500,
		"pgoutbox_inflight_records":                      7,
	})
}

// TestPollSourceReadiness: ready while claims end and the backlog is
// young; 503 with the reason when the oldest unpublished row is too old,
// when Kafka holds a batch past ready.stale.after, or when no session runs.
func TestPollSourceReadiness(t *testing.T) {
	cfg := metrics.DefaultConfig()
	cfg.ReadyStaleAfter, cfg.ReadyBacklogMaxAge = 30*time.Second, time.Minute
	h := newHarness(t, cfg)
	m, clk := h.m, h.clk
	ready := func(want bool, reason string) {
		t.Helper()
		code, body := get(t, h.srv.URL+"/readyz")
		if (code == http.StatusOK) != want || !strings.Contains(body, reason) {
			t.Fatalf("/readyz %d %q; want ready=%v with %q", code, body, want, reason)
		}
	}
	m.SessionStarted(0)
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 2, Owned: 32, Buckets: 64, Committed: true})
	ready(true, "polling public.outbox")
	m.ObserveBacklog("public.outbox", poll.Backlog{Unpublished: 10, OldestAge: 5 * time.Second, OldestKnown: true})
	ready(true, "32 of 64 buckets owned, 2 instances")

	// Kafka holds the batch: no claim ends.
	clk.Advance(20 * time.Second)
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 2, Owned: 32, Buckets: 64, InFlightRecords: 100})
	ready(true, "last claim ended 20s ago")
	clk.Advance(15 * time.Second)
	ready(false, "kafka: 100 records unacknowledged")

	// The claim ends; then the backlog grows old.
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 2, Owned: 32, Buckets: 64, Committed: true})
	ready(true, "polling")
	m.ObserveBacklog("public.outbox", poll.Backlog{Unpublished: 5000, Attempted: 1, OldestAge: 61 * time.Second, OldestKnown: true})
	ready(false, "backlog: the oldest unpublished row of public.outbox was written 1m1s ago")
	m.ObserveBacklog("public.outbox", poll.Backlog{Unpublished: 0, OldestKnown: true})
	ready(true, "polling")

	// The backlog reads fail from here on. The last reading counts while
	// it is fresh.
	m.ObserveBacklog("public.outbox", poll.Backlog{Unpublished: 3, OldestAge: 61 * time.Second, OldestKnown: true})
	clk.Advance(11 * time.Second)
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 2, Owned: 32, Buckets: 64, Committed: true})
	ready(false, "was written 1m1s ago")
	// Past three read intervals and ready.stale.after, the reading is not
	// used: neither its old row (published since, perhaps) nor, below, a
	// young one.
	clk.Advance(20 * time.Second)
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 2, Owned: 32, Buckets: 64, Committed: true})
	ready(true, "backlog unknown, last read 31s ago")
	m.ObserveBacklog("public.outbox", poll.Backlog{Unpublished: 0, OldestKnown: true})
	ready(true, "instances")

	m.SessionEnded(errors.New("connection reset"))
	ready(false, "not streaming")
}
