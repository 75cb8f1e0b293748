package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// A rowPublisher turns rows read from a table (the poll source's claims,
// an initial snapshot) into records, sends them and waits until Kafka has
// answered for every one: the table sources publish a batch at a time and
// record the outcome in the table (or in the slot's starting point) only
// once Kafka has answered for all of it.
//
// Order per key: rows are handled in the order given (sequence order), and
// a row is published only if every earlier row of its key in the batch
// was. A row that cannot be published holds back the later rows of its key:
// those that were not sent yet are not sent, and those already in flight
// (a record Kafka refused after it was sent) are not counted as published,
// so they are sent again after it.
//
// Concurrency: owned by Run's goroutine, like the session it serves; the
// producer and the topic checker post into channels it reads.
type rowPublisher struct {
	r       *Relay
	prod    producer
	checker topicChecker
	// ctx is Run's: its end is a stop request.
	ctx context.Context
	// stopBy is when waiting must end once a stop was requested (set when
	// it is).
	stopBy   time.Time
	stopping bool
	// onWait is called while waiting for Kafka, at most every second, with
	// the records still in flight.
	onWait func(inFlight int)
	// single: records go one per produce request, so a record the broker
	// refuses as too large is too large on its own: poison.
	single bool
	// refused: after a publish (or deliver) that failed, which of its rows
	// (recs, for deliver) the broker refused with the whole batch they
	// were in (kafka.IsBatchRefused): one of them may be too large on its
	// own. Empty after one that did not fail that way.
	refused []int
}

// pubRow is one row to publish.
type pubRow struct {
	row router.Row
	key []byte // the key column's value: rows of one key keep their order
	// stamp is when the row was written (Unix ns; 0 if unknown), for the
	// commit-to-ack latency.
	stamp int64
	// where names the row in errors and logs ("seq 12 of public.outbox").
	where string
}

// rowOutcome is what became of a row.
type rowOutcome uint8

const (
	// rowHeld: not published because an earlier row of its key was not;
	// it stays as it was.
	rowHeld rowOutcome = iota
	// rowPublished: Kafka acknowledged its record (or the router made
	// none of it, which is as good).
	rowPublished
	// rowPoison: it cannot be published: the router cannot map it, or
	// Kafka can never accept its record. err says why.
	rowPoison
)

type rowResult struct {
	outcome rowOutcome
	err     error
	// rec is the row's record (when it was routed); its bytes are the
	// row's.
	rec router.Record
}

// errStopTimeout ends a batch whose acknowledgements did not all arrive
// within the stop's budget.
var errStopTimeout = errors.New("relay: Kafka did not acknowledge the batch within relay.shutdown.timeout")

// publish routes, sends and waits for rows. A non-nil error means the
// batch's outcome is unknown and must not be recorded: a produce error
// Kafka may recover from (after which sarama may have written later
// records first), a stop that ran out of time, a producer that closed.
func (p *rowPublisher) publish(rows []pubRow) ([]rowResult, error) {
	res := make([]rowResult, len(rows))
	p.refused = p.refused[:0]
	now := p.r.clock.Now()
	var topics []string
	for i := range rows {
		act, err := p.r.router.Route(&rows[i].row, now, &res[i].rec)
		res[i].rec.Headers = append([]router.Header(nil), res[i].rec.Headers...) // Route reuses them otherwise
		switch {
		case err != nil:
			res[i].outcome, res[i].err = rowPoison, fmt.Errorf("%s: %w", rows[i].where, err)
		case !act.Emits():
			res[i].outcome = rowPublished // nothing to send: an INSERT always emits, but be safe
			p.r.obs.Dropped(rows[i].row.Table, res[i].rec.Reason)
		default:
			if act == router.EmitWarn {
				p.r.log.Warn("routed a record with a warning", zap.String("table", rows[i].row.Table), zap.String("topic", res[i].rec.Topic),
					zap.ByteString("event_id", res[i].rec.EventID), zap.String("reason", res[i].rec.Reason), zap.String("row", rows[i].where))
			}
			p.r.obs.Routed(rows[i].row.Table, res[i].rec.Topic)
			topics = append(topics, res[i].rec.Topic)
			res[i].outcome = rowHeld // until acknowledged
		}
	}
	if err := p.knowTopics(topics); err != nil {
		return nil, err
	}
	if err := p.rereadTopics(res); err != nil {
		return nil, err
	}
	// Send in order; a key that met a row it cannot publish sends no more.
	blocked := map[string]bool{}
	var recs []*router.Record
	var idx []int
	for i := range rows {
		k := string(rows[i].key)
		if blocked[k] {
			res[i].outcome, res[i].err = rowHeld, nil
			continue
		}
		if res[i].outcome == rowPoison {
			blocked[k] = true
			continue
		}
		if res[i].outcome == rowPublished {
			continue
		}
		if err := p.sendable(&res[i].rec); err != nil {
			res[i].outcome, res[i].err = rowPoison, fmt.Errorf("%s: %w", rows[i].where, err)
			blocked[k] = true
			continue
		}
		recs, idx = append(recs, &res[i].rec), append(idx, i)
	}
	stamps := make([]int64, len(recs))
	for j, i := range idx {
		stamps[j] = rows[i].stamp
	}
	errs, err := p.deliver(recs, stamps)
	if err != nil {
		for k, j := range p.refused {
			p.refused[k] = idx[j]
		}
		return nil, err
	}
	for j, i := range idx {
		if errs[j] != nil {
			res[i].outcome, res[i].err = rowPoison, fmt.Errorf("%s: %w", rows[i].where, errs[j])
		} else {
			res[i].outcome = rowPublished
		}
	}
	// A row published after an earlier row of its key failed is held.
	clear(blocked)
	for i := range rows {
		k := string(rows[i].key)
		switch {
		case blocked[k]:
			if res[i].outcome == rowPublished {
				res[i].outcome = rowHeld
			}
		case res[i].outcome != rowPublished:
			blocked[k] = true
		}
	}
	return res, nil
}

// knowTopics asks about every topic not known yet and waits for the
// answers (kafka.topic.missing.timeout at most for a topic that stays
// missing), so that every row's topic is known before anything is sent:
// a record of a missing topic then fails before later records of its key
// go out. A topic deleted while the relay ran (forgotten by deliver: its
// mark in failed stands no longer) is asked about for what is left of the
// timeout since Kafka refused its record (topicCache.missingFor), as the
// WAL source's gate does.
func (p *rowPublisher) knowTopics(topics []string) error {
	cache := p.r.topics
	if p.r.cfg.Kafka.AutoCreateTopics {
		return nil
	}
	now := p.r.clock.Now()
	waiting := map[string]bool{}
	for _, t := range topics {
		if _, ok := cache.ok[t]; ok || waiting[t] {
			continue
		}
		if f, ok := cache.failed[t]; ok && now.Before(f.until) {
			continue
		}
		waiting[t] = true
		p.checker.Request(t, cache.missingFor(t, now))
	}
	return p.awaitTopics(waiting)
}

// awaitTopics waits for the topic checker's answers about the topics asked
// about (waiting), and records them.
func (p *rowPublisher) awaitTopics(waiting map[string]bool) error {
	for len(waiting) > 0 {
		res, err := p.next(nil)
		if err != nil {
			return err
		}
		if res.ack != nil {
			return fmt.Errorf("relay: an acknowledgement for record %d arrived with nothing in flight", res.ack.Ref)
		}
		p.noteTopic(*res.topic)
		delete(waiting, res.topic.Topic)
	}
	return nil
}

// noteTopic records a topic checker's answer in the topic cache; a topic
// deleted while the relay ran and still missing is poison that says so
// (topicCache.deletedResult).
func (p *rowPublisher) noteTopic(res topicResult) {
	cache := p.r.topics
	res = cache.deletedResult(res)
	if err := res.State.Err; err != nil {
		if kafka.IsPoison(err) {
			err = fmt.Errorf("%w (asked for %s; create the topic, or set kafka.auto.create.topics)", err, cache.ttl)
		}
		cache.failed[res.Topic] = failedTopic{err: err, until: p.r.clock.Now().Add(cache.ttl)}
		return
	}
	delete(cache.failed, res.Topic)
	limit, _ := res.State.MaxMessageBytes()
	cache.ok[res.Topic] = limit
	p.r.learnSettings(res.State)
}

// sendable says why a record can never be produced, if it cannot: its
// topic is missing or not writable, it is larger than the topic or the
// producer accepts (by kafka.RecordSize, the most a record can take), or
// too old for the topic's retention (tooOldForTopic).
func (p *rowPublisher) sendable(rec *router.Record) error {
	cache, kc := p.r.topics, p.r.cfg.Kafka
	size := kafka.RecordSize(rec)
	if size > kc.MaxMessageBytes {
		return &kafka.ProduceError{Topic: rec.Topic, Partition: rec.Partition,
			Err: &kafka.RecordTooLargeError{Topic: rec.Topic, Size: size, Limit: kc.MaxMessageBytes, Option: "kafka.max.message.bytes"}}
	}
	if kc.AutoCreateTopics {
		return nil
	}
	if f, ok := cache.failed[rec.Topic]; ok {
		return &kafka.ProduceError{Topic: rec.Topic, Partition: rec.Partition, Err: f.err}
	}
	if err := p.r.topicRefuses(rec, cache.ok[rec.Topic], cache.settings[rec.Topic], p.r.clock.Now()); err != nil {
		return &kafka.ProduceError{Topic: rec.Topic, Partition: rec.Partition, Err: err}
	}
	return nil
}

// deliver sends recs and waits until Kafka answered for each: errs[i] is
// nil for an acknowledged record and a poison error (kafka.IsPoison) for
// one Kafka can never accept. Any other failure ends the wait with a
// *ProduceError.
func (p *rowPublisher) deliver(recs []*router.Record, stamps []int64) (errs []error, err error) {
	errs = make([]error, len(recs))
	p.refused = p.refused[:0]
	for i, rec := range recs {
		p.prod.Send(rec, kafka.Meta{Ref: uint64(i), Stamp: stamps[i], Held: kafka.RecordSize(rec)})
	}
	var retriable *ProduceError
	acked, resent := make([]bool, len(recs)), make([]bool, len(recs))
	defer func() { p.reportReordered(recs, acked, resent) }()
	for left := len(recs); left > 0; left-- {
		res, err := p.next(p.onWait)
		for err == nil && res.ack == nil { // a topic answer: keep it, wait on
			p.noteTopic(*res.topic)
			res, err = p.next(p.onWait)
		}
		if err != nil {
			return nil, err
		}
		a := *res.ack
		now := p.r.clock.Now()
		if a.Err == nil {
			p.r.obs.Acked(a.Topic, a.Bytes, now.Sub(time.Unix(0, a.Stamp)), now.Sub(a.Sent))
			acked[a.Ref] = true
			continue
		}
		p.r.obs.Failed(a.Topic, a.Err)
		if kafka.IsUnknownTopic(a.Err) {
			// Deleted, most likely (sarama asked for its metadata until
			// it gave up): the next claim's knowTopics asks the topic
			// checker before its rows go to a producer again, and they
			// are poison that says so once it has been missing for
			// kafka.topic.missing.timeout since this record was sent.
			p.r.topics.forget(a.Topic, a.Sent, now)
		}
		if kafka.IsPoison(a.Err) && (p.single || !kafka.IsBatchRefused(a.Err)) {
			errs[a.Ref] = a.Err
			continue
		}
		resent[a.Ref] = true
		if kafka.IsBatchRefused(a.Err) {
			p.refused = append(p.refused, int(a.Ref))
		}
		if retriable == nil {
			retriable = &ProduceError{EventID: string(a.EventID), Topic: a.Topic, Err: a.Err}
			p.r.log.Error("Kafka did not accept a record; the batch is not recorded and will be sent again",
				zap.ByteString("event_id", a.EventID), zap.String("topic", a.Topic), zap.Error(a.Err))
		}
	}
	if retriable != nil {
		return nil, retriable
	}
	return errs, nil
}

// reportReordered names, at Error, the keys whose order Kafka now holds
// broken: a record acknowledged while an earlier record of its key (in
// sequence order) failed, to be sent again (resent). That happens when the broker refuses a whole
// batch and accepts the next (the producer starts a new epoch): the
// earlier record, sent again, lands after the later one. Nothing can take
// it back; consumers that need the order see it here.
func (p *rowPublisher) reportReordered(recs []*router.Record, acked, resent []bool) {
	failed := map[string]int{}
	reported := 0
	for i, rec := range recs {
		k := string(rec.Key)
		if resent[i] {
			if _, ok := failed[k]; !ok {
				failed[k] = i
			}
			continue
		}
		if j, ok := failed[k]; ok && acked[i] && reported < 10 {
			reported++
			p.r.log.Error("Kafka holds a record before an earlier one of its key, which failed and is sent again: the order of this key is broken in the topic",
				zap.ByteString("key", rec.Key), zap.ByteString("event_id", rec.EventID), zap.ByteString("earlier_event_id", recs[j].EventID), zap.String("topic", rec.Topic))
		}
	}
}

// waited is what next got: an acknowledgement or a topic answer.
type waited struct {
	ack   *kafka.Ack
	topic *topicResult
}

// next waits for the next acknowledgement or topic answer. A stop request
// gives it until the stop's budget is spent (errStopTimeout); a second
// signal ends it at once (errForced).
func (p *rowPublisher) next(onWait func(int)) (waited, error) {
	for {
		var stop <-chan struct{}
		if !p.stopping {
			stop = p.ctx.Done()
		}
		wait := time.Second
		if p.stopping {
			wait = min(wait, p.stopBy.Sub(p.r.clock.Now()))
			if wait <= 0 {
				return waited{}, errStopTimeout
			}
		}
		t := p.r.clock.NewTimer(wait)
		select {
		case a, ok := <-p.prod.Acks():
			t.Stop()
			if !ok {
				return waited{}, errors.New("relay: producer closed its acknowledgement channel")
			}
			return waited{ack: &a}, nil
		case res := <-p.checker.Results():
			t.Stop()
			return waited{topic: &res}, nil
		case <-stop:
			t.Stop()
			p.stopping = true
			p.stopBy = p.r.clock.Now().Add(p.r.cfg.Relay.ShutdownTimeout - stopReserve(p.r.cfg.Relay.ShutdownTimeout))
			p.r.log.Info("stopping once Kafka has acknowledged the batch in flight", zap.Duration("budget", p.r.cfg.Relay.ShutdownTimeout))
		case <-p.r.force:
			t.Stop()
			return waited{}, errForced
		case <-t.C():
			if onWait != nil {
				onWait(len(p.prod.Acks()))
			}
		}
	}
}

// deadLetterRecord is the dead-letter record of a row that cannot be
// published, as the WAL source makes it: the record's key and value, or
// for a row the router could not map its columns as a JSON object and its
// key column; headers say why and where it came from (the row's sequence
// number and attempts where the WAL source names the commit LSN). Its
// value is cut, if need be, by deliverDeadLetter.
func (p *rowPublisher) deadLetterRecord(row *pubRow, res *rowResult, seq int64, attempts int) router.Record {
	key, value, topic := res.rec.Key, res.rec.Value, res.rec.Topic
	if res.rec.Topic == "" || !isKafkaRefusal(res.err) {
		key, value, topic = row.key, rowJSON(&row.row), ""
	}
	rec := router.Record{
		Topic:     p.r.cfg.Relay.DeadLetterTopic,
		Key:       key,
		Value:     value,
		Partition: -1,
		Timestamp: p.r.clock.Now(),
		EventID:   res.rec.EventID,
		Headers: []router.Header{
			{Key: "id", Value: res.rec.EventID},
			{Key: "pgoutbox.error.reason", Value: []byte(res.err.Error())},
			{Key: "pgoutbox.source.table", Value: []byte(row.row.Table)},
			{Key: "pgoutbox.source.topic", Value: []byte(topic)},
		},
	}
	if seq > 0 { // a claimed row (a snapshot row has neither)
		rec.Headers = append(rec.Headers,
			router.Header{Key: "pgoutbox.poll.seq", Value: strconv.AppendInt(nil, seq, 10)},
			router.Header{Key: "pgoutbox.poll.attempts", Value: strconv.AppendInt(nil, int64(attempts), 10)})
	}
	return rec
}

// isKafkaRefusal says the error came from Kafka (or the producer's own
// checks), not from the router.
func isKafkaRefusal(err error) bool {
	var pe *kafka.ProduceError
	return errors.As(err, &pe)
}
