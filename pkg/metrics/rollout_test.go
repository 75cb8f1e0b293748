package metrics_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/pkg/metrics"
)

// TestRolloutzCountsOnlyAStandbyThatCouldTakeOver: the chart's readiness
// probe. A standby is never ready (/readyz), so the chart probed /healthz,
// and a standby with a wrong kafka.brokers stood by as healthy as any: a
// rolling update replaced the working pods with it, and the stream stopped
// at the takeover with every probe passing (a Kubernetes review). /rolloutz
// is 200 for a ready instance and for a standby whose last check of what a
// takeover needs passed, recently; 503 for a standby whose check failed,
// one whose reports stopped, and an instance that is neither.
func TestRolloutzCountsOnlyAStandbyThatCouldTakeOver(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	want := func(code int, snippet string) {
		t.Helper()
		got, body := get(t, h.srv.URL+"/rolloutz")
		if got != code || !strings.Contains(body, snippet) {
			t.Fatalf("/rolloutz: %d %q; want %d with %q", got, body, code, snippet)
		}
	}
	want(503, "neither streaming nor standing by: no session has started")
	h.m.StandingBy(errors.New("relay: standby: kafka.brokers [127.0.0.1:1]: no broker answered"))
	want(503, "a takeover would fail: relay: standby: kafka.brokers")
	if got := gaugeValue(t, h, "pgoutbox_standby_available"); got != 0 {
		t.Fatalf("pgoutbox_standby_available = %v; want 0", got)
	}
	h.m.StandingBy(nil)
	want(200, "available")
	// Not ready, and /readyz says why (it said "no session has started").
	if code, body := get(t, h.srv.URL+"/readyz"); code != 503 || !strings.Contains(body, "standing by") {
		t.Fatalf("/readyz of a standby: %d %q, want 503 saying it stands by", code, body)
	}
	if got := gaugeValue(t, h, "pgoutbox_standby_available"); got != 1 {
		t.Fatalf("pgoutbox_standby_available = %v; want 1", got)
	}
	h.clk.Advance(2 * time.Minute)
	want(503, "standby: no report for 2m0s")
	h.m.StandingBy(nil)
	want(200, "available")
	// The takeover: streaming and ready counts; a session that failed
	// before streaming is no standby any more.
	h.m.SessionStarted(0x1000)
	want(200, "available")
	h.m.SessionEnded(errors.New("kafka: no broker answered"))
	want(503, "neither streaming nor standing by: session ended")
	if code, _ := get(t, h.srv.URL+"/readyz"); code != 503 {
		t.Fatalf("/readyz of a failed session: %d", code)
	}
}

func gaugeValue(t *testing.T, h *harness, name string) float64 {
	t.Helper()
	return scrape(t, h.srv.URL).value(name)
}

// TestRolloutzCountsAPollSourceFromTheStart: the poll source's instances
// all claim; /rolloutz counts one as available before its first report,
// as /healthz did, so that a rollout to the poll source (whose new pods
// wait for the WAL relay or another destination's instances to leave)
// does not wait for itself.
func TestRolloutzCountsAPollSourceFromTheStart(t *testing.T) {
	m, err := metrics.New(prometheus.NewRegistry(), metrics.DefaultConfig(), metrics.WithPollSource())
	if err != nil {
		t.Fatal(err)
	}
	if ok, reason := m.Available(); !ok {
		t.Fatalf("a poll source before its first report: %s", reason)
	}
}
