package relay

import (
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// topicCache is what the relay knows about topics, across sessions: those
// that exist (with their max.message.bytes, 0 when unknown), and those that
// did not, until when that answer stands.
//
// Concurrency: owned by Run's goroutine.
type topicCache struct {
	ok     map[string]int
	failed map[string]failedTopic
	ttl    time.Duration
	// settings are the settings, besides max.message.bytes, that records
	// are judged by, of the topics in ok (topicconfig.go), and when they
	// were read; settingsWarned the topics whose settings could not be
	// read, warned of once.
	settings       map[string]topicSettings
	settingsWarned map[string]bool
}

type failedTopic struct {
	err   error
	until time.Time
}

func newTopicCache(missingFor time.Duration) *topicCache {
	if missingFor <= 0 {
		missingFor = kafka.DefaultTopicMissingTimeout
	}
	return &topicCache{ok: map[string]int{}, failed: map[string]failedTopic{}, ttl: missingFor}
}

// topicGate holds a session's records for a topic until the topic is known
// to exist. Retries last long (minutes), so a record for a topic that does
// not exist, or may not be written, would otherwise wait for them; and
// asking the cluster on the loop's goroutine would stall the loop whenever
// Kafka does not answer. So the first record of a topic not yet known is
// parked and the topic checker asks; its answer releases the topic's
// records in order, or fails them (poison) once the topic has been missing
// for kafka.topic.missing.timeout. With kafka.auto.create.topics nothing is
// checked: the broker creates the topic when sarama asks for it.
type topicGate struct {
	s       *session
	checker topicChecker
	parked  map[string][]parkedRecord
	warned  map[string]bool
}

type parkedRecord struct {
	rec  router.Record
	meta kafka.Meta
}

func newTopicGate(s *session, c topicChecker) *topicGate {
	return &topicGate{s: s, checker: c, parked: map[string][]parkedRecord{}, warned: map[string]bool{}}
}

// send sends rec now, parks it, or fails it.
func (g *topicGate) send(rec *router.Record, m kafka.Meta) {
	s, cache := g.s, g.s.r.topics
	if s.r.cfg.Kafka.AutoCreateTopics {
		g.produce(rec, m)
		return
	}
	topic := rec.Topic
	if limit, ok := cache.ok[topic]; ok {
		parked, err := g.judge(rec, m, limit)
		if parked {
			return
		}
		if err != nil {
			g.fail(rec, m, err)
			return
		}
		g.produce(rec, m)
		return
	}
	if f, ok := cache.failed[topic]; ok && s.clock.Now().Before(f.until) {
		g.fail(rec, m, f.err)
		return
	}
	p := parkedRecord{rec: *rec, meta: m}
	p.rec.Headers = slices.Clone(rec.Headers) // the router reuses rec's headers
	if _, waiting := g.parked[topic]; !waiting {
		g.checker.Request(topic, cache.missingFor(topic, s.clock.Now()))
	}
	g.parked[topic] = append(g.parked[topic], p)
}

// fail queues the failure of a record that is not sent, for the loop to
// handle like a failure Kafka reported.
func (g *topicGate) fail(rec *router.Record, m kafka.Meta, err error) {
	g.s.failures = append(g.s.failures, kafka.Ack{
		Meta: m, EventID: rec.EventID, Topic: rec.Topic, Partition: rec.Partition, Offset: -1,
		Bytes: len(rec.Key) + len(rec.Value), Size: kafka.RecordSize(rec), Key: rec.Key, Value: rec.Value,
		Sent: g.s.clock.Now(), Err: &kafka.ProduceError{Topic: rec.Topic, Partition: rec.Partition, Err: err},
	})
}

// result takes a topic checker's answer and releases or fails the topic's
// parked records.
func (g *topicGate) result(res topicResult) {
	s, cache := g.s, g.s.r.topics
	res = cache.deletedResult(res)
	recs := g.parked[res.Topic]
	delete(g.parked, res.Topic)
	if res.State.Err != nil {
		err := res.State.Err
		if kafka.IsPoison(err) {
			err = fmt.Errorf("%w (asked for %s; create the topic, or set kafka.auto.create.topics)", err, cache.ttl)
		}
		cache.failed[res.Topic] = failedTopic{err: err, until: s.clock.Now().Add(cache.ttl)}
		for i := range recs {
			g.fail(&recs[i].rec, recs[i].meta, err)
		}
		return
	}
	delete(cache.failed, res.Topic)
	limit, _ := res.State.MaxMessageBytes()
	cache.ok[res.Topic] = limit
	s.r.learnSettings(res.State)
	if own := s.r.cfg.Kafka.MaxMessageBytes; limit > 0 && limit < own && !g.warned[res.Topic] {
		g.warned[res.Topic] = true
		s.log.Warn("the topic accepts smaller batches than the producer builds: a refused batch is resent one record at a time; set kafka.max.message.bytes to at most the topic's max.message.bytes",
			zap.String("topic", res.Topic), zap.Int("topic_max_message_bytes", limit), zap.Int("kafka_max_message_bytes", own))
	}
	for i := range recs {
		g.send(&recs[i].rec, recs[i].meta)
	}
}

// known marks topics as existing (checked at start-up).
func (c *topicCache) known(states []kafka.TopicState) {
	for _, st := range states {
		if st.Err == nil {
			limit, _ := st.MaxMessageBytes()
			c.ok[st.Topic] = limit
			c.knownSettings(st)
		}
	}
}

// produce hands rec to the session's producer, counting it (see
// maxProducerRecords).
func (g *topicGate) produce(rec *router.Record, m kafka.Meta) {
	g.s.sent++
	g.s.prod.Send(rec, m)
}

// overTopicLimit says whether rec, alone in a batch, is larger than its
// topic's max.message.bytes (limit; 0: not known), which the broker applies
// to the batch after compression: with compression on, by its size
// compressed (kafka.CompressedRecordSize) when it comes near the limit, as
// records that do not compress grow a little. Sent to be refused, it would
// take its batch with it, and the other keys of that batch would reach
// Kafka after later records of theirs.
func (r *Relay) overTopicLimit(rec *router.Record, limit int) error {
	if limit <= 0 {
		return nil
	}
	size := kafka.RecordSize(rec) + kafka.BatchOverhead
	c := r.cfg.Kafka.Compression
	compressed := size > limit-limit/64-64 && kafka.Compresses(c)
	if compressed {
		size = kafka.CompressedRecordSize(rec, c)
	}
	if size <= limit {
		return nil
	}
	option := fmt.Sprintf("the max.message.bytes of topic %q", rec.Topic)
	if compressed {
		option += " (its size compressed with " + c + ")"
	}
	return &kafka.RecordTooLargeError{Topic: rec.Topic, Size: size, Limit: limit, Option: option}
}
