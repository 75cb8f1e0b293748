package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/router"
)

// TxnProducer writes records in Kafka transactions (exactly-once mode). Each
// Commit ends the transaction holding every record sent since the last one,
// with one more record, to the offsets topic, saying the position it ends
// at; a read_committed consumer sees the records of a transaction only once
// it committed, and the offsets record with them.
//
// Concurrency: Send, Commit and Close are for one goroutine (the relay's
// loop) and never wait for the network. The producer owns two goroutines:
// the drain goroutine of [Producer] (sarama's Successes and Errors into
// Acks), and the transaction goroutine, which takes records and commits in
// order from a queue and makes sarama's blocking calls (BeginTxn, which
// waits while a commit runs, CommitTxn and AbortTxn, which wait until every
// record in flight is answered, retries included, and then for the
// coordinator), posting each commit's outcome on Commits. Close waits for
// both.
//
// While a commit runs, records sent after it wait in the queue: sarama
// refuses records between the end of one transaction and the beginning of
// the next.
type TxnProducer struct {
	*Producer
	id      SlotIdentity
	key     []byte
	queue   chan txnItem
	commits chan CommitResult
	ran     chan struct{}
	closing atomic.Bool
	// failed is closed once a transaction failed: the producer is then
	// closed without waiting for sarama's retries (see Close). fenced is
	// the error that said Kafka refuses this producer's epoch, if any.
	failed     chan struct{}
	failedOnce sync.Once
	fenced     atomic.Pointer[error]
	stored     storedOffset
	found      bool
	// pending is the outcome of a CommitTxn that run stopped waiting for
	// (a failure it saw first); run waits for it before it returns.
	pending chan error
}

type txnItem struct {
	pm     *sarama.ProducerMessage // a record; nil for a commit
	lsn    uint64
	at     time.Time // a commit's: see offsetValue.At
	last   TxnMark   // a commit's: see offsetValue.Last
	sentAt time.Time
}

// CommitResult is the outcome of one [TxnProducer.Commit]. Err nil means the
// transaction committed: its records and the offsets record saying LSN are
// visible to read_committed consumers. Otherwise it is aborted, or its
// outcome is unknown (a commit request that got no answer): the producer
// refuses everything after it, and the caller starts again from what the
// offsets topic says.
type CommitResult struct {
	LSN uint64
	Err error
	// Began is when the transaction's first record went to sarama, Took
	// how long its commit took.
	Began time.Time
	Took  time.Duration
}

// ErrTxnFailed is wrapped by the error of each record sent after a failed
// commit (the commits after it fail with that commit's own error).
var ErrTxnFailed = errors.New("kafka: an earlier transaction failed; nothing more is sent in this producer")

// IsFenced reports whether err says another producer with the same
// transactional id took over (or the coordinator aborted the transaction
// for its timeout, which bumps the epoch the same way).
func IsFenced(err error) bool {
	return errors.Is(err, sarama.ErrProducerFenced) || errors.Is(err, sarama.ErrInvalidProducerEpoch)
}

// offsetsRecord marks the offsets record in sarama's acknowledgements: the
// drain goroutine drops it, as it is the producer's own.
type offsetsRecord struct{}

// NewTransactional starts a transactional producer for the slot id, with
// cfg.TransactionalID (required) and cfg.OffsetsTopic. Starting it fences
// every earlier producer with that transactional id (InitProducerId: their
// open transactions are aborted, or, when already being committed,
// completed) and then reads, with read_committed isolation, the position
// last committed for the slot: [TxnProducer.Stored]. That order is what
// makes the position the truth: no instance that started before can commit
// another transaction after it was read.
func NewTransactional(ctx context.Context, cfg Config, id SlotIdentity, log *zap.Logger) (*TxnProducer, error) {
	if log == nil {
		log = zap.NewNop()
	}
	cfg.Defaults()
	if !cfg.ExactlyOnce || cfg.TransactionalID == "" {
		return nil, errors.New("kafka: a transactional producer needs kafka.exactly.once and a transactional id")
	}
	// The client would ask for a missing topic's metadata for as long as
	// its retries last: ask once first.
	states, err := CheckTopics(ctx, cfg, []string{cfg.OffsetsTopic})
	if err != nil {
		return nil, err
	}
	if errors.Is(states[0].Err, ErrTopicMissing) {
		return nil, fmt.Errorf("%w: %q (kafka.offsets.topic): run pgoutbox migrate, or create it (one partition, cleanup.policy=compact)", ErrOffsetsTopicMissing, cfg.OffsetsTopic)
	}
	if err := waitTxnCoordinator(ctx, cfg, log); err != nil {
		return nil, txnStartError(cfg, err)
	}
	p, err := New(ctx, cfg, log)
	if err != nil {
		return nil, txnStartError(cfg, err)
	}
	t := &TxnProducer{
		Producer: p,
		id:       id,
		key:      id.Key(),
		queue:    make(chan txnItem, cfg.AckBuffer+8),
		commits:  make(chan CommitResult, 16),
		ran:      make(chan struct{}),
		failed:   make(chan struct{}),
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.TransactionTimeout+cfg.ReadTimeout)
	defer cancel()
	stop := context.AfterFunc(rctx, func() { p.closeClient() })
	t.stored, t.found, err = readStored(rctx, p.client, cfg.OffsetsTopic, t.key)
	if !stop() {
		err = errors.Join(err, context.Cause(rctx))
	}
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = p.Close(cctx)
		cancel()
		return nil, fmt.Errorf("kafka: read the slot's position from the offsets topic %q: %w", cfg.OffsetsTopic, err)
	}
	go t.run()
	log.Info("kafka transactional producer started", zap.String("transactional_id", cfg.TransactionalID),
		zap.String("offsets_topic", cfg.OffsetsTopic), zap.Bool("stored", t.found), zap.String("stored_lsn", formatLSN(t.stored.lsn)))
	return t, nil
}

// txnStartError says what to check when the transactional producer does
// not start.
func txnStartError(cfg Config, err error) error {
	switch {
	case errors.Is(err, sarama.ErrInvalidTransactionTimeout):
		return fmt.Errorf("%w: kafka.transaction.timeout %s is above the brokers' transaction.max.timeout.ms: lower it, or raise that broker setting", err, cfg.TransactionTimeout)
	case errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed):
		return fmt.Errorf("%w: the user may not use transactional id %q: grant WRITE and DESCRIBE on that TransactionalId", err, cfg.TransactionalID)
	case errors.Is(err, sarama.ErrClusterAuthorizationFailed):
		return fmt.Errorf("%w: the user may not write transactionally: grant IDEMPOTENT_WRITE on the cluster, and WRITE and DESCRIBE on TransactionalId %q", err, cfg.TransactionalID)
	}
	return err
}

// Stored returns the position the offsets topic held for the slot when the
// producer started, and whether it held one.
func (t *TxnProducer) Stored() (lsn uint64, ok bool) { return t.stored.lsn, t.found }

// StoredTimeline is the server's timeline the stored position was written
// on: 0 when none is stored, or the record is of a version before it was
// written.
func (t *TxnProducer) StoredTimeline() int32 { return t.stored.timeline }

// StoredAt is the time of the server's clock the stored position was
// written with (every transaction before it had committed by then): zero
// when none is stored, or the record is of a version before it was
// written.
func (t *TxnProducer) StoredAt() time.Time { return t.stored.at }

// StoredLast is the last transaction read at or below the stored position:
// zero when none is stored, none had been read, or the record is of a
// version before it was written.
func (t *TxnProducer) StoredLast() TxnMark { return t.stored.last }

// Send queues rec for the current transaction (one begins with the first
// record after a commit); its outcome arrives on Acks. As for
// [Producer.Send], it never blocks while the caller keeps to AckBuffer, and
// rec's bytes must stay alive until the ack. A record acknowledged is in
// Kafka, not yet visible: only its transaction's commit makes it so.
func (t *TxnProducer) Send(rec *router.Record, m Meta) {
	if t.closing.Load() {
		panic("kafka: Send called after Close")
	}
	if pm := t.message(rec, m); pm != nil {
		t.queue <- txnItem{pm: pm}
	}
}

// Commit ends the current transaction with an offsets record saying lsn,
// at and last (see offsetValue.At and Last; a transaction without records
// of its own holds only that). It never blocks
// while the caller has at most 8 commits outstanding; the outcome arrives on
// Commits, in order.
func (t *TxnProducer) Commit(lsn uint64, at time.Time, last TxnMark) {
	t.queue <- txnItem{lsn: lsn, at: at, last: last, sentAt: time.Now()}
}

// Commits returns the channel of commit outcomes, one per Commit, in order.
func (t *TxnProducer) Commits() <-chan CommitResult { return t.commits }

// Close ends the transaction goroutine, aborting a transaction that is open
// (its records were never to be seen), and then closes the producer as
// [Producer.Close] does. When ctx ends first the connections are closed
// under sarama, which fails what still waits for them.
func (t *TxnProducer) Close(ctx context.Context) error {
	if !t.closing.CompareAndSwap(false, true) {
		return ErrClosed
	}
	close(t.queue)
	// Once a transaction failed, nothing this producer still delivers can
	// become visible: its transaction can no longer commit, and the next
	// producer's start aborts it (and refuses its epoch). So its close
	// need not wait for sarama's retries.
	select {
	case <-t.ran:
	case <-t.failed:
	case <-ctx.Done():
	}
	select {
	case <-t.failed:
		fctx, cancel := context.WithTimeout(ctx, failedCloseWait)
		defer cancel()
		ctx = fctx
	default:
	}
	select {
	case <-t.ran:
	case <-ctx.Done():
		if err := t.forceClose(t.ran, "the Kafka transaction did not end in time; closing the producer's connections"); err != nil {
			return err
		}
	}
	return t.Producer.Close(ctx)
}

// run is the transaction goroutine.
func (t *TxnProducer) run() {
	defer close(t.ran)
	var (
		open   bool
		began  time.Time
		failed error
	)
	for it := range t.queue {
		if failed != nil {
			t.refuse(it, failed)
			continue
		}
		if !open {
			if err := t.ap.BeginTxn(); err != nil {
				failed = fmt.Errorf("kafka: begin a transaction: %w", err)
				t.fail(failed)
				t.refuse(it, failed)
				continue
			}
			open, began = true, time.Now()
		}
		if it.pm != nil {
			t.ap.Input() <- it.pm
			continue
		}
		t.ap.Input() <- t.offsetsMessage(it.lsn, it.at, it.last)
		start := time.Now()
		err := t.commit()
		open = false
		if err != nil {
			failed = fmt.Errorf("kafka: commit the transaction ending at %s: %w", formatLSN(it.lsn), err)
			t.fail(failed)
			// The records Kafka refused are on Acks before the commit's
			// failure is on Commits, so that the caller, draining Acks
			// when it reads a failure here, knows which record failed it.
			t.passAnswered()
		}
		t.commits <- CommitResult{LSN: it.lsn, Err: failed, Began: began, Took: time.Since(start)}
	}
	if t.pending != nil {
		<-t.pending
	}
	if open && failed == nil {
		// Records of a transaction that will not be committed: abort it, so
		// that read_committed consumers need not wait for its timeout. Like
		// a commit, the abort first waits for every record; those of a
		// producer another instance fenced meanwhile are retried to the
		// end of their retries, so the abort is watched the same way.
		if err := t.guard(t.ap.AbortTxn, func(err error) error { return err }); err != nil {
			t.fail(err)
			t.log.Warn("abort the open Kafka transaction", zap.Error(err))
		}
		if t.pending != nil {
			<-t.pending
		}
	}
}

// fail records that a transaction failed, and whether Kafka fenced the
// producer.
func (t *TxnProducer) fail(err error) {
	if IsFenced(err) || t.ap.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0 {
		t.fenced.CompareAndSwap(nil, &err)
	}
	t.failedOnce.Do(func() { close(t.failed) })
}

// Fenced returns the error with which Kafka refused this producer's epoch
// (another producer with the same transactional id started, or its
// transaction timed out), if a commit, an abort or a record met one. It is
// final once Close has returned.
func (t *TxnProducer) Fenced() error {
	if e := t.fenced.Load(); e != nil {
		return *e
	}
	return nil
}

// commit runs CommitTxn, on a goroutine of its own that run waits for, and
// returns its error, or earlier an error for the state sarama enters when
// the transaction fails: sarama's CommitTxn first waits for every record,
// and the records of a transaction whose AddPartitionsToTxn failed (fenced,
// not authorized) are retried to the end of their retries instead of
// failing, which would hold the commit for as long.
func (t *TxnProducer) commit() error { return t.guard(t.ap.CommitTxn, t.recover) }

// guard runs end (CommitTxn or AbortTxn) as commit describes; failed makes
// end's own error the one to report.
func (t *TxnProducer) guard(end func() error, failed func(error) error) error {
	done := make(chan error, 1)
	t.pending = done
	go func() { done <- end() }()
	tick := time.NewTicker(txnStatePoll)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			t.pending = nil
			if err != nil {
				return failed(err)
			}
			return nil
		case <-tick.C:
			st := t.ap.TxnStatus()
			switch {
			case st&sarama.ProducerTxnFlagFatalError != 0:
				return fmt.Errorf("%w: the transaction coordinator refused this producer for good: another instance with transactional id %q fenced it, or it lost its authorization", sarama.ErrProducerFenced, t.cfg.TransactionalID)
			case st&sarama.ProducerTxnFlagAbortableError != 0:
				return errors.New("kafka: a record of the transaction failed; the transaction is aborted")
			}
		}
	}
}

// txnStatePoll is how often commit looks at sarama's transaction state;
// failedCloseWait how long Close waits for a failed producer.
const (
	txnStatePoll    = 5 * time.Millisecond
	failedCloseWait = 2 * time.Second
)

// recover aborts the transaction after a failed commit when sarama says
// that is possible, and returns the error to report.
func (t *TxnProducer) recover(err error) error {
	status := t.ap.TxnStatus()
	if status&sarama.ProducerTxnFlagAbortableError == 0 {
		// Fatal (fenced, not authorized), or the commit request went
		// unanswered (sarama leaves the state at "committing"): the
		// outcome is the coordinator's to decide; the next producer's
		// start settles it.
		return err
	}
	if aerr := t.ap.AbortTxn(); aerr != nil {
		return fmt.Errorf("%w; then abort: %w", err, aerr)
	}
	return fmt.Errorf("%w (aborted)", err)
}

// refuse fails a record or commit that follows a failure. A record's
// error is ErrTxnFailed, naming the failure without wrapping it, so that
// the record is not taken for what failed the transaction (a refused
// record, fencing).
func (t *TxnProducer) refuse(it txnItem, err error) {
	if it.pm != nil {
		t.acks <- ack(it.pm, fmt.Errorf("%w (%v)", ErrTxnFailed, err))
		return
	}
	t.commits <- CommitResult{LSN: it.lsn, Err: err}
}

func (t *TxnProducer) offsetsMessage(lsn uint64, at time.Time, last TxnMark) *sarama.ProducerMessage {
	return &sarama.ProducerMessage{
		Topic:     t.cfg.OffsetsTopic,
		Key:       sarama.ByteEncoder(t.key),
		Value:     sarama.ByteEncoder(encodeOffset(t.id, t.cfg.TransactionalID, lsn, at, last)),
		Partition: -1,
		Timestamp: time.Now(),
		Metadata:  offsetsRecord{},
	}
}

// waitTxnCoordinator asks the brokers, until ctx ends, for the transaction
// coordinator of cfg's transactional id, and returns once one answered
// with it. sarama's producer asks once when it starts, and when the
// coordinator is not available yet (a broker that just started loads the
// transaction log; a new cluster creates it) it looks up
// __consumer_offsets, which a cluster without consumer groups lacks, and
// retries that for as long as metadata.retry.max lasts, without a context:
// 16 minutes with the defaults, found when a test started right after a
// broker restart. Asked here first, the producer's own question finds the
// coordinator at once.
func waitTxnCoordinator(ctx context.Context, cfg Config, log *zap.Logger) error {
	sc, err := cfg.sarama()
	if err != nil {
		return err
	}
	var last error
	for round := 0; ; round++ {
		for _, addr := range cfg.Brokers {
			err := askTxnCoordinator(ctx, addr, sc, cfg.TransactionalID)
			if err == nil {
				if round > 0 {
					log.Info("the Kafka transaction coordinator is available", zap.String("transactional_id", cfg.TransactionalID), zap.String("asked", addr))
				}
				return nil
			}
			var ae *AuthError
			if err = cfg.Security.authError(addr, err); errors.As(err, &ae) || errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed) {
				return err
			}
			last = fmt.Errorf("%s: %w", addr, err)
		}
		if round == 0 {
			log.Warn("the Kafka transaction coordinator is not available yet; asking again until it is", zap.String("transactional_id", cfg.TransactionalID), zap.Error(last))
		}
		t := time.NewTimer(coordinatorRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("kafka: no transaction coordinator for transactional id %q before %w; last answer: %w", cfg.TransactionalID, context.Cause(ctx), last)
		case <-t.C:
		}
	}
}

// coordinatorRetry is how long waitTxnCoordinator waits between rounds.
const coordinatorRetry = 250 * time.Millisecond

func askTxnCoordinator(ctx context.Context, addr string, sc *sarama.Config, id string) error {
	b, closeB, err := openBroker(ctx, addr, sc)
	if err != nil {
		return err
	}
	defer closeB()
	req := &sarama.FindCoordinatorRequest{CoordinatorKey: id, CoordinatorType: sarama.CoordinatorTransaction, Version: 2}
	if sc.Version.IsAtLeast(sarama.V2_4_0_0) {
		req.Version = 3
	}
	res, err := b.FindCoordinator(req)
	if err != nil {
		return err
	}
	if !errors.Is(res.Err, sarama.ErrNoError) {
		return res.Err
	}
	return nil
}
