package relay

import (
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
)

type fixedClock struct{ now time.Time }

func (c *fixedClock) Now() time.Time                 { return c.now }
func (c *fixedClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

// TestRecordRefusedForItsEpochAfterTheTimeoutRestarts: a record refused
// with INVALID_PRODUCER_EPOCH means either that another instance with the
// transactional id started (exit: it took over) or that the coordinator
// aborted the transaction for kafka.transaction.timeout, which bumps the
// epoch the same way (restart from the stored position, as a commit refused
// so does). A record's refusal was always taken for the first, so a Kafka
// that held a transaction past its timeout made pgoutbox exit. Unit level:
// a real coordinator aborts for the timeout only after a minute or more.
func TestRecordRefusedForItsEpochAfterTheTimeoutRestarts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Kafka.ExactlyOnce = true
	cfg.Kafka.TransactionTimeout = time.Minute
	clock := &fixedClock{now: time.Unix(1_000_000, 0)}
	s := &session{r: &Relay{cfg: cfg}, clock: clock, log: zap.NewNop()}
	e := &eosSession{s: s, cfg: cfg.Kafka}
	a := kafka.Ack{Topic: "t", Err: &kafka.ProduceError{Topic: "t", Err: sarama.ErrInvalidProducerEpoch}}
	var fatal *FatalError
	e.groupRecords = 1
	e.groupStart = clock.now.Add(-10 * time.Second)
	if handled, err := e.failedAck(a, 1); !handled || !errors.As(err, &fatal) {
		t.Fatalf("refused 10 s into the transaction: handled %v, %v; want a fatal error (another instance took over)", handled, err)
	}
	e.groupStart = clock.now.Add(-2 * time.Minute)
	if handled, err := e.failedAck(a, 1); !handled || err == nil || errors.As(err, &fatal) {
		t.Fatalf("refused 2 min into a transaction with a 1 min timeout: handled %v, %v; want a restart", handled, err)
	}
	// No transaction open: the last one's start says nothing.
	e.groupRecords = 0
	if handled, err := e.failedAck(a, 1); !handled || !errors.As(err, &fatal) {
		t.Fatalf("refused with no transaction open: handled %v, %v; want a fatal error", handled, err)
	}
}
