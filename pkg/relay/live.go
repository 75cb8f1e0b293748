package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
)

// realClock is the clock of the production relay.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) NewTimer(d time.Duration) timer {
	return realTimer{time.NewTimer(d)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// liveBackend connects to PostgreSQL and Kafka.
//
// Concurrency: the relay's goroutine calls its methods. The goroutines it
// starts (a producer being created after its caller gave up on it, the
// topic checkers, the catalog watchers) are waited for by wait, which Run
// calls before it returns.
type liveBackend struct {
	log *zap.Logger
	wg  sync.WaitGroup
}

func (b *liveBackend) Prepare(ctx context.Context, cfg replication.Config) (replication.Start, error) {
	return replication.Prepare(ctx, cfg, b.log)
}

func (b *liveBackend) RecordSession(ctx context.Context, cfg replication.Config, st replication.State) error {
	if cfg.StateTable == "" {
		return nil
	}
	return withSQL(ctx, cfg, "pgoutbox-state", func(conn *pgx.Conn) error {
		return replication.WriteState(ctx, conn, cfg.StateTable, st)
	})
}

// withSQL runs f on an ordinary connection of its own, named app, closed
// after.
func withSQL(ctx context.Context, cfg replication.Config, app string, f func(*pgx.Conn) error) error {
	conn, err := replication.ConnectSQL(ctx, cfg, app, cfg.ConnectTimeout)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

func (b *liveBackend) ReadSlot(ctx context.Context, cfg replication.Config) (st replication.SlotState, now time.Time, err error) {
	err = withSQL(ctx, cfg, "pgoutbox-slot", func(conn *pgx.Conn) error {
		if st, err = replication.ReadSlot(ctx, conn, cfg.Slot); err != nil {
			return err
		}
		if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
			return fmt.Errorf("replication: read the server's clock: %w", err)
		}
		return nil
	})
	return st, now, err
}

func (b *liveBackend) WALEnd(ctx context.Context, cfg replication.Config) (end checkpoint.LSN, err error) {
	err = withSQL(ctx, cfg, "pgoutbox-slot", func(conn *pgx.Conn) error {
		end, err = replication.ReadWALEnd(ctx, conn)
		return err
	})
	return end, err
}

func (b *liveBackend) TimelineFork(ctx context.Context, cfg replication.Config, from, to int32) (checkpoint.LSN, bool, error) {
	return replication.TimelineFork(ctx, cfg, from, to)
}

func (b *liveBackend) Open(ctx context.Context, cfg replication.Config, start checkpoint.LSN) (stream, error) {
	st, err := replication.Open(ctx, cfg, start, b.log)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// NewProducer creates the producer on a goroutine of its own, so that a
// stop is honoured at once even while sarama retries against a cluster that
// does not answer; a producer that arrives after its caller gave up is
// closed.
func (b *liveBackend) NewProducer(ctx context.Context, cfg kafka.Config) (producer, error) {
	return startProducer(b, ctx, func() (*kafka.Producer, error) { return kafka.New(ctx, cfg, b.log) })
}

// NewTxnProducer is NewProducer for exactly-once mode.
func (b *liveBackend) NewTxnProducer(ctx context.Context, cfg kafka.Config, id kafka.SlotIdentity) (txnProducer, error) {
	return startProducer(b, ctx, func() (*kafka.TxnProducer, error) { return kafka.NewTransactional(ctx, cfg, id, b.log) })
}

func (b *liveBackend) EnsureOffsetsTopic(ctx context.Context, cfg kafka.Config) error {
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout+cfg.ReadTimeout)
	defer cancel()
	return kafka.EnsureOffsetsTopic(cctx, cfg)
}

// startProducer runs start on a goroutine of its own, so that a stop is
// honoured at once even while sarama retries against a cluster that does
// not answer; a producer that arrives after its caller gave up is closed.
func startProducer[P interface {
	comparable
	Close(context.Context) error
}](b *liveBackend, ctx context.Context, start func() (P, error)) (P, error) {
	type made struct {
		p   P
		err error
	}
	var zero P
	ch := make(chan made, 1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		p, err := start()
		ch <- made{p, err}
	}()
	select {
	case m := <-ch:
		if m.err != nil {
			return zero, m.err
		}
		return m.p, nil
	case <-ctx.Done():
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if m := <-ch; m.p != zero {
				cctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = m.p.Close(cctx)
				cancel()
			}
		}()
		return zero, context.Cause(ctx)
	}
}

// CheckTopics asks Kafka on a goroutine of its own, so that a stop is
// honoured at once even while a broker does not answer.
func (b *liveBackend) CheckTopics(ctx context.Context, cfg kafka.Config, topics []string) ([]kafka.TopicState, error) {
	type answer struct {
		st  []kafka.TopicState
		err error
	}
	ch := make(chan answer, 1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		st, err := kafka.CheckTopics(ctx, cfg, topics)
		ch <- answer{st, err}
	}()
	select {
	case a := <-ch:
		return a.st, a.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// wait waits, until ctx ends, for the goroutines the backend started.
func (b *liveBackend) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		b.log.Warn("some Kafka or PostgreSQL calls did not end in time; leaving them to end with the process")
	}
}

// topicCheckRetry is how soon a topic reported missing is asked about
// again, and how soon the cluster is asked again after it did not answer.
const topicCheckRetry = 500 * time.Millisecond

func (b *liveBackend) StartTopicChecker(cfg kafka.Config, wake func()) topicChecker {
	ctx, cancel := context.WithCancel(context.Background())
	c := &liveTopicChecker{cfg: cfg, wake: wake, cancel: cancel, kick: make(chan struct{}, 1), log: b.log,
		results: make(chan topicResult, 64), pending: map[string]time.Time{}, asked: map[string]time.Time{}}
	b.wg.Add(1)
	c.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer c.wg.Done()
		c.run(ctx)
	}()
	return c
}

// liveTopicChecker asks Kafka about topics on its own goroutine, with one
// metadata request for all topics pending at a time.
type liveTopicChecker struct {
	cfg     kafka.Config
	wake    func()
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	kick    chan struct{}
	results chan topicResult

	log *zap.Logger

	mu      sync.Mutex
	pending map[string]time.Time // topic → when a "missing" answer is final
	// asked: topic → when it was first asked about, for the warning
	// about a check that does not end (no leader, no broker answering).
	asked map[string]time.Time
}

// topicCheckWarnAfter is how long a topic check may go on before it is
// logged: its records wait meanwhile, counted as in flight.
const topicCheckWarnAfter = 30 * time.Second

func (c *liveTopicChecker) Request(topic string, missingFor time.Duration) {
	c.mu.Lock()
	if _, ok := c.pending[topic]; !ok {
		c.pending[topic] = time.Now().Add(missingFor)
		c.asked[topic] = time.Now()
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *liveTopicChecker) Results() <-chan topicResult { return c.results }

// Stop ends the checks. A request to a broker that does not answer cannot
// be cut short (sarama closes a broker connection only between requests):
// Stop waits a second for it and then leaves it to end by its read timeout;
// Run waits for it, bounded, before it returns.
func (c *liveTopicChecker) Stop() {
	c.cancel()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

func (c *liveTopicChecker) run(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-retry.C:
		}
		c.mu.Lock()
		topics := make([]string, 0, len(c.pending))
		for t := range c.pending {
			topics = append(topics, t)
		}
		c.mu.Unlock()
		if len(topics) == 0 {
			continue
		}
		// A broker that accepts connections but does not answer holds a
		// request for the read timeout; the relay meanwhile goes on.
		rctx, cancel := context.WithTimeout(ctx, c.cfg.ReadTimeout+c.cfg.DialTimeout)
		states, err := kafka.CheckTopics(rctx, c.cfg, topics)
		cancel()
		if ctx.Err() != nil {
			return
		}
		again := err != nil
		now := time.Now()
		c.warnSlow(now, topics, err, states)
		for _, s := range states {
			c.mu.Lock()
			giveUp, ok := c.pending[s.Topic]
			missingForNow := errors.Is(s.Err, kafka.ErrTopicMissing) && now.Before(giveUp)
			if ok && (missingForNow || (s.Err != nil && !kafka.IsPoison(s.Err))) {
				// Perhaps created a moment ago, and this broker's
				// metadata is behind, or a leader not elected yet: ask
				// again.
				again = true
				c.mu.Unlock()
				continue
			}
			delete(c.pending, s.Topic)
			delete(c.asked, s.Topic)
			c.mu.Unlock()
			select {
			case c.results <- topicResult{Topic: s.Topic, State: s}:
				c.wake()
			case <-ctx.Done():
				return
			}
		}
		if again {
			retry.Reset(topicCheckRetry)
		}
	}
}

// warnSlow logs, once per topic, a check that has gone on for
// topicCheckWarnAfter.
func (c *liveTopicChecker) warnSlow(now time.Time, topics []string, err error, states []kafka.TopicState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range topics {
		since, ok := c.asked[t]
		if !ok || since.IsZero() || now.Sub(since) < topicCheckWarnAfter {
			continue
		}
		c.asked[t] = time.Time{} // warned
		why := err
		for _, s := range states {
			if s.Topic == t && s.Err != nil {
				why = s.Err
			}
		}
		c.log.Warn("the topic check does not end: the topic's records wait (counted as in flight)",
			zap.String("topic", t), zap.Duration("for", now.Sub(since).Round(time.Second)), zap.NamedError("last_error", why))
	}
}

func (b *liveBackend) StartCatalogWatcher(cfg replication.Config, instance string, start *replication.Catalog, wake func()) catalogWatcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &liveWatcher{cfg: cfg, instance: instance, log: b.log, wake: wake, cancel: cancel,
		kick: make(chan struct{}, 1), results: make(chan catalogResult, 4), stopped: make(chan struct{}),
		attached: start.PartitionJoins()}
	w.relayedPrefixes = func(ctx context.Context) (map[string]string, error) {
		return replication.RelayedPrefixes(ctx, w.conn, cfg.StateTable, cfg.Slot)
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(w.stopped)
		w.run(ctx)
	}()
	return w
}

// Recording the confirmed position: when events were confirmed since the
// last record and stateRecordEvery has passed, or when stateRecordWAL more
// WAL was confirmed (by idle keepalives). The recorded position says, after
// a lost slot, from where events may be missing; it need not be exact, and
// writing it on every idle keepalive would itself keep WAL moving.
const (
	stateRecordEvery = 10 * time.Second
	stateRecordWAL   = 16 << 20
	catalogTimeout   = 10 * time.Second
)

// liveWatcher checks the catalog on its own goroutine and connection.
type liveWatcher struct {
	cfg      replication.Config
	instance string
	log      *zap.Logger
	wake     func()
	cancel   context.CancelFunc
	kick     chan struct{}
	results  chan catalogResult
	stopped  chan struct{}
	conn     *pgx.Conn

	mu          sync.Mutex
	confirmed   checkpoint.LSN
	eventCommit checkpoint.LSN

	fenceWant checkpoint.LSN
	see       uint32 // See's transaction
	prefixAsk uint64 // ReadPrefixes's latest ask

	// prefixDone is the latest ask a read of the prefixes answered, at
	// prefixesAt, after prefixFailed failed reads in a row (the watcher's
	// goroutine's). relayedPrefixes reads them on the watcher's connection
	// (StartCatalogWatcher; tests set their own).
	prefixDone      uint64
	prefixesAt      time.Time
	prefixFailed    int
	relayedPrefixes func(context.Context) (map[string]string, error)

	recorded      checkpoint.LSN // what the state row says
	recordedEvent checkpoint.LSN
	recordedAt    time.Time
	fence         checkpoint.LSN // the fence the state row holds
	fenceOff      bool
	fenceFailed   int
	// attached are the partitions attached to outbox tables that were
	// looked at for rows from before (by OID, with the attaching
	// transaction): at the start, or by an earlier check.
	attached map[uint32]uint32
}

func (w *liveWatcher) Check() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *liveWatcher) Results() <-chan catalogResult { return w.results }

func (w *liveWatcher) Confirmed(lsn, eventCommit checkpoint.LSN) {
	w.mu.Lock()
	w.confirmed, w.eventCommit = max(w.confirmed, lsn), max(w.eventCommit, eventCommit)
	w.mu.Unlock()
}

func (w *liveWatcher) See(xid uint32) {
	w.mu.Lock()
	w.see = xid
	w.mu.Unlock()
}

func (w *liveWatcher) RaiseFence(lsn checkpoint.LSN) {
	w.mu.Lock()
	w.fenceWant = max(w.fenceWant, lsn)
	w.mu.Unlock()
	w.Check()
}

func (w *liveWatcher) ReadPrefixes(ask uint64) {
	w.mu.Lock()
	w.prefixAsk = max(w.prefixAsk, ask)
	w.mu.Unlock()
	w.Check()
}

func (w *liveWatcher) Stop(ctx context.Context, sent checkpoint.LSN) {
	w.cancel()
	<-w.stopped
	// A check or record the cancel interrupted closed the connection (pgx
	// closes it when a query's context ends): the final records need a new
	// one.
	w.dropClosed()
	if w.conn != nil || w.cfg.StateTable != "" {
		w.record(ctx, true)
		w.recordStopped(ctx, sent)
	}
	if w.conn != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = w.conn.Close(cctx)
		cancel()
	}
}

func (w *liveWatcher) run(ctx context.Context) {
	t := time.NewTicker(w.cfg.PublicationCheckInterval)
	defer t.Stop()
	w.recordedAt = time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
		}
		res := w.check(ctx)
		if ctx.Err() != nil {
			return
		}
		select {
		case w.results <- res:
			w.wake()
		case <-ctx.Done():
			return
		}
		if res.Err == nil {
			w.record(ctx, false)
		}
	}
}

func (w *liveWatcher) check(ctx context.Context) catalogResult {
	cctx, cancel := context.WithTimeout(ctx, catalogTimeout)
	defer cancel()
	var res catalogResult
	w.mu.Lock()
	see, ask := w.see, w.prefixAsk
	w.mu.Unlock()
	// A connection that was ended (a shutdown, pg_terminate_backend) is
	// replaced at once, once: a server that shuts down refuses the new one.
	for try := 0; try < 2; try++ {
		if w.conn == nil {
			conn, err := replication.ConnectSQL(cctx, w.cfg, "pgoutbox-catalog", catalogTimeout)
			if err != nil {
				return catalogResult{Err: err, ShuttingDown: replication.IsShuttingDown(err)}
			}
			w.conn = conn
		}
		cat, err := replication.ReadCatalogSeeing(cctx, w.conn, w.cfg, see)
		var attached []string
		if err == nil {
			attached, err = w.checkAttached(cctx, &cat)
		}
		if err == nil {
			res := catalogResult{Catalog: cat, Saw: see, Attached: attached}
			w.readPrefixes(cctx, &res, ask)
			w.raiseFence(cctx, &res)
			return res
		}
		cc, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = w.conn.Close(cc)
		ccancel()
		w.conn = nil
		res = catalogResult{Err: err}
		if ctx.Err() != nil {
			break
		}
	}
	return res
}

// otherPrefixesEvery is how often a check reads, unasked, the prefixes
// other slots relay with: a relay added to the database or taken away
// while this session streams is known within it.
const otherPrefixesEvery = 30 * time.Second

// readPrefixes reads the prefixes other slots relay with into res, when
// the session asked (ask: the latest ask before the check began) or
// otherPrefixesEvery has passed, and a state table records them. A read
// that fails answers no ask, so that the next check reads again (a
// timeout, a lock on the state table); only after prefixReadTries
// failures in a row are the asks answered without a reading, and the
// session judges by what it knew: loudly, rather than never.
func (w *liveWatcher) readPrefixes(ctx context.Context, res *catalogResult, ask uint64) {
	if w.cfg.StateTable == "" || (ask <= w.prefixDone && time.Since(w.prefixesAt) < otherPrefixesEvery) {
		return
	}
	p, err := w.relayedPrefixes(ctx)
	if err != nil {
		w.prefixFailed++
		w.log.Debug("could not read which prefixes other slots relay", zap.Error(err), zap.Int("failed_reads", w.prefixFailed))
		if w.prefixFailed < prefixReadTries {
			return
		}
	}
	w.prefixFailed = 0
	res.OtherPrefixes, res.PrefixesFor = p, ask
	w.prefixDone, w.prefixesAt = ask, time.Now()
}

// prefixReadTries is how many reads of the other slots' prefixes in a row
// may fail before the session's asks are answered without one.
const prefixReadTries = 3

// checkAttached looks at the partitions attached since the last check for
// rows from before they were attached, which were never in the stream,
// and holds cleanup (which would delete them as relayed) when it finds
// some: the session then stops, naming them.
func (w *liveWatcher) checkAttached(ctx context.Context, cat *replication.Catalog) ([]string, error) {
	problems, unknown, checked, err := replication.AttachedWithOlderRows(ctx, w.conn, cat, w.attached, partitionScanTimeout)
	if err != nil {
		return nil, err
	}
	for _, u := range unknown {
		w.log.Warn(u.Why+"; pgoutbox cleanup is held until someone has looked", zap.String("state_table", w.cfg.StateTable))
		if w.hold(ctx, u.Why) {
			// Not looked at again: the hold says it.
			checked[u.OID] = u.Joined
		}
	}
	if len(problems) > 0 {
		w.hold(ctx, replication.CatalogChangedHold)
	}
	maps.Copy(w.attached, checked)
	if len(checked) > 0 && w.cfg.StateTable != "" && w.instance != "" {
		if err := replication.RecordPartitions(ctx, w.conn, w.cfg.StateTable, w.cfg.Slot, w.instance, checked); err != nil {
			// The next start looks at them again.
			w.log.Debug("record the partitions looked at", zap.Error(err))
		}
	}
	return problems, nil
}

// partitionScanTimeout bounds each look at a partition attached while the
// relay streams (usually a table just attached): one that takes longer
// holds cleanup and is named, rather than keep the checks, and so the
// confirmations, waiting.
const partitionScanTimeout = 5 * time.Second

// hold records a cleanup hold (when a state table is kept), and says
// whether cleanup is held now.
func (w *liveWatcher) hold(ctx context.Context, why string) bool {
	if w.cfg.StateTable == "" {
		return false
	}
	if _, err := replication.SetCleanupHold(ctx, w.conn, w.cfg.StateTable, w.cfg.Slot, why); err != nil {
		w.log.Warn("cannot hold pgoutbox cleanup: hold it (and any job that deletes outbox rows) yourself until the rows named are relayed", zap.Error(err))
		return false
	}
	return true
}

// raiseFence raises the state row's fence when the session asked for more
// than it holds, to the check's WAL position at least: everything the
// session has received so far. It runs after the catalog check on the same
// connection, so the session learns both from one result.
func (w *liveWatcher) raiseFence(ctx context.Context, res *catalogResult) {
	w.mu.Lock()
	want := w.fenceWant
	w.mu.Unlock()
	if w.fenceOff || w.cfg.StateTable == "" || w.instance == "" || want <= w.fence {
		return
	}
	fence, ok, err := replication.RaiseFence(ctx, w.conn, w.cfg.StateTable, w.cfg.Slot, w.instance, max(want, res.Catalog.CheckedAt))
	switch {
	case !ok:
		w.fenceOff = true
		res.FenceOff = true
		w.log.Warn("the state table has no stopped_lsn column (made by an earlier version, and this role may not add it): a slot moved while pgoutbox is stopped after a crash goes unnoticed; run `pgoutbox migrate` to add it",
			zap.String("state_table", w.cfg.StateTable))
	case err != nil:
		w.fenceFailed++
		if w.fenceFailed == 3 || w.fenceFailed%60 == 0 || errors.Is(err, replication.ErrFenceLost) {
			w.log.Warn("cannot record how far the slot may be confirmed; the slot is not confirmed past the last record until it can be",
				zap.Stringer("fence", w.fence), zap.Int("failed", w.fenceFailed), zap.Error(err))
		}
	default:
		if w.fenceFailed >= 3 {
			w.log.Info("recording how far the slot may be confirmed works again", zap.Int("failed", w.fenceFailed))
		}
		w.fenceFailed = 0
		w.fence = fence
		res.Fence = fence
	}
}

// dropClosed forgets a connection that pgx has closed.
func (w *liveWatcher) dropClosed() {
	if w.conn != nil && w.conn.IsClosed() {
		w.conn = nil
	}
}

// connected makes sure the watcher has an open connection for a state
// record, connecting within ctx; what says what the record was for.
func (w *liveWatcher) connected(ctx context.Context, what string) bool {
	w.dropClosed()
	if w.conn != nil {
		return true
	}
	conn, err := replication.ConnectSQL(ctx, w.cfg, "pgoutbox-catalog", catalogTimeout)
	if err != nil {
		w.log.Debug(what, zap.Error(err))
		return false
	}
	w.conn = conn
	return true
}

// recordStopped records in the state table where the session stopped.
func (w *liveWatcher) recordStopped(ctx context.Context, sent checkpoint.LSN) {
	if w.cfg.StateTable == "" || w.instance == "" || sent == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, catalogTimeout)
	defer cancel()
	if !w.connected(cctx, "record where the session stopped") {
		return
	}
	if err := replication.RecordStopped(cctx, w.conn, w.cfg.StateTable, w.cfg.Slot, w.instance, sent); err != nil {
		w.log.Warn("record where the session stopped in the state table", zap.Error(err))
	}
}

// record writes the confirmed position to the state table when due (or,
// final, whenever it moved).
func (w *liveWatcher) record(ctx context.Context, final bool) {
	if w.cfg.StateTable == "" || w.instance == "" {
		return
	}
	w.mu.Lock()
	confirmed, event := w.confirmed, w.eventCommit
	w.mu.Unlock()
	due := confirmed > w.recorded && (final ||
		(event > w.recordedEvent && time.Since(w.recordedAt) >= stateRecordEvery) ||
		confirmed-w.recorded >= stateRecordWAL)
	if !due {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, catalogTimeout)
	defer cancel()
	if !w.connected(cctx, "record the confirmed position") {
		return
	}
	if err := replication.RecordConfirmed(cctx, w.conn, w.cfg.StateTable, w.cfg.Slot, w.instance, confirmed); err != nil {
		if ctx.Err() != nil {
			// Stopping: Stop records the final position on a new connection.
			w.log.Debug("record the confirmed position in the state table", zap.Error(err))
			return
		}
		w.log.Warn("record the confirmed position in the state table", zap.Error(err))
		return
	}
	w.recorded, w.recordedEvent, w.recordedAt = confirmed, event, time.Now()
}
