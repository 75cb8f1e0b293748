package relay

import (
	"encoding/base64"
	"encoding/json"
	"strconv"

	"github.com/pgoutbox/pgoutbox/checkpoint"
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
	// A record refused for its size would be refused again: keep the head
	// of it in a JSON object that says so.
	if limit := s.r.cfg.Kafka.MaxMessageBytes / 2; limit > 0 && len(rec.Value) > limit {
		rec.Headers = append(rec.Headers,
			router.Header{Key: "pgoutbox.truncated.from", Value: []byte(strconv.Itoa(len(rec.Value)))})
		rec.Value = truncatedValue(rec.Value, limit)
	}
	chunk, _ := hold.(*replication.Chunk)
	s.r.obs.DeadLettered(s.r.deadLetteredAs(topic))
	s.send(&rec, s.meta(&rec, chunk, id, stamp))
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
