package relay

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// deadLetter produces a poison row or record to the dead-letter topic as a
// record of transaction id, with headers saying why and where it came from.
// key is kept as it was (the aggregate's key), so that a consumer of the
// dead-letter topic can tell which aggregate lost an event. hold is what
// the bytes lie in (a WAL chunk), if anything.
func (s *session) deadLetter(id checkpoint.TxnID, key, value, eventID []byte, reason, table, topic string, lsn checkpoint.LSN, stamp int64, hold any) {
	rec := router.Record{
		Topic:     s.r.cfg.Relay.DeadLetterTopic,
		Key:       key,
		Value:     value,
		Partition: -1,
		Timestamp: s.clock.Now(),
		EventID:   eventID,
		Headers: []router.Header{
			{Key: "id", Value: eventID},
			{Key: "pgoutbox.error.reason", Value: []byte(reason)},
			{Key: "pgoutbox.source.table", Value: []byte(table)},
			{Key: "pgoutbox.source.topic", Value: []byte(topic)},
			{Key: "pgoutbox.commit.lsn", Value: []byte(lsn.String())},
		},
	}
	chunk, _ := hold.(*replication.Chunk)
	if err := s.r.fitDeadLetter(&rec, topic); err != nil {
		// Refused as Kafka would refuse it: the loop stops on it, as on
		// any record the dead-letter topic refuses.
		m := s.meta(&rec, chunk, id, stamp)
		s.eos.sent()
		s.topics.fail(&rec, m, err)
		return
	}
	s.r.obs.DeadLettered(s.r.deadLetteredAs(topic))
	s.send(&rec, s.meta(&rec, chunk, id, stamp))
}

// fitDeadLetter makes rec, a dead-letter record, fit what it is sent to:
// the producer (kafka.max.message.bytes) and the dead-letter topic (its
// max.message.bytes, when known), which may take less than the topic the
// event was meant for (from). A record refused for its size would be
// refused again, at every restart: when the whole record does not fit,
// its value becomes the JSON of truncatedValue, as large as its key and
// headers leave room for, and the header pgoutbox.truncated.from gives
// the value's size. The error, when even that does not fit (its key and
// headers alone are too large), is poison (kafka.IsPoison) and names the
// event and both topics.
func (r *Relay) fitDeadLetter(rec *router.Record, from string) error {
	own := r.cfg.Kafka.MaxMessageBytes
	limit := r.topics.ok[rec.Topic] // 0: not known
	fits := func() error {
		if size := kafka.RecordSize(rec); own > 0 && size > own {
			return &kafka.RecordTooLargeError{Topic: rec.Topic, Size: size, Limit: own, Option: "kafka.max.message.bytes"}
		}
		return r.overTopicLimit(rec, limit)
	}
	if fits() == nil {
		return nil
	}
	value := rec.Value
	rec.Headers = append(rec.Headers, router.Header{Key: "pgoutbox.truncated.from", Value: []byte(strconv.Itoa(len(value)))})
	rec.Value = nil
	room := math.MaxInt
	if own > 0 {
		room = own - kafka.RecordSize(rec)
	}
	if limit > 0 {
		topicRoom := limit - kafka.BatchOverhead - kafka.RecordSize(rec)
		if kafka.Compresses(r.cfg.Kafka.Compression) {
			// Below the size at which overTopicLimit counts a record
			// compressed, which can come out larger.
			topicRoom -= limit/64 + 64
		}
		room = min(room, topicRoom)
	}
	rec.Value = truncatedValue(value, room)
	if err := fits(); err != nil {
		return fmt.Errorf("relay: the dead-letter record of event %s (meant for topic %q, %d bytes of value) does not fit dead-letter topic %q even with its value cut to %d bytes: its key and headers alone are too large: %w",
			rec.EventID, from, len(value), rec.Topic, len(rec.Value), err)
	}
	return nil
}

// deliverDeadLetter sends rec, the dead-letter record of an event meant
// for topic from, for a table source (the poll source, the snapshot): cut
// to what the dead-letter topic takes (fitDeadLetter, once the topic is
// known) and alone, with nothing else in flight, so that a refusal is the
// record's own, never a batch's to send again. refused says why the
// dead-letter topic (or the producer) does not take it: sent again, it
// would be refused again, so the caller stops. err is a failure Kafka may
// recover from, as deliver returns it.
func (p *rowPublisher) deliverDeadLetter(rec *router.Record, stamp int64, from string) (refused, err error) {
	if err := p.knowTopics([]string{rec.Topic}); err != nil {
		return nil, err
	}
	if refused = p.r.fitDeadLetter(rec, from); refused == nil {
		refused = p.sendable(rec)
	}
	if refused != nil {
		return refused, nil
	}
	single := p.single
	p.single = true // alone in its request: a refused batch is the record's
	errs, err := p.deliver([]*router.Record{rec}, []int64{stamp})
	p.single = single
	if err != nil {
		return nil, err
	}
	return errs[0], nil
}

// deadLetteredAs is the topic a dead-lettered event is counted under: the
// one it was meant for, or the dead-letter topic's own name when the row
// could not be routed to one.
func (r *Relay) deadLetteredAs(topic string) string {
	if topic == "" {
		return r.cfg.Relay.DeadLetterTopic
	}
	return topic
}

// truncatedValue replaces a value too large to dead-letter with a JSON
// object of at most limit bytes that a consumer can parse, holding the
// value's size and its first bytes (base64, since they may be any bytes and
// be cut in the middle of a character):
//
//	{"pgoutbox.truncated":true,"size":N,"head_base64":"..."}
func truncatedValue(v []byte, limit int) []byte {
	type truncated struct {
		Truncated bool   `json:"pgoutbox.truncated"`
		Size      int    `json:"size"`
		Head      string `json:"head_base64"`
	}
	empty, _ := json.Marshal(truncated{Truncated: true, Size: len(v)})
	room := limit - len(empty)
	n := base64.StdEncoding.DecodedLen(max(room, 0))
	n -= n % 3 // whole base64 groups: no padding to miscount
	n = min(n, len(v))
	b, _ := json.Marshal(truncated{Truncated: true, Size: len(v), Head: base64.StdEncoding.EncodeToString(v[:n])})
	return b
}

// keyOf is the raw value of the row's key column (table.field.event.key for
// its table), or nil.
func (c *Config) keyOf(row *router.Row) []byte {
	col := c.Router.EventKeyField
	for table, o := range c.Routes {
		if table == row.Table || "public."+table == row.Table {
			if k, ok := o["table.field.event.key"]; ok {
				col = k
			}
		}
	}
	for i, n := range row.Names {
		if n == col && i < len(row.Values) {
			return row.Values[i]
		}
	}
	return nil
}
