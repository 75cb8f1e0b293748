package relay

import (
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/replication"
)

// debeziumMessage says, once per prefix per session (for the first 100
// prefixes met), at Warn, that Debezium's connector, whose configuration this
// relay was started from, would have written message m to its message
// topic (Messages.Debezium), where pgoutbox writes nothing: skipped, or
// routed as an outbox event when its prefix is messages.prefix.
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
	what := "pgoutbox writes no such records, and skips it"
	if m.Prefix == s.r.cfg.Messages.Prefix {
		what = "pgoutbox routes it as an outbox event instead (its prefix is messages.prefix), and writes no such record"
	}
	s.log.Warn("a logical decoding message that Debezium's connector (the --connector configuration) would have written to "+d.Topic+" with its change-event envelope (its EventRouter routes rows, not messages): "+what+"; a consumer of "+d.Topic+" gets nothing from pgoutbox. If no one reads that topic, say so in the connector configuration with message.prefix.exclude.list (Debezium then writes none either); if someone does, keep Debezium for it",
		zap.String("prefix", m.Prefix), zap.String("debezium_topic", d.Topic), zap.Stringer("lsn", m.LSN), zap.String("messages.prefix", s.r.cfg.Messages.Prefix))
}
