package relay

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// debeziumMessage says, once per prefix per session (for the first 100
// prefixes met), at Warn, that Debezium's connector, whose configuration this
// relay was started from, would have written message m to its message
// topic (Messages.Debezium), where pgoutbox writes nothing (see
// writesDebeziumRecord): routed as an outbox event when its prefix is
// messages.prefix, or skipped.
func (s *session) debeziumMessage(m *replication.Message) {
	d := s.r.cfg.Messages.Debezium
	decoded := s.r.cfg.Messages.Format == MessagesDebezium
	if decoded && m.Prefix == s.r.cfg.Messages.Prefix {
		return // routed as Debezium routes it
	}
	if s.debeziumSeen[m.Prefix] || len(s.debeziumSeen) >= 100 {
		return
	}
	if s.debeziumSeen == nil {
		s.debeziumSeen = map[string]bool{}
	}
	// Judged once per prefix: the filters are regular expressions, and
	// the messages of messages.prefix are every table-less event.
	s.debeziumSeen[m.Prefix] = true
	if !d.Writes(m.Prefix) {
		return
	}
	if decoded {
		s.log.Warn("a logical decoding message that Debezium's connector (the --connector configuration) would have decoded and routed as an outbox event (its message.prefix.include.list matches a prefix in either case), and pgoutbox skips: it routes the messages of messages.prefix only, spelt as it is; write them with that prefix",
			zap.String("prefix", m.Prefix), zap.Stringer("lsn", m.LSN), zap.String("messages.prefix", s.r.cfg.Messages.Prefix))
		return
	}
	topic := d.Topic
	if topic == "" {
		topic = "<topic.prefix>.message"
	}
	what := "pgoutbox writes no such record under these converters (it reproduces Debezium's with a JsonConverter value and a StringConverter or JsonConverter key), and skips it"
	switch {
	case s.r.cfg.Messages.Prefix != "" && m.Prefix == s.r.cfg.Messages.Prefix:
		what = "pgoutbox routes it as an outbox event instead (its prefix is messages.prefix), and writes no such record"
	case d.Topic == "":
		what = "without topic.prefix pgoutbox knows no such topic, and skips it"
	case !d.Certain:
		what = "pgoutbox cannot read one of the connector's message.prefix lists (a Java regular expression Go does not compile), so it writes no such records, and skips it"
	case s.r.cfg.Kafka.ExactlyOnce:
		what = "pgoutbox writes no such records under exactly-once, and skips it"
	}
	s.log.Warn("a logical decoding message that Debezium's connector (the --connector configuration) would have written to "+topic+" with its change-event envelope (its EventRouter routes rows, not messages): "+what+"; a consumer of "+topic+" gets nothing from pgoutbox for it. If no one reads that topic, say so in the connector configuration with message.prefix.exclude.list (Debezium then writes none either)",
		zap.String("prefix", m.Prefix), zap.String("debezium_topic", topic), zap.Stringer("lsn", m.LSN), zap.String("messages.prefix", s.r.cfg.Messages.Prefix))
}

// debeziumRecordsOn says whether the relay writes Debezium's message
// records at all (see writesDebeziumRecord): started from a connector
// JSON with topic.prefix, filters Go read, converters whose bytes pgoutbox
// reproduces, exactly-once off, and not Debezium's table-less outbox.
func (c *Config) debeziumRecordsOn() bool {
	d := c.Messages.Debezium
	return d != nil && d.Certain && d.Topic != "" && !c.Kafka.ExactlyOnce && c.Messages.Format != MessagesDebezium &&
		router.IsJSONConverter(c.Router.ValueConverter) &&
		(router.IsStringConverter(c.Router.KeyConverter) || router.IsJSONConverter(c.Router.KeyConverter))
}

// checkDebeziumMessageTopic says at Warn, once per run, when the topic of
// Debezium's message records does not exist (and Kafka does not create
// topics): the first message Debezium would write there waits
// kafka.topic.missing.timeout for it, then follows relay.poison.policy.
// Not a refusal: a database whose writers emit no such message needs none.
func (r *Relay) checkDebeziumMessageTopic(ctx context.Context) {
	d := r.cfg.Messages.Debezium
	if r.dbzTopicChecked || !r.cfg.debeziumRecordsOn() || r.cfg.Kafka.AutoCreateTopics {
		return
	}
	missing, err := r.lookUpTopic(ctx, d.Topic)
	if err != nil {
		return // asked again at the next session
	}
	r.dbzTopicChecked = true
	if missing != nil {
		r.log.Warn("the topic of Debezium's message records does not exist: pgoutbox writes there what Debezium's connector writes for the logical decoding messages its prefix filters let through (but those of messages.prefix), and the first such message waits kafka.topic.missing.timeout for the topic, then follows relay.poison.policy; create it, or leave the messages out with message.prefix.exclude.list in the connector JSON",
			zap.String("topic", d.Topic), zap.Error(missing))
	}
}

// debeziumVersion is the connector version Debezium's records name in
// their source block: the version whose records pgoutbox writes.
const debeziumVersion = "3.6.1.Final"

// writesDebeziumRecord says whether the relay writes, for m, the record
// Debezium's connector writes to its message topic: Debezium would (its
// prefix filters let m through, and Go read every one of them), pgoutbox
// does not route m as an event (another prefix than messages.prefix;
// with messages.format=debezium Debezium routes what its filters let
// through instead), the converters are ones whose bytes pgoutbox
// reproduces (a JsonConverter value; a StringConverter or JsonConverter
// key), and exactly-once is off (its offsets record would take the first
// such record after an upgrade, below its stored position, for a history
// that forked). Otherwise debeziumMessage names the difference.
func (s *session) writesDebeziumRecord(m *replication.Message) bool {
	cfg := s.r.cfg
	d := cfg.Messages.Debezium
	if !cfg.debeziumRecordsOn() || cfg.Messages.Prefix != "" && m.Prefix == cfg.Messages.Prefix {
		return false
	}
	// The filters are regular expressions: judged once per prefix (for
	// the first 1,000 prefixes met).
	writes, ok := s.debeziumWrites[m.Prefix]
	if !ok {
		writes = d.Writes(m.Prefix)
		if s.debeziumWrites == nil {
			s.debeziumWrites = map[string]bool{}
		}
		if len(s.debeziumWrites) < 1000 {
			s.debeziumWrites[m.Prefix] = writes
		}
	}
	return writes
}

// debeziumRecord fills s.rec with the record Debezium 3.6.1's connector
// writes for message m to its message topic, as a real one did (an
// outside oracle's capture): key the MessageKey struct {prefix} (Java's
// Struct{prefix=...} through StringConverter, {"prefix":...} through
// JsonConverter), value its change-event envelope through JsonConverter
// without schemas, op "m", with the source block, "transaction": null and
// the message's prefix and content (base64), and no headers. In the source
// block lsn is the message's LSN, txId its transaction's xid (null when
// not transactional), ts_* its transaction's commit time (for a
// non-transactional message the last commit decoded, or the wall clock
// before any), and sequence ["<end of the last transaction decoded, or the
// last non-transactional message>","<lsn>"], null first after the start
// (both the message's LSN when it is not transactional). The envelope's
// ts_ms is the wall clock, as Debezium's processing time. The record's
// event id, which no header carries, names the message for logs and the
// dead-letter topic.
func (s *session) debeziumRecord(m *replication.Message, now time.Time) {
	cfg := s.r.cfg
	d := cfg.Messages.Debezium
	jstr := func(b []byte, v string) []byte { return router.AppendJacksonString(b, []byte(v)) }
	var key []byte
	if router.IsJSONConverter(cfg.Router.KeyConverter) {
		key = jstr(append(make([]byte, 0, len(m.Prefix)+14), `{"prefix":`...), m.Prefix)
		key = append(key, '}')
	} else {
		key = append(append(append(make([]byte, 0, len(m.Prefix)+15), "Struct{prefix="...), m.Prefix...), '}')
	}
	committed := s.lastCommit
	if committed.IsZero() {
		committed = now
	}
	us := committed.UnixMicro()
	lsn := strconv.FormatUint(uint64(m.LSN), 10)
	seq := `[null,"` + lsn + `"]`
	switch {
	case !m.Transactional:
		seq = `["` + lsn + `","` + lsn + `"]`
	case s.dbzLastCommit != 0:
		seq = `["` + strconv.FormatUint(uint64(s.dbzLastCommit), 10) + `","` + lsn + `"]`
	}
	v := make([]byte, 0, 420+len(d.Name)+len(d.DB)+len(m.Prefix)+base64.StdEncoding.EncodedLen(len(m.Content)))
	v = append(v, `{"op":"m","ts_ms":`...)
	v = strconv.AppendInt(v, now.UnixMilli(), 10)
	v = append(v, `,"source":{"version":"`+debeziumVersion+`","connector":"postgresql","name":`...)
	v = jstr(v, d.Name)
	v = append(v, `,"ts_ms":`...)
	v = strconv.AppendInt(v, floorDiv(us, 1000), 10)
	v = append(v, `,"snapshot":"false","db":`...)
	v = jstr(v, d.DB)
	v = append(v, `,"sequence":`...)
	v = jstr(v, seq)
	v = append(v, `,"ts_us":`...)
	v = strconv.AppendInt(v, us, 10)
	v = append(v, `,"ts_ns":`...)
	v = strconv.AppendInt(v, us*1000, 10)
	v = append(v, `,"schema":"","table":"","txId":`...)
	if m.Transactional {
		v = strconv.AppendUint(v, uint64(s.xid), 10)
	} else {
		v = append(v, "null"...)
	}
	v = append(v, `,"lsn":`...)
	v = append(v, lsn...)
	v = append(v, `,"xmin":null,"origin":null,"origin_lsn":null},"transaction":null,"message":{"prefix":`...)
	v = jstr(v, m.Prefix)
	v = append(v, `,"content":"`...)
	v = base64.StdEncoding.AppendEncode(v, m.Content)
	v = append(v, `"}}`...)
	s.rec = router.Record{Topic: d.Topic, Key: key, Value: v, Timestamp: now, Partition: -1, Headers: s.rec.Headers[:0],
		EventID: []byte("message at " + m.LSN.String())}
}

// floorDiv is a / b rounded down, as Java's Math.floorDiv (an instant
// before 1970 has negative microseconds).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// writeDebeziumRecord sends the record Debezium writes for m (see
// debeziumRecord) as part of the open transaction.
func (s *session) writeDebeziumRecord(m *replication.Message) error {
	s.debeziumRecord(m, s.clock.Now())
	if err := s.tr.Add(1); err != nil {
		return fmt.Errorf("relay: track record: %w", err)
	}
	s.hasRecords = true
	s.r.obs.Routed("message:"+m.Prefix, s.rec.Topic)
	s.send(&s.rec, s.meta(&s.rec, nil, s.cur, s.commitTime))
	return nil
}
