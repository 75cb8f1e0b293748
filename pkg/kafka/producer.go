package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/router"
)

// ErrClosed is returned by Close when the producer was already closed.
var ErrClosed = errors.New("kafka: producer is closed")

// Ack reports the outcome of one Send. Ref and EventID are the values given
// to Send (EventID is the record's slice, not a copy). On success Err is nil and Partition and Offset locate the record.
// On failure Err is a *ProduceError, Offset is -1 and Partition is the
// chosen partition, or the requested one (-1 if none) when the record failed
// before it was partitioned.
//
// Offset is informational: sarama reports a batch that the broker rejects as
// a duplicate of one it already has (DUPLICATE_SEQUENCE_NUMBER, after a lost
// response) as a success without setting offsets, leaving them 0. Current
// brokers (and kfake) answer such a retry with the original offsets instead.
type Ack struct {
	Ref       uint64
	EventID   []byte
	Topic     string
	Partition int32
	Offset    int64
	// Bytes is the record's key, value and header size, as Send counted it,
	// so the caller can keep a byte budget of what is in flight.
	Bytes int
	// Key and Value are the record's bytes, set on failure only.
	Key, Value []byte
	// Stamp is what SendStamped was given (0 for Send); Sent is when the
	// record was handed to the producer.
	Stamp int64
	Sent  time.Time
	Err   error
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

// Producer writes records to Kafka with sarama's idempotent async producer
// and reports each outcome on Acks.
//
// Concurrency: Send and Close are meant for one goroutine (the one that
// owns the stream of records; records sent from several goroutines have no
// defined order). Acks and Partitions may be used from any goroutine. The
// Producer owns one goroutine, which drains sarama's Successes and Errors
// into Acks; Close waits for it.
//
// The caller must never have more than AckBuffer records sent whose acks it
// has not read; see Config.AckBuffer.
type Producer struct {
	log    *zap.Logger
	client sarama.Client
	ap     sarama.AsyncProducer
	acks   chan Ack
	done   chan struct{} // closed when the drain goroutine has returned
	closed atomic.Bool
	cfg    Config
	// known holds the topics whose existence was checked; owned by the
	// goroutine that calls Send.
	known map[string]bool
}

// New connects to the cluster and starts the producer. It fails with an
// error naming the brokers when none of them can be reached.
func New(cfg Config, log *zap.Logger) (*Producer, error) {
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
	if err := probe(&cfg, sc); err != nil {
		return nil, err
	}
	client, err := sarama.NewClient(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	ap, err := sarama.NewAsyncProducerFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("kafka: start producer on brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	p := &Producer{
		log:    log,
		client: client,
		ap:     ap,
		acks:   make(chan Ack, cfg.AckBuffer),
		done:   make(chan struct{}),
		cfg:    cfg,
		known:  map[string]bool{},
	}
	go p.drain()
	log.Info("kafka producer started",
		zap.Strings("brokers", cfg.Brokers),
		zap.Stringer("version", sc.Version),
		zap.String("compression", cfg.Compression),
		zap.Int("ack_buffer", cfg.AckBuffer))
	return p, nil
}

// probe dials the seed brokers one after another (and exchanges ApiVersions
// with them, and authenticates) until one answers, so that an unreachable
// cluster fails New within DialTimeout per broker rather than after sarama's
// retries. A broker that refuses the credentials ends the probe with an
// *AuthError: the other brokers would refuse them too.
func probe(cfg *Config, sc *sarama.Config) error {
	brokers := cfg.Brokers
	var errs, hints []string
	for _, addr := range brokers {
		b := sarama.NewBroker(addr)
		err := b.Open(sc)
		if err == nil {
			var ok bool
			ok, err = b.Connected()
			if ok {
				_ = b.Close()
				return nil
			}
			_ = b.Close()
		}
		if err == nil {
			err = errors.New("not connected")
		}
		var ae *AuthError
		if err = cfg.Security.authError(addr, err); errors.As(err, &ae) {
			return err
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
		hints = append(hints, brokerHint(err))
	}
	return fmt.Errorf("kafka: no broker reachable among %s: %s; %s",
		strings.Join(brokers, ","), strings.Join(errs, "; "), strings.Join(slices.Compact(hints), "; "))
}

// brokerHint says what to check when a seed broker does not answer.
func brokerHint(err error) string {
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &dns):
		return "check the host names in kafka.brokers and this machine's DNS (resolv.conf)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "check that Kafka runs and that kafka.brokers names one of its listeners (host:port as in listeners/advertised.listeners)"
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return "check that the brokers are reachable from here (network, firewall); raise kafka.dial.timeout if they are merely slow"
	}
	return "check kafka.brokers and the broker's log"
}

// Send hands rec to sarama; its outcome arrives on Acks with the given ref.
// Send copies what it needs from rec, so the caller may reuse rec at once,
// but the byte slices rec points to (Key, Value, EventID, header values) are
// not copied: they must stay alive and unchanged until the ack. Send blocks
// while sarama's input buffer is full.
//
// Send must not be called after Close; it panics if it is.
func (p *Producer) Send(rec *router.Record, ref uint64) {
	p.SendStamped(rec, ref, 0)
}

// SendStamped is Send with a caller's stamp (for example the transaction's
// commit time in Unix nanoseconds) that comes back in the Ack, so latencies
// can be measured without a lookup table.
func (p *Producer) SendStamped(rec *router.Record, ref uint64, stamp int64) {
	if p.closed.Load() {
		panic("kafka: Send called after Close")
	}
	m := newMessage(rec, ref)
	m.stamp = stamp
	m.sent = time.Now()
	if !p.known[rec.Topic] {
		// Retries last long, so a record for a topic that does not exist
		// (or may not be written) would wait for many minutes: check each
		// new topic once and fail its records at once instead.
		st, err := CheckTopics(p.cfg, []string{rec.Topic})
		switch {
		case err != nil:
			// The cluster did not answer: leave it to sarama's retries.
		case st[0].Err != nil:
			p.acks <- ack(&m.pm, st[0].Err)
			return
		default:
			p.known[rec.Topic] = true
		}
	}
	p.ap.Input() <- &m.pm
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

// Partitions returns the partition IDs of topic, from one metadata request
// (the client's own refresh retries for many minutes by default for a topic
// that does not exist). A missing topic is ErrTopicMissing.
func (p *Producer) Partitions(topic string) ([]int32, error) {
	st, err := CheckTopics(p.cfg, []string{topic})
	if err != nil {
		return nil, fmt.Errorf("kafka: partitions of topic %q: %w", topic, err)
	}
	if st[0].Err != nil {
		return nil, fmt.Errorf("kafka: partitions of topic %q: %w", topic, st[0].Err)
	}
	parts := make([]int32, st[0].Partitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	return parts, nil
}

// Close stops the producer: it closes sarama's input, waits until every
// record sent before has been acknowledged or has failed (sarama still
// retries in-flight records, so this can take as long as the retries),
// delivers those acks, closes Acks and closes the connections. Acks left in
// the channel stay readable after Close returns.
//
// Close may be called once; later calls return ErrClosed. It must not run
// concurrently with Send.
func (p *Producer) Close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	p.ap.AsyncClose()
	<-p.done
	// The producer was made from our client, so it leaves the client open.
	if err := p.client.Close(); err != nil && !errors.Is(err, sarama.ErrClosedClient) {
		return fmt.Errorf("kafka: close client: %w", err)
	}
	p.log.Info("kafka producer closed")
	return nil
}

// drain is the Producer's one goroutine. It moves every success and error
// from sarama to Acks until sarama closes both channels (after AsyncClose has
// finished every in-flight record), then closes Acks. It never blocks as long
// as the caller respects AckBuffer; if it did, sarama would stop too.
func (p *Producer) drain() {
	defer close(p.done)
	defer close(p.acks)
	successes, errs := p.ap.Successes(), p.ap.Errors()
	failed := 0
	for successes != nil || errs != nil {
		select {
		case pm, ok := <-successes:
			if !ok {
				successes = nil
				continue
			}
			p.acks <- ack(pm, nil)
		case pe, ok := <-errs:
			if !ok {
				errs = nil
				continue
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
	}
}
