package relay_test

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollRelayRunIsReadyAndReportsItsClaims: the poll source's progress
// reaches the metrics, and so /readyz, through pgoutbox run's own observer
// chain (the durability audit wraps the metrics). It did not: the wrapper
// hid the optional interface the relay reports poll progress through, so
// every poll relay run by pgoutbox run turned not ready once
// metrics.ready.stale.after had passed (firing PgoutboxNoReadyReplica for
// good), with its claims, buckets and instances at 0 (an observability
// prober). Tests that gave the relay the metrics directly could not see it.
func TestPollRelayRunIsReadyAndReportsItsClaims(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 71)
	c := env.NewConsumer(t, f.topics)
	logPath := filepath.Join(t.TempDir(), "poll.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, pgoutboxBinary(t), []string{"run"},
		f.pollEnviron("PGOUTBOX_METRICS_LISTEN=127.0.0.1:0", "PGOUTBOX_METRICS_READY_STALE_AFTER=2s"), lf, logPath)
	addr := p.metricsAddr(t)
	started := time.Now()
	writeEvents(t, w, 20, 100)
	waitAll(t, c, w, time.Minute)
	// Past the staleness window, with claims ending (empty ones too).
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		if time.Since(started) < 3*time.Second {
			return false, "not yet past ready.stale.after"
		}
		code, body := readyz(t, addr)
		if code != http.StatusOK {
			return false, "/readyz " + strconv.Itoa(code) + " " + body
		}
		m := scrapeSums(t, addr)
		for _, name := range []string{"pgoutbox_poll_claims_total", "pgoutbox_poll_buckets_owned", "pgoutbox_poll_instances"} {
			if m[name] <= 0 {
				return false, name + " is 0"
			}
		}
		if m["pgoutbox_poll_rows_published_total"] < float64(w.Events()) {
			return false, "pgoutbox_poll_rows_published_total below the events published"
		}
		return true, ""
	})
	p.terminate(t, time.Minute)
}

// scrapeSums reads the process's /metrics: each metric's value summed
// over its series.
func scrapeSums(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		name := line[:sp]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		if v, err := strconv.ParseFloat(line[sp+1:], 64); err == nil {
			out[name] += v
		}
	}
	return out
}
