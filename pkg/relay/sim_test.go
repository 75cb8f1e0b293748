package relay

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// The deterministic harness runs the relay's real loop (Relay.Run, the
// session, the checkpoint tracker, the router, the topic gate) against a
// scripted walsender, a scripted producer, scripted topic and catalog
// checks and a fake clock, all driven by one seed. A real server cannot
// produce these paths on demand: keepalives in the middle of a transaction,
// a commit record that begins exactly where a non-transactional message
// ends, acknowledgements out of order or late by minutes, a broker that
// stops answering, a batch refused as too large, a connection that drops
// between a status update and the next message.
//
// Everything the loop waits on goes through the fake clock and the fakes,
// and each of its waits hands control to the harness, which takes exactly
// one action (returns a WAL message, delivers acknowledgements, answers a
// check, lets the deadline pass, drops the connection, requests a stop):
// so a seed replays exactly. The invariants, checked as the run goes and at
// its end:
//
//  1. A status update never confirms a position at which PostgreSQL would
//     skip (on restart) a transaction or message whose records Kafka has
//     not acknowledged: the model applies PostgreSQL's own skip rule
//     (commit record, or message record, beginning before the position).
//  2. While a stream is open, status updates go out at least every
//     postgres.status.update.interval, whatever the producer does.
//  3. A stop request ends Run within relay.shutdown.timeout.
//  4. The loop never wakes for nothing over and over (a busy loop).
//  5. Nothing is lost: after the faulty run, a clean run finishes the
//     stream, and every committed event reached Kafka (or the dead-letter
//     topic) at least once; per key, first deliveries are in commit order
//     (except for a key whose record failed after its retries, where
//     sarama may have written later records first).
//  6. Nothing is confirmed past the WAL position where the catalog changed.
//  7. A PostgreSQL shutdown is not held up: once the walsender waits for
//     its client to confirm the end of WAL, the client confirms it or
//     ends the stream within simShutdownWait (and invariants 1, 6 and F1
//     hold meanwhile: the shutdown lifts no cap).
//
// make test runs simSeeds seeds (see -sim.seeds); make fuzz runs more. A
// failing seed is printed with the command that replays it; seeds worth
// keeping are listed in testdata/sim-seeds.txt and run every time.

var (
	simSeeds = flag.Int("sim.seeds", 2000, "number of seeds the deterministic relay harness runs")
	simSeed  = flag.Uint64("sim.seed", 0, "run only this seed of the deterministic relay harness (0: all)")
	simFirst = flag.Uint64("sim.first", 1, "first seed of the deterministic relay harness")
	simLog   = flag.Bool("sim.log", false, "log every step of the deterministic relay harness")
	simTime  = flag.Duration("sim.duration", 3*time.Minute, "bound on the deterministic relay harness's real time")
)

func TestSimulatedRelayKeepsItsInvariants(t *testing.T) {
	runSimSeeds(t, simSeedList(t), runSim)
}

// runSimSeeds runs run for each seed until -sim.time is spent, and stops
// after five failing seeds; each failure says how to replay its seed.
func runSimSeeds(t *testing.T, seeds []uint64, run func(seed uint64, verbose bool, logf func(string, ...any)) error) {
	deadline := time.Now().Add(*simTime)
	failed := 0
	for i, seed := range seeds {
		if time.Now().After(deadline) {
			t.Logf("stopped after %d of %d seeds: time bound reached", i, len(seeds))
			break
		}
		if err := run(seed, *simLog, t.Logf); err != nil {
			failed++
			t.Errorf("seed %d: %v\n\treplay: go test ./pkg/relay -run '^%s$' -sim.seed=%d -sim.log", seed, err, t.Name(), seed)
			if failed >= 5 {
				t.Fatal("stopping after 5 failing seeds")
			}
		}
	}
}

func simSeedList(t *testing.T) []uint64 {
	if *simSeed != 0 {
		return []uint64{*simSeed}
	}
	var seeds []uint64
	if b, err := os.ReadFile("testdata/sim-seeds.txt"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			var s uint64
			if _, err := fmt.Sscan(strings.Fields(line)[0], &s); err != nil {
				t.Fatalf("testdata/sim-seeds.txt: %q: %v", line, err)
			}
			seeds = append(seeds, s)
		}
	}
	for i := 0; i < *simSeeds; i++ {
		seeds = append(seeds, *simFirst+uint64(i))
	}
	return seeds
}

// ---------------------------------------------------------------- the WAL

// simEntry is one thing the walsender sends, in decoding order: a
// transaction (at its commit), a non-transactional message, or other WAL.
type simEntry struct {
	// A transaction: its commit record is [commitStart, commitEnd).
	// A non-transactional message: its record is [commitStart, commitEnd)
	// and it has one event. Other WAL (transactions on tables that are not
	// published): no events.
	kind        byte // 't' transaction, 'm' non-transactional message, 'o' other WAL
	commitStart checkpoint.LSN
	commitEnd   checkpoint.LSN
	events      []simEvent
}

type simEvent struct {
	id, key, topic string
	message        bool   // sent as a transactional message, not a row
	prefix         string // a message's prefix when not the outbox's (skipped; no record)
	update         bool   // an UPDATE (dropped by the router; no record)
	seq            int    // order in the WAL
}

func (e simEvent) emits() bool { return !e.update && e.prefix == "" }

// simWorld is one seed's whole scenario and the model of the servers.
type simWorld struct {
	rng     *rand.Rand
	log     func(string, ...any)
	verbose bool
	now     time.Time
	cfg     Config
	wal     []simEntry
	// server side
	confirmed  checkpoint.LSN // the slot's confirmed_flush_lsn
	fence      checkpoint.LSN // the state row's stopped_lsn
	catChange  checkpoint.LSN // WAL position where the catalog changes (0: never)
	missing    string         // a topic that never exists (0: none)
	failAfter  bool           // records may fail after their retries
	tooLarge   bool           // batches may be refused as too large
	delivered  map[string]bool
	log2       map[string][]string // key → event ids in the order Kafka appended them
	failedKeys map[string]bool
	dlq        map[string]bool
	// the relay's current session
	stream    *simStream
	prod      *simProducer
	checker   *simChecker
	watcher   *simWatcher
	ctx       context.Context
	cancel    context.CancelFunc
	force     chan struct{}
	stopAt    time.Time
	steps     int
	spurious  int
	lastTimer *simTimer
	faulty    bool // the first run: faults on
	// catalogStopped: the relay stopped because the catalog changed.
	catalogStopped bool
	err            error
	frozen         time.Time // the broker answers nothing until then
	// shutdown: PostgreSQL shuts down (fast): new connections are refused
	// with 57P03, and once the walsender has sent what was written it asks
	// for replies until the client confirms it all or goes; shutdownAsked
	// is when it first asked. The server is back at the next Open.
	shutdown      bool
	shutdownAsked time.Time
	// Exactly-once mode (sim_eos_test.go): Kafka's transactions, what is
	// visible to read_committed, and the stored position.
	eos       bool
	txnProd   *simTxnProducer
	visible   map[string]bool
	stored    checkpoint.LSN
	storedSet bool
	// storedAt is the time written with the stored position; commitTimes
	// the commit time of each transaction, by its commit record's start,
	// fixed when the walsender first sends it.
	storedAt    time.Time
	commitTimes map[checkpoint.LSN]time.Time
	// storedLast is the last transaction the stored record names.
	storedLast kafka.TxnMark
	// logger, when set, is the relay's.
	logger *zap.Logger
	// maxPending, when set, is the relay's cap on pending transactions;
	// holdAck's acknowledgement is held back until holdUntil.
	maxPending int
	holdAck    string
	holdUntil  time.Time
	// maxProducerRecords, when set, is the relay's.
	maxProducerRecords int64
	// sentWhileHeld counts the transactions the walsender sent while
	// holdAck's acknowledgement was held back.
	sentWhileHeld int
	// advanceAtOpen: someone advances the slot half way through the WAL
	// between the relay's Prepare and its stream's start (once).
	advanceAtOpen bool
	// wrap, when set, wraps the backend a run gives the relay (a test's
	// stand-in for one server behaviour).
	wrap func(backend) backend
	// movedUnderStart: the slot was moved between a Prepare and its
	// stream's start; preparesJudged: each Prepare's HoldOnFencePassed.
	movedUnderStart bool
	preparesJudged  []bool
	// refuse names an event Kafka refuses as too large, alone or in a
	// batch (not on the dead-letter topic).
	refuse string
	// staleRefusals counts, per event, how many more times the producer
	// refuses it for a partition its metadata lacks (-1: always); with
	// staleAtSend, at Send, as sarama's partitioner does, before any
	// request.
	staleRefusals map[string]int
	staleAtSend   bool
}

func (w *simWorld) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf(format, args...)
		w.logf("VIOLATION: %v", w.err)
	}
}

func (w *simWorld) logf(format string, args ...any) {
	if w.verbose {
		w.log("%s "+format, append([]any{w.now.Format("15:04:05.000")}, args...)...)
	}
}

// newSimWorld generates a seed's WAL and its faults.
func newSimWorld(seed uint64) *simWorld {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := &simWorld{rng: rng, now: time.Unix(1_700_000_000, 0), delivered: map[string]bool{}, log2: map[string][]string{},
		failedKeys: map[string]bool{}, dlq: map[string]bool{}}
	cfg := DefaultConfig()
	cfg.Postgres.DSN = "postgres://sim"
	cfg.Kafka.Brokers = []string{"sim:9092"}
	cfg.Relay.MaxInFlightRecords = 3 + rng.IntN(40)
	cfg.Relay.ShutdownTimeout = time.Duration(2+rng.IntN(30)) * time.Second
	cfg.Postgres.StatusInterval = time.Duration(200+rng.IntN(1800)) * time.Millisecond
	cfg.Messages.NonTransactional = "accept"
	if rng.IntN(2) == 0 {
		cfg.Relay.PoisonPolicy = "dead-letter"
		if rng.IntN(3) == 0 {
			w.missing = "outbox.event.Missing"
		}
	}
	w.failAfter = rng.IntN(4) == 0
	w.stored = simSlotStart
	w.tooLarge = rng.IntN(5) == 0
	w.cfg = cfg

	keys := []string{"k1", "k2", "k3", "k4", "k5"}
	types := []string{"Order", "Invoice", "Shipment"}
	if w.missing != "" {
		types = append(types, "Missing")
	}
	lsn := checkpoint.LSN(0x1000000)
	seq := 0
	n := 10 + rng.IntN(80)
	for i := 0; i < n; i++ {
		lsn += checkpoint.LSN(8 * (1 + rng.IntN(64)))
		switch r := rng.IntN(20); {
		case r == 0:
			w.wal = append(w.wal, simEntry{kind: 'o', commitStart: lsn, commitEnd: lsn + 48})
			lsn += 48
		case r <= 2:
			// A non-transactional message; half the time the next
			// transaction's commit record begins exactly where it ends.
			ev := simEvent{id: fmt.Sprintf("m%03d", seq), key: keys[rng.IntN(len(keys))], message: true, seq: seq}
			ev.topic = "outbox.event." + types[rng.IntN(len(types))]
			seq++
			start := lsn
			lsn += checkpoint.LSN(8 * (4 + rng.IntN(8)))
			w.wal = append(w.wal, simEntry{kind: 'm', commitStart: start, commitEnd: lsn, events: []simEvent{ev}})
			if rng.IntN(2) == 0 {
				lsn -= 8 * (1 + checkpoint.LSN(rng.IntN(2))) // overlapping gap: the next commit begins at lsn
				lsn = w.wal[len(w.wal)-1].commitEnd
				w.wal = append(w.wal, w.txn(rng, &seq, keys, types, lsn))
				lsn = w.wal[len(w.wal)-1].commitEnd
			}
		default:
			w.wal = append(w.wal, w.txn(rng, &seq, keys, types, lsn))
			lsn = w.wal[len(w.wal)-1].commitEnd
		}
	}
	if rng.IntN(6) == 0 && len(w.wal) > 4 {
		e := w.wal[len(w.wal)/2+rng.IntN(len(w.wal)/2)]
		w.catChange = e.commitStart
	}
	w.confirmed = simSlotStart
	return w
}

func (w *simWorld) txn(rng *rand.Rand, seq *int, keys, types []string, at checkpoint.LSN) simEntry {
	e := simEntry{kind: 't', commitStart: at, commitEnd: at + 32}
	rows := 1 + rng.IntN(4)
	if rng.IntN(15) == 0 {
		rows = 50 + rng.IntN(100) // bigger than the in-flight cap
	}
	for j := 0; j < rows; j++ {
		ev := simEvent{id: fmt.Sprintf("e%04d", *seq), key: keys[rng.IntN(len(keys))], seq: *seq}
		ev.topic = "outbox.event." + types[rng.IntN(len(types))]
		ev.message = rng.IntN(10) == 0
		ev.update = !ev.message && rng.IntN(25) == 0
		*seq++
		e.events = append(e.events, ev)
	}
	return e
}

// end is the end of the WAL.
func (w *simWorld) end() checkpoint.LSN { return w.wal[len(w.wal)-1].commitEnd }

// ---------------------------------------------------------------- the run

// runSim runs one seed: a run with faults that ends with a stop request,
// then a clean run that finishes the stream, then the final checks.
func runSim(seed uint64, verbose bool, logf func(string, ...any)) error {
	w := newSimWorld(seed)
	w.log, w.verbose = logf, verbose
	return w.play()
}

// play is the runs of one seed: the faulty one, the clean one, the final
// checks. A relay that stopped on a catalog change ends the seed there.
func (w *simWorld) play() error {
	w.faulty = true
	if err := w.run(); err != nil || w.err != nil {
		return errors.Join(w.err, err)
	}
	if w.catalogStopped {
		return nil
	}
	w.faulty = false
	if err := w.run(); err != nil || w.err != nil {
		return errors.Join(w.err, err)
	}
	if w.catalogStopped {
		return nil
	}
	return w.check()
}

// run starts a relay (a new process) and drives it until it returns.
func (w *simWorld) run() error {
	w.ctx, w.cancel = context.WithCancel(context.Background())
	defer w.cancel()
	w.force = make(chan struct{})
	w.stopAt = time.Time{}
	w.frozen = time.Time{}
	lg := zap.NewNop()
	if w.verbose {
		lg = zap.NewExample()
	}
	if w.logger != nil {
		lg = w.logger
	}
	var be backend = &simBackend{w: w}
	if w.wrap != nil {
		be = w.wrap(be)
	}
	r, err := New(w.cfg, lg, withBackend(be, &simClock{w}), WithForceStop(w.force))
	if err != nil {
		return err
	}
	if w.maxPending > 0 {
		r.maxPending = w.maxPending
	}
	if w.maxProducerRecords > 0 {
		r.maxProducerRecords = w.maxProducerRecords
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(w.ctx) }()
	var runErr error
	select {
	case runErr = <-done:
		w.logf("Run returned: %v", runErr)
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		return fmt.Errorf("Run did not return within 30 s of real time: the loop blocked outside the harness's waits\n%s", buf)
	}
	if !w.stopAt.IsZero() {
		if took := w.now.Sub(w.stopAt); took > w.cfg.Relay.ShutdownTimeout+100*time.Millisecond {
			w.fail("invariant 3: Run returned %s after the stop request; relay.shutdown.timeout is %s", took, w.cfg.Relay.ShutdownTimeout)
		}
	}
	switch {
	case runErr == nil:
	case errors.Is(runErr, replication.ErrCatalogChanged) && w.catChange != 0:
		// Expected once the catalog changed: the events after it are not
		// in the stream any more (invariant 6 was checked on the way).
		w.catalogStopped = true
	default:
		return fmt.Errorf("Run: %w", runErr)
	}
	return nil
}

// check is invariant 5, after the clean run.
func (w *simWorld) check() error {
	if w.eos {
		if err := w.checkNoDuplicates(); err != nil {
			return err
		}
	}
	var want []simEvent
	for _, e := range w.wal {
		for _, ev := range e.events {
			if ev.emits() {
				want = append(want, ev)
			}
		}
	}
	for _, ev := range want {
		if !w.delivered[ev.id] {
			return fmt.Errorf("invariant 5: event %s (key %s) was never acknowledged by Kafka (slot confirmed at %s, WAL end %s)",
				ev.id, ev.key, w.confirmed, w.end())
		}
	}
	first := map[string]map[string]bool{}
	for key, ids := range w.log2 {
		if w.failedKeys[key] && !w.eos {
			continue
		}
		first[key] = map[string]bool{}
		var order []string
		for _, id := range ids {
			if !first[key][id] {
				first[key][id] = true
				order = append(order, id)
			}
		}
		var commit []string
		for _, ev := range want {
			if ev.topic+"|"+ev.key == key && !w.dlq[ev.id] && slices.Contains(order, ev.id) {
				commit = append(commit, ev.id)
			}
		}
		order = slices.DeleteFunc(order, func(id string) bool { return w.dlq[id] })
		if !slices.Equal(order, commit) {
			return fmt.Errorf("invariant 5: key %s first delivered as %v, committed as %v", key, order, commit)
		}
	}
	return nil
}

// maySkip lists what PostgreSQL skips on restart at confirmed position f
// and has not been delivered: invariant 1.
func (w *simWorld) undelivered(f checkpoint.LSN) string {
	for _, e := range w.wal {
		if e.commitStart >= f {
			break
		}
		for _, ev := range e.events {
			if ev.emits() && !w.delivered[ev.id] {
				return fmt.Sprintf("event %s of the %c record at %s", ev.id, e.kind, e.commitStart)
			}
		}
	}
	return ""
}

// ---------------------------------------------------------------- harness steps

// act is the harness's move while the loop waits until deadline (the loop
// is in Receive when inReceive). It returns a WAL message to deliver, or
// nothing.
func (w *simWorld) act(deadline time.Time, inReceive bool, t *simTimer) (ev replication.Event, drop bool) {
	w.steps++
	if w.steps > 200_000 {
		w.fail("no end after %d steps (confirmed %s, fence %s, end %s, faulty %v)", w.steps, w.confirmed, w.fence, w.end(), w.faulty)
		w.requestStop()
		w.forceStop()
		if t != nil {
			t.fire()
		}
		return ev, true
	}
	w.checkStatusInterval()
	// A stop request once the work is done, or at random in the faulty run.
	if w.stopAt.IsZero() && ((w.faulty && w.rng.IntN(400) == 0) || w.caughtUp()) {
		w.requestStop()
		return
	}
	if !w.stopAt.IsZero() && w.faulty && w.rng.IntN(200) == 0 && w.now.Sub(w.stopAt) > time.Second {
		w.logf("second stop request")
		w.forceStop()
		return
	}
	frozen := w.now.Before(w.frozen)
	if w.faulty && !frozen && w.rng.IntN(300) == 0 {
		w.frozen = w.now.Add(time.Duration(10+w.rng.IntN(120)) * time.Second)
		w.logf("the broker freezes until %s", w.frozen.Format("15:04:05"))
		frozen = true
	}
	if inReceive && w.stream != nil && w.faulty && w.rng.IntN(250) == 0 {
		w.logf("connection drops")
		return ev, true
	}
	if inReceive && w.stream != nil && !w.stream.closed && w.faulty && !w.shutdown && w.rng.IntN(400) == 0 {
		w.shutdown = true
		w.logf("PostgreSQL begins a fast shutdown")
	}
	if w.shutdown && !w.shutdownAsked.IsZero() && w.stream != nil && !w.stream.closed && w.now.Sub(w.shutdownAsked) > simShutdownWait {
		w.fail("invariant 7: the walsender has waited %s for the end of WAL (%s) to be confirmed, and the stream is still open (confirmed %s): the relay holds PostgreSQL's shutdown up",
			w.now.Sub(w.shutdownAsked), w.stream.done, w.confirmed)
		w.shutdownAsked = time.Time{}
	}
	if !inReceive && (w.stream == nil || w.stream.closed) {
		// Between sessions: Run's backoff, which waits for its timer
		// or a stop only.
		w.advanceTo(deadline)
		t.fire()
		return
	}
	choices := []func() bool{
		func() bool { // a WAL message
			if !inReceive || w.stream == nil {
				return false
			}
			var ok bool
			ev, ok = w.stream.next()
			if ok {
				w.advance(time.Duration(w.rng.IntN(3)) * time.Millisecond)
			}
			return ok
		},
		func() bool { return !frozen && w.prod != nil && w.prod.deliver() },
		func() bool { return !frozen && w.checker != nil && w.checker.answer() },
		func() bool { return w.watcher != nil && w.watcher.answer() },
	}
	weights := []int{60, 25, 8, 7}
	if w.eos {
		choices = append(choices, func() bool { return !frozen && w.txnProd != nil && w.txnProd.answer() })
		weights = append(weights, 10)
	}
	for tries := 0; tries < 8; tries++ {
		i := pick(w.rng, weights)
		if choices[i]() {
			if i != 0 && inReceive {
				w.advance(time.Duration(w.rng.IntN(2)) * time.Millisecond)
			}
			return
		}
	}
	// A catalog check that is due is answered within a round trip, before
	// the deadline passes.
	if w.watcher != nil && w.watcher.answer() {
		return
	}
	// Nothing to do: let the deadline pass.
	w.advanceTo(deadline)
	if t != nil {
		t.fire()
	}
	return
}

// simShutdownWait bounds how long the relay may keep a walsender that
// waits for a shutdown: a catalog check on the interval (1 s) or asked
// for, its answer, the session's end.
const simShutdownWait = 10 * time.Second

func pick(rng *rand.Rand, weights []int) int {
	sum := 0
	for _, v := range weights {
		sum += v
	}
	n := rng.IntN(sum)
	for i, v := range weights {
		if n < v {
			return i
		}
		n -= v
	}
	return len(weights) - 1
}

func (w *simWorld) advance(d time.Duration) { w.now = w.now.Add(d) }

// forceStop is the second stop request (once).
func (w *simWorld) forceStop() {
	select {
	case <-w.force:
	default:
		close(w.force)
	}
}

func (w *simWorld) requestStop() {
	if w.stopAt.IsZero() {
		w.logf("stop requested")
		w.stopAt = w.now
		w.cancel()
	}
}

// caughtUp: everything is sent, acknowledged and confirmed; all but a tail
// shorter than fenceSlack whose events are all delivered (none, or ones a
// resend found in Kafka), which the fence may hold back (raising it would
// write WAL of its own).
func (w *simWorld) caughtUp() bool {
	return w.stream != nil && w.stream.pos >= len(w.stream.entries) && !w.faulty &&
		(w.confirmed >= w.end() || (w.end()-w.confirmed < fenceSlack && w.undelivered(w.end()+1) == ""))
}

// checkStatusInterval is invariant 2.
func (w *simWorld) checkStatusInterval() {
	if w.stream == nil || w.stream.closed {
		return
	}
	if late := w.now.Sub(w.stream.lastStatus); late > w.cfg.Postgres.StatusInterval+200*time.Millisecond {
		w.fail("invariant 2: no status update for %s (postgres.status.update.interval %s)", late, w.cfg.Postgres.StatusInterval)
	}
}

// ---------------------------------------------------------------- fakes

type simClock struct{ w *simWorld }

func (c *simClock) Now() time.Time { return c.w.now }

// NewTimer is how the loop waits (Run's backoff, the session's waits): the
// harness takes its move now, on the loop's goroutine.
func (c *simClock) NewTimer(d time.Duration) timer {
	w := c.w
	t := &simTimer{ch: make(chan time.Time, 1), at: w.now.Add(d)}
	if w.woke() {
		// The harness let the last timer fire and gave nothing else, yet
		// the loop came back without taking it: it woke for nothing.
		w.spurious++
		if w.spurious > 3 {
			w.fail("invariant 4: the loop woke %d times with nothing to do (a busy loop)", w.spurious)
			w.requestStop()
			w.forceStop()
		}
	}
	w.lastTimer = t
	w.act(t.at, false, t)
	return t
}

// woke reports whether the loop came back to wait although the harness's
// last move left what it delivered untouched.
func (w *simWorld) woke() bool {
	if t := w.lastTimer; t != nil && len(t.ch) > 0 {
		return true
	}
	return false
}

type simTimer struct {
	ch chan time.Time
	at time.Time
}

func (t *simTimer) C() <-chan time.Time { return t.ch }
func (t *simTimer) Stop() bool          { return true }
func (t *simTimer) fire() {
	select {
	case t.ch <- t.at:
	default:
	}
}

type simBackend struct {
	w *simWorld
	// opens counts the streams this relay opened: once it has streamed
	// from the slot, its own history judges the slot's position, and a
	// start must not hold cleanup by the fence (a PostgreSQL restart
	// would hold it for nothing).
	opens int
}

func (b *simBackend) Prepare(ctx context.Context, cfg replication.Config) (replication.Start, error) {
	w := b.w
	if cfg.HoldOnFencePassed != (b.opens == 0 || w.movedUnderStart) {
		w.fail("Prepare with HoldOnFencePassed=%v after %d streams opened (slot moved under a start: %v): only the first session, and one after another holder, judges the fence", cfg.HoldOnFencePassed, b.opens, w.movedUnderStart)
	}
	w.preparesJudged = append(w.preparesJudged, cfg.HoldOnFencePassed)
	w.movedUnderStart = false
	cat := replication.Catalog{CheckedAt: w.confirmed, Publication: 500, Insert: true, ViaRoot: true,
		Tables: []replication.TableInfo{{Name: "public.outbox", OID: 1001, Kind: 'r', Persistence: 'p', Published: true}}}
	return replication.Start{
		Slot:     replication.SlotState{Name: cfg.Slot, SlotType: "logical", Plugin: "pgoutput", ConfirmedFlushLSN: w.confirmed, WALStatus: "reserved"},
		Catalog:  cat,
		Identity: replication.ServerIdentity{SystemIdentifier: "1", Database: "sim", Timeline: 1},
	}, nil
}

func (b *simBackend) RecordSession(context.Context, replication.Config, replication.State) error {
	return nil
}

func (b *simBackend) ReadSlot(_ context.Context, cfg replication.Config) (replication.SlotState, time.Time, error) {
	return replication.SlotState{Name: cfg.Slot, SlotType: "logical", Plugin: "pgoutput", ConfirmedFlushLSN: b.w.confirmed, WALStatus: "reserved", Active: b.w.stream != nil}, b.w.now, nil
}

func (b *simBackend) WALEnd(context.Context, replication.Config) (checkpoint.LSN, error) {
	return b.w.end(), nil
}

func (b *simBackend) TimelineFork(context.Context, replication.Config, int32, int32) (checkpoint.LSN, bool, error) {
	return 0, false, nil
}

func (b *simBackend) Open(ctx context.Context, cfg replication.Config, start checkpoint.LSN) (stream, error) {
	w := b.w
	b.opens++
	if w.advanceAtOpen {
		w.advanceAtOpen = false
		w.movedUnderStart = true
		w.confirmed = w.wal[len(w.wal)/2].commitEnd
		w.logf("someone advanced the slot to %s before the stream started", w.confirmed)
	}
	s := &simStream{w: w, lastStatus: w.now, rels: map[string]*replication.Relation{}}
	// PostgreSQL's skip rule: a transaction whose commit record, or a
	// message whose record, begins before the confirmed position is not
	// sent again.
	for _, e := range w.wal {
		if e.commitStart >= w.confirmed {
			s.entries = append(s.entries, e)
		}
	}
	w.stream = s
	// A stream opens only once a shutting-down server is back.
	w.shutdown, w.shutdownAsked = false, time.Time{}
	w.logf("stream opened at %s (%d entries to send)", w.confirmed, len(s.entries))
	return s, nil
}

func (b *simBackend) NewProducer(ctx context.Context, cfg kafka.Config) (producer, error) {
	p := &simProducer{w: b.w, acks: make(chan kafka.Ack, cfg.AckBuffer), single: cfg.SingleRecordBatches}
	b.w.prod = p
	return p, nil
}

func (b *simBackend) NewTxnProducer(ctx context.Context, cfg kafka.Config, id kafka.SlotIdentity) (txnProducer, error) {
	w := b.w
	if !w.eos {
		return nil, errors.New("sim: exactly-once mode is off")
	}
	p := &simTxnProducer{simProducer: &simProducer{w: w, acks: make(chan kafka.Ack, cfg.AckBuffer), single: cfg.SingleRecordBatches},
		commits: make(chan kafka.CommitResult, 16), stored: w.stored, storedAt: w.storedAt, storedLast: w.storedLast, found: w.storedSet}
	w.prod, w.txnProd = p.simProducer, p
	return p, nil
}

func (b *simBackend) EnsureOffsetsTopic(context.Context, kafka.Config) error { return nil }

func (b *simBackend) CheckTopics(ctx context.Context, cfg kafka.Config, topics []string) ([]kafka.TopicState, error) {
	w := b.w
	if w.now.Before(w.frozen) {
		// A broker that accepts connections and does not answer holds
		// the request until the read timeout.
		w.advance(cfg.ReadTimeout)
		return nil, errors.New("sim: i/o timeout")
	}
	out := make([]kafka.TopicState, len(topics))
	for i, t := range topics {
		out[i] = kafka.TopicState{Topic: t, Partitions: 3}
	}
	return out, nil
}

func (b *simBackend) StartTopicChecker(cfg kafka.Config, wake func()) topicChecker {
	c := &simChecker{w: b.w, results: make(chan topicResult, 64)}
	b.w.checker = c
	return c
}

func (b *simBackend) StartCatalogWatcher(cfg replication.Config, instance string, _ *replication.Catalog, wake func()) catalogWatcher {
	c := &simWatcher{w: b.w, results: make(chan catalogResult, 4)}
	b.w.watcher = c
	// The session's state row, written at its start, fences it at the slot.
	b.w.fence = max(b.w.confirmed, simSlotStart)
	return c
}

// simStream is the walsender.
type simStream struct {
	w          *simWorld
	entries    []simEntry
	pos        int // next entry
	queue      []replication.Event
	lastStatus time.Time
	closed     bool
	rels       map[string]*replication.Relation
	sent       checkpoint.LSN // the end of the last entry taken up
	done       checkpoint.LSN // the end of the last entry sent whole
}

var simColumns = []string{"id", "aggregatetype", "aggregateid", "type", "payload"}
var simTypes = []uint32{25, 1043, 1043, 1043, 3802}

// next returns the next message of the stream, queuing the rest of an
// entry's messages; keepalives come now and then, also in the middle of a
// transaction (with a WAL end past its commit, as PostgreSQL sends them).
func (s *simStream) next() (replication.Event, bool) {
	w := s.w
	if w.shutdown && len(s.queue) == 0 {
		// WalSndDone: all that was written is sent (what comes after is
		// written once the server is back); the walsender asks for a
		// reply until its client confirms it all.
		if w.shutdownAsked.IsZero() {
			w.shutdownAsked = w.now
		}
		return replication.Event{Keepalive: &replication.Keepalive{WALEnd: s.done, ServerTime: w.now, ReplyRequested: true}}, true
	}
	for len(s.queue) == 0 {
		if s.pos >= len(s.entries) {
			if w.rng.IntN(3) == 0 {
				return s.keepalive(w.end()), true
			}
			return replication.Event{}, false
		}
		s.fill(s.entries[s.pos])
		s.pos++
	}
	if w.rng.IntN(12) == 0 {
		// Between transactions the WAL end is where the last one sent
		// ended; inside one it may be past its commit.
		end := s.done
		if h := s.queue[0]; h.Begin == nil && (h.Message == nil || h.Message.Transactional) {
			end = s.sent
		}
		return s.keepalive(end), true
	}
	ev := s.queue[0]
	s.queue = s.queue[1:]
	if len(s.queue) == 0 {
		s.done = s.sent
	}
	if w.verbose {
		w.logf("send %s", simDescribe(ev))
	}
	return ev, true
}

func (s *simStream) keepalive(end checkpoint.LSN) replication.Event {
	return replication.Event{Keepalive: &replication.Keepalive{WALEnd: end, ServerTime: s.w.now, ReplyRequested: s.w.rng.IntN(4) == 0}}
}

func (s *simStream) fill(e simEntry) {
	w := s.w
	if w.holdAck != "" && w.now.Before(w.holdUntil) {
		w.sentWhileHeld++
	}
	s.sent = e.commitEnd
	switch e.kind {
	case 'o':
		// Nothing is sent for a transaction on unpublished tables.
		s.done = e.commitEnd
		return
	case 'm':
		ev := e.events[0]
		s.queue = append(s.queue, replication.Event{WALStart: e.commitEnd, Message: &replication.Message{
			LSN: e.commitEnd, Prefix: cmp.Or(ev.prefix, "outbox"), Content: messageContent(ev)}})
		return
	}
	if w.commitTimes == nil {
		w.commitTimes = map[checkpoint.LSN]time.Time{}
	}
	at, ok := w.commitTimes[e.commitStart]
	if !ok {
		at = w.now
		w.commitTimes[e.commitStart] = at
	}
	s.queue = append(s.queue, replication.Event{WALStart: e.commitStart,
		Begin: &replication.Begin{FinalLSN: e.commitStart, CommitTime: at, XID: uint32(e.commitStart)}})
	for _, ev := range e.events {
		if ev.message {
			s.queue = append(s.queue, replication.Event{WALStart: e.commitStart, Message: &replication.Message{
				Transactional: true, LSN: e.commitStart, Prefix: cmp.Or(ev.prefix, "outbox"), Content: messageContent(ev)}})
			continue
		}
		rel, ok := s.rels["public.outbox"]
		if !ok {
			rel = &replication.Relation{ID: 1001, Namespace: "public", Name: "outbox", Table: "public.outbox", Columns: simColumns, Types: simTypes}
			s.rels["public.outbox"] = rel
			s.queue = append(s.queue, replication.Event{Relation: rel})
		}
		op := replication.OpInsert
		if ev.update {
			op = replication.OpUpdate
		}
		s.queue = append(s.queue, replication.Event{WALStart: e.commitStart, Change: &replication.Change{
			Op: op, Rel: rel, Values: [][]byte{[]byte(ev.id), []byte(strings.TrimPrefix(ev.topic, "outbox.event.")), []byte(ev.key), []byte("Created"), []byte(`{"n":1}`)}}})
	}
	s.queue = append(s.queue, replication.Event{WALStart: e.commitStart,
		Commit: &replication.Commit{CommitLSN: e.commitStart, EndLSN: e.commitEnd, CommitTime: at}})
}

func messageContent(ev simEvent) []byte {
	return fmt.Appendf(nil, `{"id":%q,"aggregatetype":%q,"aggregateid":%q,"type":"Created","payload":{"n":1}}`,
		ev.id, strings.TrimPrefix(ev.topic, "outbox.event."), ev.key)
}

func (s *simStream) Receive(ctx context.Context, deadline time.Time) (replication.Event, error) {
	w := s.w
	if s.closed {
		return replication.Event{}, errors.New("sim: stream closed")
	}
	if ctx.Err() != nil {
		return replication.Event{}, fmt.Errorf("%w: %w", replication.ErrReceive, ctx.Err())
	}
	ev, drop := w.act(deadline, true, nil)
	if drop {
		s.closed = true
		return replication.Event{}, fmt.Errorf("%w: sim: connection dropped", replication.ErrReceive)
	}
	return ev, nil
}

func (s *simStream) SendStatus(ctx context.Context, confirmed checkpoint.LSN, replyRequested bool) error {
	w := s.w
	if s.closed {
		return errors.New("sim: stream closed")
	}
	w.checkStatusInterval()
	s.lastStatus = w.now
	if what := w.undelivered(confirmed); what != "" {
		w.fail("invariant 1: status update confirms %s, but PostgreSQL would then skip %s, which Kafka has not acknowledged", confirmed, what)
	}
	if w.eos && confirmed > max(w.stored, simSlotStart) {
		w.fail("invariant E3: status update confirms %s, past %s, the position Kafka committed", confirmed, w.stored)
	}
	if confirmed > max(w.fence, simSlotStart) {
		w.fail("invariant F1: status update confirms %s, past %s, the fence the state row holds (a crash now would leave a slot the next start takes for moved by someone else)", confirmed, w.fence)
	}
	if w.catChange > 1 && confirmed > w.catChange {
		w.fail("invariant 6: status update confirms %s, past %s where the catalog changed", confirmed, w.catChange)
	}
	w.logf("status flush=%s reply=%v steps=%d", confirmed, replyRequested, w.steps)
	w.confirmed = max(w.confirmed, confirmed)
	if w.shutdown && len(s.queue) == 0 && confirmed >= s.done {
		// Its client confirmed everything: the walsender exits.
		s.closed = true
		w.logf("the walsender exits: its client confirmed the end of WAL")
		return nil
	}
	if w.faulty && w.rng.IntN(300) == 0 {
		s.closed = true
		return fmt.Errorf("%w: sim: connection dropped while sending", replication.ErrReceive)
	}
	return nil
}

func (s *simStream) EndStream(time.Duration) error { return nil }
func (s *simStream) Wake()                         {}
func (s *simStream) Close(context.Context) error {
	s.closed = true
	s.w.logf("stream closed")
	return nil
}

// simProducer is Kafka: per key, records are appended in the order they
// were sent; acknowledgements come back in any order across keys.
type simProducer struct {
	w      *simWorld
	acks   chan kafka.Ack
	single bool
	queue  map[string][]simMsg // key → records not yet answered
	keys   []string
	closed bool
	// seq numbers the records sent; unacked holds those not answered yet;
	// failed: a record failed (in exactly-once mode its Kafka transaction,
	// and every later one of this producer, cannot commit).
	seq     int
	unacked map[int]bool
	failed  bool
}

type simMsg struct {
	seq  int
	rec  router.Record
	meta kafka.Meta
}

func (p *simProducer) Send(rec *router.Record, m kafka.Meta) {
	if w := p.w; w.staleAtSend && w.staleRefusals[string(rec.EventID)] != 0 && rec.Topic != w.cfg.Relay.DeadLetterTopic {
		if w.staleRefusals[string(rec.EventID)] > 0 {
			w.staleRefusals[string(rec.EventID)]--
		}
		w.failedKeys[rec.Topic+"|"+string(rec.Key)] = true
		p.acks <- kafka.Ack{Meta: m, EventID: rec.EventID, Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Sent: w.now,
			Err: &kafka.ProduceError{Topic: rec.Topic, Err: fmt.Errorf("kafka: partition 2 does not exist: %w", sarama.ErrInvalidPartition)}}
		return
	}
	if p.queue == nil {
		p.queue = map[string][]simMsg{}
	}
	key := string(rec.Key)
	if _, ok := p.queue[key]; !ok {
		p.keys = append(p.keys, key)
	}
	r := *rec
	r.Headers = slices.Clone(rec.Headers)
	p.seq++
	if p.unacked == nil {
		p.unacked = map[int]bool{}
	}
	p.unacked[p.seq] = true
	p.queue[key] = append(p.queue[key], simMsg{seq: p.seq, rec: r, meta: m})
}

func (p *simProducer) Acks() <-chan kafka.Ack { return p.acks }
func (p *simProducer) Close(context.Context) error {
	p.closed = true
	return nil
}

// deliver answers the oldest record of one key (or a few).
func (p *simProducer) deliver() bool {
	w := p.w
	if p.closed || len(p.keys) == 0 {
		return false
	}
	n := 1 + w.rng.IntN(4)
	did := false
	for i := 0; i < n; i++ {
		var ready []string
		for _, k := range p.keys {
			if len(p.queue[k]) > 0 && !(w.holdAck != "" && string(p.queue[k][0].rec.EventID) == w.holdAck && w.now.Before(w.holdUntil)) {
				ready = append(ready, k)
			}
		}
		if len(ready) == 0 || len(p.acks) == cap(p.acks) {
			break
		}
		k := ready[w.rng.IntN(len(ready))]
		m := p.queue[k][0]
		delete(p.unacked, m.seq)
		p.queue[k] = p.queue[k][1:]
		a := kafka.Ack{Meta: m.meta, EventID: m.rec.EventID, Topic: m.rec.Topic, Partition: 0, Bytes: len(m.rec.Value), Sent: w.now}
		switch {
		case w.refuse != "" && string(m.rec.EventID) == w.refuse && m.rec.Topic != w.cfg.Relay.DeadLetterTopic:
			a.Err = &kafka.ProduceError{Topic: a.Topic, Err: sarama.ErrMessageSizeTooLarge}
		case w.staleRefusals[string(m.rec.EventID)] != 0 && m.rec.Topic != w.cfg.Relay.DeadLetterTopic:
			if w.staleRefusals[string(m.rec.EventID)] > 0 {
				w.staleRefusals[string(m.rec.EventID)]--
			}
			a.Err = &kafka.ProduceError{Topic: a.Topic, Err: fmt.Errorf("kafka: partition 2 does not exist: topic %q has 1 partitions: %w", a.Topic, sarama.ErrInvalidPartition)}
			w.failedKeys[m.rec.Topic+"|"+k] = true
		case w.faulty && w.failAfter && w.rng.IntN(60) == 0:
			a.Err = &kafka.ProduceError{Topic: a.Topic, Err: errors.New("sim: retries exhausted")}
			w.failedKeys[m.rec.Topic+"|"+k] = true
		case w.faulty && w.tooLarge && !p.single && w.rng.IntN(40) == 0:
			a.Err = &kafka.ProduceError{Topic: a.Topic, Err: sarama.ErrMessageSizeTooLarge}
			w.failedKeys[m.rec.Topic+"|"+k] = true
		default:
			id := string(m.rec.EventID)
			if m.rec.Topic == w.cfg.Relay.DeadLetterTopic {
				w.dlq[id] = true
			}
			if w.eos {
				// Acknowledged is not visible: the commit makes it so.
				break
			}
			w.delivered[id] = true
			w.log2[m.rec.Topic+"|"+k] = append(w.log2[m.rec.Topic+"|"+k], id)
		}
		a.Key, a.Value = m.rec.Key, m.rec.Value
		p.failed = p.failed || a.Err != nil
		w.logf("ack %s (%s) err=%v", m.rec.EventID, m.rec.Topic, a.Err)
		p.acks <- a
		did = true
	}
	return did
}

// simChecker answers topic checks: every topic exists but w.missing.
type simChecker struct {
	w       *simWorld
	pending []string
	results chan topicResult
}

func (c *simChecker) Request(topic string, _ time.Duration) { c.pending = append(c.pending, topic) }
func (c *simChecker) Results() <-chan topicResult           { return c.results }
func (c *simChecker) Stop()                                 {}

func (c *simChecker) answer() bool {
	if len(c.pending) == 0 {
		return false
	}
	t := c.pending[0]
	c.pending = c.pending[1:]
	st := kafka.TopicState{Topic: t, Partitions: 3}
	if t == c.w.missing {
		st.Err = kafka.ErrTopicMissing
	}
	c.results <- topicResult{Topic: t, State: st}
	return true
}

// simWatcher answers catalog checks with the WAL position the server has
// written (a little ahead of what the stream sent); past w.catChange the
// outbox table has another OID.
type simWatcher struct {
	w       *simWorld
	want    checkpoint.LSN // the fence the session asked for
	see     uint32         // See's transaction: visible at once here
	granted checkpoint.LSN // the fence the last raise recorded
	asked   bool
	last    time.Time
	results chan catalogResult
	// prefixAsk, prefixDone: ReadPrefixes's latest ask, and the latest a
	// check answered (no other slot relays a prefix here).
	prefixAsk, prefixDone uint64
}

func (c *simWatcher) Check()                                   { c.asked = true }
func (c *simWatcher) See(xid uint32)                           { c.see = xid }
func (c *simWatcher) RaiseFence(lsn checkpoint.LSN)            { c.want, c.asked = max(c.want, lsn), true }
func (c *simWatcher) Results() <-chan catalogResult            { return c.results }
func (c *simWatcher) Confirmed(checkpoint.LSN, checkpoint.LSN) {}
func (c *simWatcher) Stop(context.Context, checkpoint.LSN)     {}
func (c *simWatcher) ReadPrefixes(ask uint64)                  { c.prefixAsk, c.asked = max(c.prefixAsk, ask), true }

func (c *simWatcher) answer() bool {
	w := c.w
	// Checks run every publication.check.interval, and soon after one is
	// asked for; each takes a round trip.
	since := w.now.Sub(c.last)
	if w.stream == nil || len(c.results) == cap(c.results) ||
		!(since >= w.cfg.Postgres.PublicationCheckInterval || (c.asked && since >= 2*time.Millisecond)) {
		return false
	}
	c.asked, c.last = false, w.now
	if w.shutdown {
		w.logf("catalog check refused: shutting down")
		c.results <- catalogResult{Err: errors.New("sim: FATAL: the database system is shutting down (SQLSTATE 57P03)"), ShuttingDown: true}
		return true
	}
	at := w.stream.sent
	if w.stream.pos < len(w.stream.entries) {
		at = max(at, w.stream.entries[min(len(w.stream.entries)-1, w.stream.pos+w.rng.IntN(3))].commitStart)
	} else {
		at = w.end()
	}
	cat := replication.Catalog{CheckedAt: at, Publication: 500, Insert: true, ViaRoot: true,
		Tables: []replication.TableInfo{{Name: "public.outbox", OID: 1001, Kind: 'r', Persistence: 'p', Published: true}}}
	if w.catChange > 1 && at > w.catChange {
		cat.Tables[0].OID = 1002
		cat.CheckedAt = at
	}
	res := catalogResult{Catalog: cat, Saw: c.see}
	if c.prefixAsk > c.prefixDone {
		res.OtherPrefixes, res.PrefixesFor, c.prefixDone = map[string]string{}, c.prefixAsk, c.prefixAsk
	}
	if c.want > c.granted {
		// Raised in the check's round trip, to its WAL position at least.
		w.fence = max(w.fence, c.want, at)
		c.granted = w.fence
		res.Fence = w.fence
		w.logf("fence raised to %s", w.fence)
	}
	c.results <- res
	return true
}

func (w *simWorld) advanceTo(t time.Time) {
	if t.After(w.now) {
		w.now = t
	}
}

func simDescribe(ev replication.Event) string {
	switch {
	case ev.Begin != nil:
		return fmt.Sprintf("BEGIN final=%s", ev.Begin.FinalLSN)
	case ev.Commit != nil:
		return fmt.Sprintf("COMMIT end=%s", ev.Commit.EndLSN)
	case ev.Change != nil:
		return fmt.Sprintf("%s id=%s", ev.Change.Op, ev.Change.Values[0])
	case ev.Message != nil:
		return fmt.Sprintf("MESSAGE transactional=%v lsn=%s", ev.Message.Transactional, ev.Message.LSN)
	case ev.Keepalive != nil:
		return fmt.Sprintf("KEEPALIVE end=%s reply=%v", ev.Keepalive.WALEnd, ev.Keepalive.ReplyRequested)
	case ev.Relation != nil:
		return "RELATION " + ev.Relation.Table
	}
	return "nothing"
}
