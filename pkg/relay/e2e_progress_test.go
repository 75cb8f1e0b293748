package relay_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// progressRecorder keeps the Progress snapshots a relay reports.
type progressRecorder struct {
	relay.NopObserver
	mu  sync.Mutex
	all []relay.Progress
}

func (p *progressRecorder) Progress(pr relay.Progress) {
	p.mu.Lock()
	p.all = append(p.all, pr)
	p.mu.Unlock()
}

// TestCatchUpReportsHowFarBehindAndWhenDone: after a restart with a backlog,
// the relay logs at a steady interval how far behind it is, its rate and an
// estimate of the time left, reports the same numbers (which the metrics
// export), and says when it has caught up.
func TestCatchUpReportsHowFarBehindAndWhenDone(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	cfg := f.config()
	cfg.Relay.ProgressInterval = 200 * time.Millisecond
	cfg.Postgres.PublicationCheckInterval = 100 * time.Millisecond
	// Create the slot, then write the backlog while nothing streams.
	p := runInProcess(t, cfg)
	f.waitStreaming(t)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 60; i++ {
		f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT gen_random_uuid(), $1, (g % 17)::text, 'T', json_build_object('pad', repeat('x', 300)) FROM generate_series(1, 1000) g`,
			f.shape.AggregateTypes[i%3])
	}
	core, logs := observer.New(zapcore.InfoLevel)
	rec := &progressRecorder{}
	stop := runRelayLog(t, cfg, zap.New(core), relay.WithObserver(rec))
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		return logs.FilterMessage("caught up").Len() > 0, "no \"caught up\" line"
	})
	lines := logs.FilterMessage("catching up").All()
	if len(lines) < 2 {
		t.Fatalf("%d \"catching up\" lines, want a steady series", len(lines))
	}
	first := lines[0].ContextMap()
	for _, k := range []string{"behind_bytes", "last_commit_age", "rate_bytes_per_second", "estimated_time_left", "received_lsn", "server_lsn"} {
		if _, ok := first[k]; !ok {
			t.Errorf("progress line lacks %s: %v", k, first)
		}
	}
	if b, _ := first["behind_bytes"].(int64); b < 1<<20 {
		t.Errorf("first line says %d bytes behind, want the backlog's megabytes", b)
	}
	last := lines[len(lines)-1].ContextMap()
	if lb, fb := last["behind_bytes"].(int64), first["behind_bytes"].(int64); lb >= fb {
		t.Errorf("behind_bytes went from %d to %d: not moving", fb, lb)
	}
	// Caught up is a report of 0 bytes behind after the reports with a
	// rate: waited for, since the line comes from the progress interval
	// and the reports from status updates, and not necessarily the last
	// report: WAL is the cluster's, and tests of other packages writing
	// into their own databases put the relay behind again by what it has
	// not read of theirs yet.
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		sawRate, caught := false, false
		for _, pr := range rec.all {
			sawRate = sawRate || (pr.Behind > 0 && pr.CatchUpRate > 0)
			caught = caught || (sawRate && pr.Behind == 0)
		}
		return sawRate && caught, fmt.Sprintf("Progress reported a rate while behind: %v; 0 bytes behind after it: %v (%d reports)", sawRate, caught, len(rec.all))
	})
}
