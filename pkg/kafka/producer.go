package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/router"
)

// ErrClosed is returned by Close when the producer was already closed.
var ErrClosed = errors.New("kafka: producer is closed")

// Meta is what the caller says about a record: it comes back in the
// record's Ack unchanged, so that the caller needs no lookup table.
type Meta struct {
	// Ref is the caller's reference (the relay: the transaction).
	Ref uint64
	// Stamp is a time in Unix nanoseconds (the relay: the commit time).
	Stamp int64
	// Hold is what keeps the record's bytes in memory (the relay: the WAL
	// chunk they lie in), and Held the bytes the caller counts for the
	// record while it is in flight; both are opaque to the producer.
	Hold any
	Held int
}

// Ack reports the outcome of one Send. Meta is what Send was given; EventID
// is the record's slice, not a copy. On success Err is nil and Partition and
// Offset locate the record. On failure Err is a *ProduceError, Offset is -1
// and Partition is the chosen partition, or the requested one (-1 if none)
// when the record failed before it was partitioned.
//
// Offset is informational: sarama reports a batch that the broker rejects as
// a duplicate of one it already has (DUPLICATE_SEQUENCE_NUMBER, after a lost
// response) as a success without setting offsets, leaving them 0. Current
// brokers (and kfake) answer such a retry with the original offsets instead.
type Ack struct {
	Meta
	EventID   []byte
	Topic     string
	Partition int32
	Offset    int64
	// Bytes is the record's key, value and header size.
	Bytes int
	// Size is the record's size as the producer's max.message.bytes
	// limit counts it (RecordSize).
	Size int
	// Key and Value are the record's bytes, set on failure only.
	Key, Value []byte
	// Sent is when the record was handed to the producer.
	Sent time.Time
	Err  error
}

// ProduceError is the error of a failed Ack. Any ProduceError means later
// records may have been written after a gap: see the package documentation.
type ProduceError struct {
	Topic     string
	Partition int32
	Err       error
}

func (e *ProduceError) Error() string {
	return fmt.Sprintf("kafka: produce to topic %q partition %d: %v", e.Topic, e.Partition, e.Err)
}

func (e *ProduceError) Unwrap() error { return e.Err }

// IsUnknownTopic reports whether Kafka answered that it does not know the
// record's topic (UNKNOWN_TOPIC_OR_PARTITION). sarama retries that answer
// with metadata refreshes for as long as its retries (or
// kafka.metadata.timeout) last before the record fails with it, so a topic
// that existed has most likely been deleted; one refused at once may only be a producer's stale view
// (MayBeStaleMetadata).
func IsUnknownTopic(err error) bool {
	return errors.Is(err, sarama.ErrUnknownTopicOrPartition)
}

// Producer writes records to Kafka with sarama's idempotent async producer
// and reports each outcome on Acks.
//
// Concurrency: Send and Close are meant for one goroutine (the one that
// owns the stream of records; records sent from several goroutines have no
// defined order). Acks and Partitions may be used from any goroutine. The
// Producer owns two goroutines: the pump, which hands queued records to
// sarama in Send's order, and the drain, which moves sarama's Successes and
// Errors into Acks; Close waits for both. A third, the closer, closes
// sarama's client once Close asks; Close waits for it until its context
// ends (see closeClient for what is then left behind).
//
// The caller must never have more than AckBuffer records sent whose acks it
// has not read; see Config.AckBuffer.
type Producer struct {
	log    *zap.Logger
	client sarama.Client
	ap     sarama.AsyncProducer
	acks   chan Ack
	// queue holds the records Send took and the pump has not handed to
	// sarama yet. Its capacity is AckBuffer, so Send never waits for
	// sarama, whose own channels are small (saramaChannelBuffer).
	queue  chan *sarama.ProducerMessage
	pumped chan struct{} // closed when the pump has returned
	// barrier asks the drain to pass on everything sarama has answered so
	// far, and to close the channel it sends once it has (passAnswered).
	barrier chan chan struct{}
	done    chan struct{} // closed when the drain (and so the pump) has returned
	closed  atomic.Bool
	cfg     Config

	// abort cuts the client's connections and refuses new ones (Abort);
	// release lets go of its watch once the producer has closed.
	abort, release func()
	// closeOnce starts the closer (closeClient); clientClosed is closed
	// when sarama's client has closed, clientErr is what it said.
	closeOnce    sync.Once
	clientClosed chan struct{}
	clientErr    error
}

// New connects to the cluster and starts the producer. It fails with an
// error naming the brokers when none of them can be reached. ctx bounds it:
// a cluster that accepts connections but does not answer (a paused broker)
// would otherwise hold it up for as long as sarama retries.
func New(ctx context.Context, cfg Config, log *zap.Logger) (*Producer, error) {
	if log == nil {
		log = zap.NewNop()
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sc, err := cfg.sarama()
	if err != nil {
		return nil, err
	}
	answered, err := probe(ctx, &cfg, sc)
	if err != nil {
		return nil, err
	}
	// The client starts with the broker that answered as its only seed:
	// the idempotent producer asks its first seed for a producer ID before
	// the client knows any other broker, and sarama shuffles the seeds and
	// retries that same one when it is down, so a dead broker in
	// kafka.brokers failed one start in three. Once the producer has its ID
	// every address is a seed again.
	// The client's connections can be cut for good (Abort): closed, and no
	// new one dialled.
	abortCtx, abort := context.WithCancel(context.Background())
	sc, release := withCancel(abortCtx, sc)
	// Aborted, sarama must give up at once: its retries of records and of
	// metadata (up to kafka.retry.max, 1000 by default, with backoffs up to
	// a second) would otherwise keep the producer, its records and the WAL
	// they pin alive for about 16 minutes, beside the next session's.
	aborted := new(atomic.Bool)
	sc.Metadata.Retry.BackoffFunc = unlessAborted(aborted, sc.Metadata.Retry.BackoffFunc)
	sc.Producer.Retry.BackoffFunc = unlessAborted(aborted, sc.Producer.Retry.BackoffFunc)
	started := false
	defer func() {
		if !started {
			release()
			abort()
		}
	}()
	client, err := sarama.NewClient([]string{answered}, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	// The idempotent producer asks for a producer ID as it starts, with
	// retries; closing the client when ctx ends cuts that short.
	stop := context.AfterFunc(ctx, func() { _ = client.Close() })
	ap, err := startAsync(ctx, client, &cfg, log)
	if !stop() {
		if err == nil {
			_ = ap.Close()
		} else if retriableInit(err) {
			return nil, fmt.Errorf("kafka: start producer on brokers %s: %w; the last answer was: %w", strings.Join(cfg.Brokers, ","), context.Cause(ctx), err)
		}
		return nil, fmt.Errorf("kafka: start producer on brokers %s: %w", strings.Join(cfg.Brokers, ","), context.Cause(ctx))
	}
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("kafka: start producer on brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	if len(cfg.Brokers) > 1 {
		// Nothing was sent yet: the connections this closes are the ones
		// the start used.
		if err := client.RefreshBrokers(cfg.Brokers); err != nil {
			_ = ap.Close()
			return nil, fmt.Errorf("kafka: start producer on brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
		}
	}
	started = true
	p := &Producer{
		log:     log,
		abort:   func() { aborted.Store(true); abort() },
		release: release,
		client:  client,
		ap:      ap,
		acks:    make(chan Ack, cfg.AckBuffer),
		queue:   make(chan *sarama.ProducerMessage, cfg.AckBuffer),
		pumped:  make(chan struct{}),
		barrier: make(chan chan struct{}),
		done:    make(chan struct{}),
		cfg:     cfg,

		clientClosed: make(chan struct{}),
	}
	go p.pump()
	go p.drain()
	log.Info("kafka producer started",
		zap.Strings("brokers", cfg.Brokers),
		zap.Stringer("version", sc.Version),
		zap.String("compression", cfg.Compression),
		zap.Int("ack_buffer", cfg.AckBuffer))
	return p, nil
}

// startAsync starts sarama's producer, which asks for a producer ID as it
// starts, and starts it again, until ctx ends, while the answer is one that
// passes: a KRaft broker answers COORDINATOR_LOAD_IN_PROGRESS until the
// controller has granted it a block of producer IDs, which waits for a new
// controller when the old one died, and sarama gives up after
// initProducerIDRetries tries. A test that started pgoutbox with a broker
// just killed exited so at start-up.
func startAsync(ctx context.Context, client sarama.Client, cfg *Config, log *zap.Logger) (sarama.AsyncProducer, error) {
	var warned time.Time
	var last error // the last answer that passes
	for {
		ap, err := sarama.NewAsyncProducerFromClient(client)
		switch {
		case err == nil:
			if !warned.IsZero() {
				log.Info("the Kafka cluster gave the producer its ID", zap.Strings("brokers", cfg.Brokers))
			}
			return ap, nil
		case ctx.Err() != nil && last != nil:
			// ctx closed the client under sarama: what it says then
			// is of that, not of the cluster.
			return nil, last
		case ctx.Err() != nil || !retriableInit(err):
			return nil, err
		}
		last = err
		if now := time.Now(); now.Sub(warned) >= initWarnEvery {
			log.Warn("the Kafka cluster cannot give the producer an ID yet; asking again until it can",
				zap.Strings("brokers", cfg.Brokers), zap.Error(err))
			warned = now
		}
		t := time.NewTimer(cfg.RetryBackoffMax)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// initWarnEvery is how often startAsync repeats its warning.
const initWarnEvery = 30 * time.Second

// retriableInit reports whether a failed start of sarama's producer may
// succeed when tried again: the answers to InitProducerId that say the
// broker or coordinator is not ready yet, or is busy.
func retriableInit(err error) bool {
	var ke sarama.KError
	if !errors.As(err, &ke) {
		return false
	}
	switch ke {
	case sarama.ErrOffsetsLoadInProgress, sarama.ErrConsumerCoordinatorNotAvailable,
		sarama.ErrNotCoordinatorForConsumer, sarama.ErrConcurrentTransactions,
		sarama.ErrRequestTimedOut, sarama.ErrNotEnoughReplicas, sarama.ErrNotController,
		sarama.ErrNetworkException, sarama.ErrLeaderNotAvailable, sarama.ErrKafkaStorageError:
		return true
	}
	return false
}

// probe dials the seed brokers one after another (and exchanges ApiVersions
// with them, and authenticates) until one answers, and returns its address,
// so that an unreachable cluster fails New within DialTimeout per broker
// rather than after sarama's retries. A broker that refuses the credentials
// ends the probe with an *AuthError: the other brokers would refuse them
// too.
func probe(ctx context.Context, cfg *Config, sc *sarama.Config) (string, error) {
	brokers := cfg.Brokers
	var errs, hints []string
	for _, addr := range brokers {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(brokers, ","), err)
		}
		b, closeB, err := openBroker(ctx, addr, sc)
		if err == nil {
			// sarama reports a connection open before the broker answered
			// anything: ask it something small.
			_, err = b.GetMetadata(sarama.NewMetadataRequest(sc.Version, []string{}))
			closeB()
			if cerr := ctx.Err(); cerr != nil {
				err = cerr
			}
			if err == nil {
				return addr, nil
			}
		}
		if isTimeout(err) {
			err = &silentBrokerError{timeout: sc.Net.ReadTimeout, err: err}
		}
		var ae *AuthError
		if err = cfg.Security.authError(addr, err); errors.As(err, &ae) {
			return "", err
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
		hints = append(hints, brokerHint(err))
	}
	return "", fmt.Errorf("kafka: no broker reachable among %s: %s; %s",
		strings.Join(brokers, ","), strings.Join(errs, "; "), strings.Join(slices.Compact(hints), "; "))
}

// silentBrokerError is a broker that accepted the connection and then did
// not answer.
type silentBrokerError struct {
	timeout time.Duration
	err     error
}

func (e *silentBrokerError) Error() string {
	return fmt.Sprintf("accepted the connection but did not answer within kafka.read.timeout (%s): %v", e.timeout, e.err)
}
func (e *silentBrokerError) Unwrap() error { return e.err }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// brokerHint says what to check when a seed broker does not answer.
func brokerHint(err error) string {
	var dns *net.DNSError
	var ne net.Error
	var silent *silentBrokerError
	switch {
	case errors.As(err, &silent):
		return "the broker is up but not serving: it may be paused, overloaded or in a long garbage-collection pause; check its process and log, or raise kafka.read.timeout"
	case errors.As(err, &dns):
		return "check the host names in kafka.brokers and this machine's DNS (resolv.conf)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "check that Kafka runs and that kafka.brokers names one of its listeners (host:port as in listeners/advertised.listeners)"
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return "check that the brokers are reachable from here (network, firewall); raise kafka.dial.timeout if they are merely slow"
	}
	return "check kafka.brokers and the broker's log"
}

// Send hands rec to sarama; its outcome arrives on Acks with m. Send copies
// what it needs from rec, so the caller may reuse rec at once, but the byte
// slices rec points to (Key, Value, EventID, header values) are not copied:
// they must stay alive and unchanged until the ack.
//
// Send never waits for the network: the topic must be known to exist (the
// caller checks with CheckTopics first, or lets the broker auto-create it),
// and it never blocks while the caller keeps to AckBuffer. A record larger
// than max.message.bytes fails at once with a *RecordTooLargeError.
//
// Send must not be called after Close; it panics if it is.
func (p *Producer) Send(rec *router.Record, m Meta) {
	if p.closed.Load() {
		panic("kafka: Send called after Close")
	}
	if pm := p.message(rec, m); pm != nil {
		p.queue <- pm
	}
}

// pump is the goroutine that hands Send's records to sarama, in order. It
// is the one that waits when sarama's channels are full (a partition whose
// broker does not answer fills them), so that Send does not. When Close has
// closed the queue and every record in it went to sarama, it tells sarama to
// finish (AsyncClose).
func (p *Producer) pump() {
	defer close(p.pumped)
	in := p.ap.Input()
	for pm := range p.queue {
		in <- pm
	}
	p.ap.AsyncClose()
}

// message makes the sarama message of rec, the one step of Send that
// Producer and TxnProducer share. A record that can never be produced
// (larger than kafka.max.message.bytes) is acknowledged at once with a
// *RecordTooLargeError instead, and message returns nil.
func (p *Producer) message(rec *router.Record, m Meta) *sarama.ProducerMessage {
	msg := newMessage(rec, m)
	msg.sent = time.Now()
	if size := msg.pm.ByteSize(2); size > p.cfg.MaxMessageBytes {
		p.acks <- ack(&msg.pm, &RecordTooLargeError{Topic: rec.Topic, Size: size, Limit: p.cfg.MaxMessageBytes, Option: "kafka.max.message.bytes"})
		return nil
	}
	return &msg.pm
}

// Acks returns the channel on which every Send yields exactly one Ack, in
// the order sarama finishes the records, which across partitions is not the
// send order. Its capacity is Config.AckBuffer. It is closed by Close after
// the last ack.
//
// An Ack with a non-nil Err means the relay must stop confirming: see the
// package documentation.
func (p *Producer) Acks() <-chan Ack { return p.acks }

// AckBuffer returns the capacity of Acks: the most records the caller may
// have sent and not yet received the ack of.
func (p *Producer) AckBuffer() int { return cap(p.acks) }

// Close stops the producer: it lets the pump hand sarama the records still
// queued and close sarama's input, waits until every record sent before
// has been acknowledged or has failed (sarama still
// retries in-flight records, so this can take as long as the retries),
// delivers those acks, closes Acks and closes the connections. Acks left in
// the channel stay readable after Close returns.
//
// When ctx ends first, Close closes the connections under sarama, which
// fails what is still in flight, and waits for that CloseGrace longer; if
// sarama still has not finished it returns ErrCloseTimeout and leaves its
// goroutines to end with the process. Records failed that way are reported
// like any failure: nothing after them may be confirmed. Closing sarama's
// client waits for a metadata refresh under way (see closeClient): Close
// never waits for that past ctx's end and CloseGrace either.
//
// Close may be called once; later calls return ErrClosed. It must not run
// concurrently with Send.
func (p *Producer) Close(ctx context.Context) error {
	if !p.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	close(p.queue)
	select {
	case <-p.done:
	case <-ctx.Done():
		return p.forceClose(p.done, "kafka producer did not finish in time; closing its connections")
	}
	// The producer was made from our client, so it leaves the client open.
	closed := p.closeClient()
	select {
	case <-closed:
	case <-ctx.Done():
		t := time.NewTimer(CloseGrace)
		defer t.Stop()
		select {
		case <-closed:
		case <-t.C:
		}
	}
	select {
	case <-closed:
	default:
		p.log.Warn("kafka producer closed, but not its client: a metadata refresh is under way (a topic the cluster does not know, or brokers that do not answer), which sarama lets end first; leaving the client to close in the background",
			zap.Duration("metadata_timeout", p.cfg.MetadataTimeout))
		return ErrCloseTimeout
	}
	if p.clientErr != nil {
		return fmt.Errorf("kafka: close client: %w", p.clientErr)
	}
	p.log.Info("kafka producer closed")
	return nil
}

// Abort makes the producer deliver nothing more: it closes its client's
// connections and refuses new ones, so that whatever sarama still holds
// fails (and is acknowledged as failed) instead of reaching Kafka. Close
// must follow, and need not wait: give it a context that has ended.
//
// The relay aborts a producer whose session ended with records in flight,
// which it sends again from the slot in the next session. Closed the
// usual way against a cluster it cannot reach, sarama failed some of a
// partition's records with ErrShuttingDown and still delivered later ones
// once the cluster was back: the next session's resends of the failed
// ones then came after later events of their keys (a chaos prober: Kafka
// stopped, the walsender ended, Kafka started again).
func (p *Producer) Abort() {
	p.log.Warn("aborting the Kafka producer: the records it holds are not delivered by it (the next session sends them again from the slot)")
	p.abort()
}

// unlessAborted is backoff f (sarama() sets one for both), or none once
// aborted is set.
func unlessAborted(aborted *atomic.Bool, f func(retries, maxRetries int) time.Duration) func(retries, maxRetries int) time.Duration {
	return func(retries, maxRetries int) time.Duration {
		if aborted.Load() {
			return 0
		}
		return f(retries, maxRetries)
	}
}

// closeClient starts closing sarama's client, once, on the closer
// goroutine, and returns the channel closed when the client has closed.
// sarama's Client.Close first waits for its background metadata refresh,
// which against a topic the cluster does not know (deleted while the relay
// runs) goes on for as long as its retries last (about 16 minutes), or
// Metadata.Timeout (kafka.metadata.timeout) if set, plus the network
// timeouts of its last try, and only then closes the connections. So no caller waits for it unbounded: Close and forceClose
// wait until their deadline, and past it leave the closer behind. It then
// ends by itself when sarama's refresh does, holding the client's
// connections until then; a process that exits ends it sooner.
func (p *Producer) closeClient() <-chan struct{} {
	p.closeOnce.Do(func() {
		go func() {
			defer close(p.clientClosed)
			if err := p.client.Close(); err != nil && !errors.Is(err, sarama.ErrClosedClient) {
				p.clientErr = err
			}
			p.release()
			p.abort()
		}()
	})
	return p.clientClosed
}

// forceClose is the way out of a Close whose context ended: it logs why,
// closes the connections under sarama, which fails what still waits for
// them (and so frees a pump waiting for sarama's input), and waits
// CloseGrace for done to close and for the client to have closed. It
// returns ErrCloseTimeout if either has not: sarama closes the connections
// only after a metadata refresh under way has ended (see closeClient).
func (p *Producer) forceClose(done <-chan struct{}, why string) error {
	p.log.Warn(why)
	closed := p.closeClient()
	t := time.NewTimer(CloseGrace)
	defer t.Stop()
	for done != nil || closed != nil {
		select {
		case <-done:
			done = nil
		case <-closed:
			closed = nil
		case <-t.C:
			return ErrCloseTimeout
		}
	}
	return nil
}

// CloseGrace is how long Close waits for sarama after its context ended and
// it closed sarama's connections. It is short: a caller that gives up on
// the producer has confirmed what it will confirm, and against a broker
// that does not answer sarama seldom finishes anyway (it retries its
// records, failing on the closed client, for as long as its retries last);
// a caller with a budget keeps CloseGrace of it for Close.
const CloseGrace = 500 * time.Millisecond

// ErrCloseTimeout is returned by Close when sarama did not finish after its
// connections were closed.
var ErrCloseTimeout = errors.New("kafka: producer did not close in time; its goroutines are left to end with the process")

// RecordTooLargeError is a record larger than a limit on record size: the
// producer's (kafka.max.message.bytes) or its topic's (max.message.bytes).
type RecordTooLargeError struct {
	Topic  string
	Size   int // as RecordSize (or CompressedRecordSize) counts it
	Limit  int
	Option string // the setting that sets Limit
}

func (e *RecordTooLargeError) Error() string {
	return fmt.Sprintf("kafka: record of %d bytes for topic %q is larger than %s (%d): it can never be produced", e.Size, e.Topic, e.Option, e.Limit)
}

// drain moves every success and error from sarama to Acks until sarama
// closes both channels (after the pump's AsyncClose has finished every
// in-flight record), then closes Acks. It never blocks as long as the caller
// respects AckBuffer; if it did, sarama would stop too.
func (p *Producer) drain() {
	defer close(p.done)
	defer close(p.acks)
	// sarama closes its channels only after the pump's last step.
	defer func() { <-p.pumped }()
	successes, errs := p.ap.Successes(), p.ap.Errors()
	failed := 0
	// Each takes what its channel gave; a closed channel is done with, and
	// the loop ends when both are.
	success := func(pm *sarama.ProducerMessage, ok bool) {
		if !ok {
			successes = nil
			return
		}
		if _, own := pm.Metadata.(offsetsRecord); own {
			return
		}
		p.acks <- ack(pm, nil)
	}
	failure := func(pe *sarama.ProducerError, ok bool) {
		if !ok {
			errs = nil
			return
		}
		if _, own := pe.Msg.Metadata.(offsetsRecord); own {
			// Its transaction fails too, and says so on Commits.
			return
		}
		a := ack(pe.Msg, pe.Err)
		// The first failure is the one that matters; the relay stops on
		// it and the rest would only flood the log.
		if failed == 0 {
			p.log.Error("kafka produce failed", zap.Uint64("ref", a.Ref),
				zap.String("topic", a.Topic), zap.Int32("partition", a.Partition), zap.Error(pe.Err))
		} else {
			p.log.Debug("kafka produce failed", zap.Uint64("ref", a.Ref),
				zap.String("topic", a.Topic), zap.Int32("partition", a.Partition), zap.Error(pe.Err))
		}
		failed++
		p.acks <- a
	}
	for successes != nil || errs != nil {
		select {
		case pm, ok := <-successes:
			success(pm, ok)
		case pe, ok := <-errs:
			failure(pe, ok)
		case done := <-p.barrier:
			for more := true; more; {
				select {
				case pm, ok := <-successes:
					success(pm, ok)
				case pe, ok := <-errs:
					failure(pe, ok)
				default:
					more = false
				}
			}
			close(done)
		}
	}
}

// passAnswered returns once the drain has passed on to Acks every answer
// sarama gave before the call (or the drain has ended).
func (p *Producer) passAnswered() {
	done := make(chan struct{})
	select {
	case p.barrier <- done:
		<-done
	case <-p.done:
	}
}
