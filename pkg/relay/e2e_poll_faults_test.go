package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// The WAL source's delivery, SIGKILL, Kafka-down and SIGTERM tests, run
// against the poll source with four instances of the binary at once. make
// test runs them as they stand; make test-faults runs the longer forms
// (PGOUTBOX_FAULTS=full: 30 SIGKILLs, Kafka down 2 minutes) and adds their
// rows to its report.

// pollGroup is the four binaries relaying one table.
type pollGroup struct {
	t     *testing.T
	f     *fixture
	procs []*process
	logs  []string
	extra []string
	// kills are the times of the SIGKILLs, for explaining duplicates.
	kills []time.Time
	// running counts the instances alive; peak is the largest peak
	// resident set seen of one, before it exited.
	running int
	peak    int64
	// started is when the group was made, for the report's wall time.
	started time.Time
}

// startPollFaults is the set-up of a poll fault scenario: a poll fixture
// of three partitions, its writer (seeded), a consumer of its topics and
// four instances relaying.
func startPollFaults(t *testing.T, env *testenv.Env, seed uint64) (*fixture, *outboxtest.Writer, *testenv.Consumer, *pollGroup) {
	t.Helper()
	f := newPollFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, seed)
	c := env.NewConsumer(t, f.topics)
	return f, w, c, startPollGroup(t, f, 4)
}

func startPollGroup(t *testing.T, f *fixture, n int, extra ...string) *pollGroup {
	g := &pollGroup{t: t, f: f, procs: make([]*process, n), extra: extra, started: time.Now()}
	for i := range n {
		g.start(i)
	}
	f.waitBalanced(t, n, 64)
	return g
}

// start starts instance i (again) and waits until it is one of the table's
// instances.
func (g *pollGroup) start(i int) {
	t := g.t
	g.running++
	logPath := filepath.Join(t.TempDir(), fmt.Sprintf("pgoutbox-%d-%d.log", i, len(g.logs)))
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	g.procs[i] = startProcess(t, pgoutboxBinary(t), []string{"run"}, g.f.pollEnviron(g.extra...), lf, logPath)
	g.logs = append(g.logs, logPath)
	g.waitMembers()
}

// waitMembers waits until the instances the table shows are those alive:
// a killed instance's session is gone once the server noticed.
func (g *pollGroup) waitMembers() {
	testenv.Eventually(g.t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		n := len(g.f.pollMembers(g.t))
		return n == g.running, fmt.Sprintf("%d instances, want %d", n, g.running)
	})
}

// kill SIGKILLs instance i and waits for it to exit.
func (g *pollGroup) kill(i int) {
	g.peakRSS()
	g.kills = append(g.kills, time.Now())
	if err := g.procs[i].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		g.t.Fatal(err)
	}
	g.procs[i].wait(g.t, 30*time.Second)
	g.running--
	g.waitMembers()
}

// peakRSS is the largest peak resident set of an instance so far.
func (g *pollGroup) peakRSS() int64 {
	for _, p := range g.procs {
		g.peak = max(g.peak, p.peakRSS())
	}
	return g.peak
}

// terminate SIGTERMs every instance at once and requires each to exit 0.
func (g *pollGroup) terminate() {
	g.peakRSS()
	for _, p := range g.procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			g.t.Fatal(err)
		}
	}
	for i, p := range g.procs {
		if code := p.wait(g.t, time.Minute); code != 0 {
			g.t.Fatalf("instance %d: SIGTERM: exit code %d, want 0", i, code)
		}
	}
}

// explainDuplicates checks every duplicate the way the poll source allows
// them: a row is delivered again only when the claim that first delivered
// it did not commit, so its (final) published_at lies after a SIGKILL that
// came after its first delivery, or at most killedRequestLag before it (the
// killed instance's last request, appended after its death). It returns
// how many duplicates there were.
func (g *pollGroup) explainDuplicates(msgs []outboxtest.Delivered) int {
	t := g.t
	byID := map[string][]outboxtest.Delivered{}
	for _, m := range msgs {
		byID[m.ID] = append(byID[m.ID], m)
	}
	var dups []string
	first := map[string]time.Time{}
	for id, ds := range byID {
		if len(ds) < 2 {
			continue
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i].Offset < ds[j].Offset })
		dups = append(dups, id)
		first[id] = ds[0].Timestamp
	}
	if len(dups) == 0 {
		return 0
	}
	rows, err := g.f.checkDB.Query(context.Background(), "SELECT id::text, published_at FROM outbox WHERE id::text = ANY($1)", dups)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id string
		var published *time.Time
		if err := rows.Scan(&id, &published); err != nil {
			t.Fatal(err)
		}
		n++
		if published == nil {
			t.Errorf("duplicated row %s is not marked published", id)
			continue
		}
		explained := false
		for _, k := range g.kills {
			// A killed instance's last produce request, already in its
			// socket's send buffer, still reaches the broker and is appended
			// after the kill (seen once: a batch of 16 rows appended after
			// the rebalance that followed the kill, and after their final
			// claim had begun): the first delivery may trail the kill. published_at is the final
			// claim's transaction start, after the kill released the rows.
			if !k.Before(first[id].Add(-killedRequestLag)) && !published.Before(k.Add(-time.Millisecond)) {
				explained = true
			}
		}
		if !explained {
			t.Errorf("row %s was delivered again although no SIGKILL came between its first delivery (%s) and its publication (%s)",
				id, first[id].Format(time.RFC3339Nano), published.Format(time.RFC3339Nano))
		}
	}
	if n != len(dups) {
		t.Errorf("%d duplicated ids, %d found in the table", len(dups), n)
	}
	return sumDups(byID)
}

// killedRequestLag bounds how long after a SIGKILL the killed instance's
// last produce request can still be appended by the broker.
const killedRequestLag = 2 * time.Second

func sumDups(byID map[string][]outboxtest.Delivered) int {
	n := 0
	for _, ds := range byID {
		n += len(ds) - 1
	}
	return n
}

// TestPollSIGKILLWithFourInstancesLosesNothing kills one of four instances
// ten times (thirty in the full form) while a writer is busy. Every other time the others must take
// its buckets over and carry on without it before it comes back. Nothing
// may be lost or published out of order per key, nothing rolled back
// published, and a duplicate only of a row whose claim had not committed.
func TestPollSIGKILLWithFourInstancesLosesNothing(t *testing.T) {
	env := testenv.Require(t)
	f, w, c, g := startPollFaults(t, env, 31)
	bw := startWriter(w, pick(4000, 12000))
	kills := pick(10, 30)
	for round := 0; round < kills; round++ {
		waitDelivered(t, c, c.Len()+500+97*round, 90*time.Second, bw, fmt.Sprintf("round %d", round))
		victim := round % 4
		g.kill(victim)
		if round%2 == 1 {
			// The three others own every bucket between them, and events
			// keep arriving without the victim.
			f.waitBalanced(t, 3, 64)
			waitDelivered(t, c, c.Len()+300, 90*time.Second, bw, fmt.Sprintf("round %d, without instance %d", round, victim))
		}
		g.start(victim)
	}
	bw.Stop(t)
	waitAll(t, c, w, 3*time.Minute)
	g.terminate()
	msgs := delivered(drain(t, c, f))
	rep := outboxtest.Check(w.Committed, w.RolledBack, msgs, nil)
	rep.Unexplained = nil // the WAL source's explanation, by LSN: explainDuplicates is the poll source's
	dups := g.explainDuplicates(msgs)
	t.Logf("%d SIGKILLs among 4 instances, %d transactions: %s; every duplicate explained by a kill (%d)", kills, w.Txns, rep, dups)
	report(t, rep, time.Since(g.started), g.peakRSS())
	requireNoLoss(t, "after SIGKILLs", rep)
	if n := f.unpublished(t); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
}

// TestPollKafkaDownWithFourInstancesHoldsTheRowsAndRecovers stops Kafka for
// 30 s (2 minutes in the full form) while four instances relay: no row written meanwhile may be marked
// published, no failed attempt is counted (a broker outage is retriable),
// memory stays bounded, and afterwards everything arrives in order.
func TestPollKafkaDownWithFourInstancesHoldsTheRowsAndRecovers(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f, w, c, g := startPollFaults(t, env, 32)
	ctx := context.Background()
	writeEvents(t, w, 2000, 3000)
	waitAll(t, c, w, 2*time.Minute)

	env.KafkaStop(t, "TERM")
	stopped := time.Now()
	written := len(w.Committed)
	var maxRSS int64
	tick := time.NewTicker(20 * time.Millisecond) // a write rate, not synchronisation
	defer tick.Stop()
	for time.Since(stopped) < pick(30*time.Second, 2*time.Minute) && w.Txns < 100000 {
		<-tick.C
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
		var published int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND created_at >= $1", stopped).Scan(&published); err != nil {
			t.Fatal(err)
		}
		if published > 0 {
			t.Fatalf("%d rows written while Kafka is down are marked published", published)
		}
		maxRSS = max(maxRSS, g.peakRSS())
	}
	if maxRSS > 128<<20 {
		t.Fatalf("peak RSS %d MB while Kafka was down", maxRSS>>20)
	}
	t.Logf("Kafka down %s; %d events written meanwhile; peak RSS %d MB", time.Since(stopped).Round(time.Second), len(w.Committed)-written, maxRSS>>20)
	started := time.Now()
	env.KafkaStart(t)
	back := time.Now()
	waitAll(t, c, w, 3*time.Minute)
	t.Logf("Kafka back after %s; every event delivered %s later", back.Sub(started).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	g.terminate()
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), nil)
	report(t, rep, time.Since(g.started), maxRSS)
	requireNoLoss(t, "after the Kafka outage", rep)
	var attempted int
	if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE attempts > 0").Scan(&attempted); err != nil {
		t.Fatal(err)
	}
	if attempted != 0 {
		t.Fatalf("%d rows count failed attempts: a broker outage must not count", attempted)
	}
}

// TestPollSIGTERMWithFourInstancesRepeatsNothing stops all four instances
// with SIGTERM under load, starts four again, and every event arrives
// exactly once.
func TestPollSIGTERMWithFourInstancesRepeatsNothing(t *testing.T) {
	env := testenv.Require(t)
	f, w, c, g := startPollFaults(t, env, 33)
	bw := startWriter(w, 2000)
	waitDelivered(t, c, 1000, 60*time.Second, bw, "before SIGTERM")
	peak := g.peakRSS()
	g.terminate()
	bw.Stop(t)
	g2 := startPollGroup(t, f, 4)
	waitAll(t, c, w, 2*time.Minute)
	peak = max(peak, g2.peakRSS())
	g2.terminate()
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), nil)
	report(t, rep, time.Since(g.started), peak)
	if !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("after SIGTERM and restart: %s", rep)
	}
}
