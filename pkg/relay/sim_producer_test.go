package relay

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// countingProducers counts the producers made and the records each sent.
type countingProducers struct {
	backend
	sent []int
}

func (b *countingProducers) NewProducer(ctx context.Context, cfg kafka.Config) (producer, error) {
	p, err := b.backend.NewProducer(ctx, cfg)
	b.sent = append(b.sent, 0)
	return &countedProducer{producer: p, n: &b.sent[len(b.sent)-1]}, err
}

type countedProducer struct {
	producer
	n *int
}

func (p *countedProducer) Send(rec *router.Record, m kafka.Meta) { *p.n++; p.producer.Send(rec, m) }

// TestSimulatedProducerIsReplacedBeforeItsSequencesRunOut: sarama numbers
// an idempotent producer's batches per partition with an int32 it does not
// wrap, so past 2^31 records to one partition the broker refuses a batch as
// out of sequence and its keys are resent after later records of theirs.
// The session hands over to a new producer after a number of records (2^30;
// a few here), between transactions with nothing in flight, and loses or
// reorders nothing doing so (the harness's invariants). The harness, not a
// real broker: two billion records do not fit in a test.
func TestSimulatedProducerIsReplacedBeforeItsSequencesRunOut(t *testing.T) {
	const limit = 10
	for seed := uint64(1); seed <= 30; seed++ {
		w := newSimWorld(seed)
		w.failAfter, w.tooLarge, w.missing, w.catChange, w.faulty = false, false, "", 0, false
		w.log, w.verbose = t.Logf, *simLog
		w.maxProducerRecords = limit
		var cp *countingProducers
		w.wrap = func(b backend) backend { cp = &countingProducers{backend: b}; return cp }
		if err := w.run(); err != nil || w.err != nil {
			t.Fatalf("seed %d: run: %v %v", seed, err, w.err)
		}
		if err := w.check(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		most := 0
		for _, e := range w.wal {
			most = max(most, len(e.events))
		}
		total := 0
		for i, n := range cp.sent {
			total += n
			// Past the limit the session reads no more WAL; what it read
			// (one transaction's records, and records parked for a topic
			// not yet known, at most the in-flight cap) still goes out.
			if bound := limit + most + w.cfg.Relay.MaxInFlightRecords; n > bound {
				t.Fatalf("seed %d: producer %d sent %d records; the limit is %d, %d with what was read", seed, i, n, limit, bound)
			}
		}
		if total > 2*limit && len(cp.sent) < 2 {
			t.Fatalf("seed %d: %d records through %d producer(s)", seed, total, len(cp.sent))
		}
	}
}

// TestSimulatedProducerHandOverKeepsItsInvariants: the same hand-over every
// few records, in the harness's faulty and clean runs, in both modes:
// every invariant holds (exactly-once: no event visible twice).
func TestSimulatedProducerHandOverKeepsItsInvariants(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		w := newSimWorld(seed)
		w.log, w.verbose = t.Logf, *simLog
		w.maxProducerRecords = int64(1 + seed%20)
		if seed%2 == 0 {
			w.eos = true
			w.visible = map[string]bool{}
			w.cfg.Kafka.ExactlyOnce = true
			w.cfg.Kafka.TransactionTimeout = 15 * time.Minute
		}
		if err := w.play(); err != nil {
			t.Fatalf("seed %d (exactly-once %v): %v", seed, w.eos, err)
		}
	}
}
