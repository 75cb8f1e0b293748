package relay

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// refusingProducer acknowledges each record as it is sent, failing those
// in fail with err: a scripted producer, since a real broker refuses one
// batch and accepts the next only on a condition it cannot be put in on
// demand.
type refusingProducer struct {
	acks chan kafka.Ack
	fail map[uint64]error
}

func (p *refusingProducer) Send(rec *router.Record, m kafka.Meta) {
	p.acks <- kafka.Ack{Meta: m, Topic: rec.Topic, EventID: rec.EventID, Err: p.fail[m.Ref]}
}
func (p *refusingProducer) Acks() <-chan kafka.Ack          { return p.acks }
func (p *refusingProducer) Close(ctx context.Context) error { return nil }

type noTopics struct{ ch chan topicResult }

func (n noTopics) Request(string, time.Duration) {}
func (n noTopics) Results() <-chan topicResult   { return n.ch }
func (n noTopics) Stop()                         {}

// TestPollDeliverNamesAKeyWhoseOrderKafkaBroke: the broker refused the
// batch of a key's first record and took the next, with its second (the
// producer starts a new epoch after a refused batch): Kafka now holds the
// second before the first, which is sent again. Nothing can undo that, so
// the relay names the key at Error; a key whose records all failed, or
// all went through, is not named.
func TestPollDeliverNamesAKeyWhoseOrderKafkaBroke(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	r := &Relay{log: zap.New(core), obs: NopObserver{}, clock: realClock{}, cfg: DefaultConfig()}
	refused := &kafka.ProduceError{Topic: "t", Err: sarama.ErrMessageSizeTooLarge}
	prod := &refusingProducer{acks: make(chan kafka.Ack, 8), fail: map[uint64]error{0: refused, 2: refused, 3: refused}}
	p := &rowPublisher{r: r, prod: prod, checker: noTopics{ch: make(chan topicResult)}, ctx: context.Background()}
	rec := func(key, id string) *router.Record {
		return &router.Record{Topic: "t", Key: []byte(key), EventID: []byte(id), Partition: -1}
	}
	// a1 refused, a2 accepted: reordered. b1, b2 refused: not. c1 accepted.
	recs := []*router.Record{rec("a", "a1"), rec("a", "a2"), rec("b", "b1"), rec("b", "b2"), rec("c", "c1")}
	if _, err := p.deliver(recs, make([]int64, len(recs))); err == nil {
		t.Fatal("deliver of a refused batch: no error")
	}
	lines := logs.FilterMessageSnippet("the order of this key is broken").All()
	if len(lines) != 1 || lines[0].ContextMap()["key"] != "a" || lines[0].ContextMap()["earlier_event_id"] != "a1" {
		t.Fatalf("keys named as reordered: %v, want a alone (a2 after a1)", lines)
	}
}
