package relay

import (
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// debeziumMessageRecords are the records a real Debezium 3.6.1.Final
// wrote to r42a_c1.message for logical decoding messages (StringConverter
// key, JsonConverter value without schemas, database r42a), captured by an
// outside oracle run on 2026-12-07 and pasted unchanged (but the record of
// a 200,000-byte message): transactional and not, binary and empty
// content, a prefix outside the BMP, with a quote and a backslash, empty.
var debeziumMessageRecords = []struct{ key, value string }{
	{"Struct{prefix=app}", "{\"op\":\"m\",\"ts_ms\":1796668338825,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196828,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[null,\\\"26385120\\\"]\",\"ts_us\":1796668196828926,\"ts_ns\":1796668196828926000,\"schema\":\"\",\"table\":\"\",\"txId\":730,\"lsn\":26385120,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"app\",\"content\":\"aGVsbG8=\"}}"},
	{"Struct{prefix=app}", "{\"op\":\"m\",\"ts_ms\":1796668338825,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196829,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26385168\\\",\\\"26385232\\\"]\",\"ts_us\":1796668196829345,\"ts_ns\":1796668196829345000,\"schema\":\"\",\"table\":\"\",\"txId\":731,\"lsn\":26385232,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"app\",\"content\":\"YWxvbmU=\"}}"},
	{"Struct{prefix=app}", "{\"op\":\"m\",\"ts_ms\":1796668338825,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196829,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26385344\\\",\\\"26385344\\\"]\",\"ts_us\":1796668196829345,\"ts_ns\":1796668196829345000,\"schema\":\"\",\"table\":\"\",\"txId\":null,\"lsn\":26385344,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"app\",\"content\":\"bm9udHg=\"}}"},
	{"Struct{prefix=app}", "{\"op\":\"m\",\"ts_ms\":1796668338826,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196829,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26385424\\\",\\\"26385424\\\"]\",\"ts_us\":1796668196829345,\"ts_ns\":1796668196829345000,\"schema\":\"\",\"table\":\"\",\"txId\":null,\"lsn\":26385424,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"app\",\"content\":\"bm9udHgtaW4tcm9sbGVkYmFjaw==\"}}"},
	{"Struct{prefix=bin}", "{\"op\":\"m\",\"ts_ms\":1796668338826,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196829,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26385424\\\",\\\"26385600\\\"]\",\"ts_us\":1796668196829895,\"ts_ns\":1796668196829895000,\"schema\":\"\",\"table\":\"\",\"txId\":733,\"lsn\":26385600,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"bin\",\"content\":\"AP+A/g==\"}}"},
	{"Struct{prefix=app}", "{\"op\":\"m\",\"ts_ms\":1796668338829,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196830,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26385648\\\",\\\"26385704\\\"]\",\"ts_us\":1796668196830002,\"ts_ns\":1796668196830002000,\"schema\":\"\",\"table\":\"\",\"txId\":734,\"lsn\":26385704,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"app\",\"content\":\"\"}}"},
	{"Struct{prefix=json}", "{\"op\":\"m\",\"ts_ms\":1796668338855,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196830,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26586464\\\",\\\"26586536\\\"]\",\"ts_us\":1796668196830903,\"ts_ns\":1796668196830903000,\"schema\":\"\",\"table\":\"\",\"txId\":736,\"lsn\":26586536,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"json\",\"content\":\"eyJlIjoi8J+YgCJ9\"}}"},
	{"Struct{prefix=préfixe😀}", "{\"op\":\"m\",\"ts_ms\":1796668338855,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196831,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26586584\\\",\\\"26586656\\\"]\",\"ts_us\":1796668196831022,\"ts_ns\":1796668196831022000,\"schema\":\"\",\"table\":\"\",\"txId\":737,\"lsn\":26586656,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"préfixe\\uD83D\\uDE00\",\"content\":\"cC11dGY4\"}}"},
	{"Struct{prefix=q\"b\\s}", "{\"op\":\"m\",\"ts_ms\":1796668338855,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196831,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26586704\\\",\\\"26586768\\\"]\",\"ts_us\":1796668196831119,\"ts_ns\":1796668196831119000,\"schema\":\"\",\"table\":\"\",\"txId\":738,\"lsn\":26586768,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"q\\\"b\\\\s\",\"content\":\"cC1xdW90ZQ==\"}}"},
	{"Struct{prefix=}", "{\"op\":\"m\",\"ts_ms\":1796668338855,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196831,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26586816\\\",\\\"26586880\\\"]\",\"ts_us\":1796668196831222,\"ts_ns\":1796668196831222000,\"schema\":\"\",\"table\":\"\",\"txId\":739,\"lsn\":26586880,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"\",\"content\":\"cC1lbXB0eQ==\"}}"},
	{"Struct{prefix=xapp}", "{\"op\":\"m\",\"ts_ms\":1796668338856,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196831,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26586928\\\",\\\"26586992\\\"]\",\"ts_us\":1796668196831328,\"ts_ns\":1796668196831328000,\"schema\":\"\",\"table\":\"\",\"txId\":740,\"lsn\":26586992,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"xapp\",\"content\":\"cC14YXBw\"}}"},
	{"Struct{prefix=apple}", "{\"op\":\"m\",\"ts_ms\":1796668338856,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196831,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26587040\\\",\\\"26587104\\\"]\",\"ts_us\":1796668196831432,\"ts_ns\":1796668196831432000,\"schema\":\"\",\"table\":\"\",\"txId\":741,\"lsn\":26587104,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"apple\",\"content\":\"cC1hcHBsZQ==\"}}"},
	{"Struct{prefix=abin}", "{\"op\":\"m\",\"ts_ms\":1796668338856,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196831,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26587152\\\",\\\"26587216\\\"]\",\"ts_us\":1796668196831523,\"ts_ns\":1796668196831523000,\"schema\":\"\",\"table\":\"\",\"txId\":742,\"lsn\":26587216,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"abin\",\"content\":\"cC1hYmlu\"}}"},
	{"Struct{prefix=b}", "{\"op\":\"m\",\"ts_ms\":1796668338856,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196831,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26587264\\\",\\\"26587320\\\"]\",\"ts_us\":1796668196831620,\"ts_ns\":1796668196831620000,\"schema\":\"\",\"table\":\"\",\"txId\":743,\"lsn\":26587320,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"b\",\"content\":\"cC1i\"}}"},
	{"Struct{prefix=app}", "{\"op\":\"m\",\"ts_ms\":1796668338856,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196832,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26587368\\\",\\\"26587432\\\"]\",\"ts_us\":1796668196832123,\"ts_ns\":1796668196832123000,\"schema\":\"\",\"table\":\"\",\"txId\":744,\"lsn\":26587432,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"app\",\"content\":\"dDgtMQ==\"}}"},
	{"Struct{prefix=app}", "{\"op\":\"m\",\"ts_ms\":1796668338885,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196832,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26587368\\\",\\\"26587496\\\"]\",\"ts_us\":1796668196832123,\"ts_ns\":1796668196832123000,\"schema\":\"\",\"table\":\"\",\"txId\":744,\"lsn\":26587496,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"app\",\"content\":\"dDgtMg==\"}}"},
	{"Struct{prefix=outbox}", "{\"op\":\"m\",\"ts_ms\":1796668338885,\"source\":{\"version\":\"3.6.1.Final\",\"connector\":\"postgresql\",\"name\":\"r42a_c1\",\"ts_ms\":1796668196832,\"snapshot\":\"false\",\"db\":\"r42a\",\"sequence\":\"[\\\"26587664\\\",\\\"26587848\\\"]\",\"ts_us\":1796668196832205,\"ts_ns\":1796668196832205000,\"schema\":\"\",\"table\":\"\",\"txId\":746,\"lsn\":26587848,\"xmin\":null,\"origin\":null,\"origin_lsn\":null},\"transaction\":null,\"message\":{\"prefix\":\"outbox\",\"content\":\"eyJpZCI6IjFiNGUyOGJhLTJmYTEtMTFkMi04ODNmLTAwMTZkM2NjYTQyNyIsImFnZ3JlZ2F0ZXR5cGUiOiJvcmRlciIsImFnZ3JlZ2F0ZWlkIjoibzkiLCJ0eXBlIjoiQ3JlYXRlZCIsInBheWxvYWQiOnsieCI6MX19\"}}"},
}

// TestDebeziumMessageRecordIsDebeziums: the record the relay writes for a
// message Debezium's connector writes to its message topic has the key
// and value bytes of the real Debezium's, given the same state (the
// message, its transaction's xid and commit time, the end of the last
// transaction decoded, the wall clock). The state is read back from each
// record (its lsn, txId, ts_us, sequence and envelope ts_ms): this holds
// the layout, escaping and formats; the conformance suite holds the state
// itself against the real Debezium. Unit level.
func TestDebeziumMessageRecordIsDebeziums(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Router.KeyConverter, cfg.Router.ValueConverter = router.ConverterString, router.ConverterJSON
	cfg.Messages.Debezium = &DebeziumMessages{Topic: "r42a_c1.message", Name: "r42a_c1", DB: "r42a"}
	s := &session{r: &Relay{cfg: cfg}}
	for i, want := range debeziumMessageRecords {
		var v struct {
			TS     int64 `json:"ts_ms"`
			Source struct {
				TSus     int64   `json:"ts_us"`
				Sequence string  `json:"sequence"`
				TxID     *uint32 `json:"txId"`
				LSN      uint64  `json:"lsn"`
			} `json:"source"`
			Message struct {
				Prefix  string `json:"prefix"`
				Content string `json:"content"`
			} `json:"message"`
		}
		if err := json.Unmarshal([]byte(want.value), &v); err != nil {
			t.Fatal(err)
		}
		content, err := base64.StdEncoding.DecodeString(v.Message.Content)
		if err != nil {
			t.Fatal(err)
		}
		m := &replication.Message{Transactional: v.Source.TxID != nil, LSN: checkpoint.LSN(v.Source.LSN), Prefix: v.Message.Prefix, Content: content}
		s.xid, s.lastCommit, s.dbzLastCommit = 0, time.UnixMicro(v.Source.TSus), 0
		if m.Transactional {
			s.xid = *v.Source.TxID
			var seq []*string
			if err := json.Unmarshal([]byte(v.Source.Sequence), &seq); err != nil {
				t.Fatal(err)
			}
			if seq[0] != nil {
				n, _ := strconv.ParseUint(*seq[0], 10, 64)
				s.dbzLastCommit = checkpoint.LSN(n)
			}
		}
		s.debeziumRecord(m, time.UnixMilli(v.TS))
		if string(s.rec.Key) != want.key || string(s.rec.Value) != want.value || s.rec.Topic != "r42a_c1.message" || len(s.rec.Headers) != 0 {
			t.Errorf("record %d:\n got %s %s %s %v\nwant %s %s", i, s.rec.Topic, s.rec.Key, s.rec.Value, s.rec.Headers, want.key, want.value)
		}
	}
	// A JsonConverter key is the MessageKey struct as JSON.
	s.r.cfg.Router.KeyConverter = router.ConverterJSON
	s.debeziumRecord(&replication.Message{Transactional: true, LSN: 1, Prefix: "préfixe😀"}, time.Unix(0, 0))
	if got := string(s.rec.Key); got != `{"prefix":"préfixe\uD83D\uDE00"}` {
		t.Errorf("JSON key %s", got)
	}
	if !strings.Contains(string(s.rec.Value), `"content":""`) {
		t.Errorf("empty content: %s", s.rec.Value)
	}
}

// TestWhichMessagesGetDebeziumsRecord: the relay writes Debezium's
// record of a message only where Debezium writes one and pgoutbox
// reproduces its bytes: not for a message it routes as an event (of
// messages.prefix; an empty prefix is the table-less outbox off, not a
// prefix), not where Debezium's filters leave it out or Go could not read
// them (a review: an exclude list Go cannot compile was dropped, and the
// relay wrote records Debezium does not), not under converters whose
// bytes it does not reproduce, and not under exactly-once. Unit level.
func TestWhichMessagesGetDebeziumsRecord(t *testing.T) {
	base := func() Config {
		cfg := DefaultConfig()
		cfg.Router.KeyConverter, cfg.Router.ValueConverter = router.ConverterString, router.ConverterJSON
		cfg.Messages.Prefix = "outbox"
		cfg.Messages.Debezium = &DebeziumMessages{Topic: "shop.message", Name: "shop", Certain: true,
			Exclude: []*regexp.Regexp{regexp.MustCompile(`(?i)\Anoise\z`)}}
		return cfg
	}
	for _, c := range []struct {
		name   string
		change func(*Config)
		prefix string
		want   bool
	}{
		{"another prefix", nil, "audit", true},
		{"messages.prefix", nil, "outbox", false},
		{"excluded", nil, "NOISE", false},
		{"the empty prefix", nil, "", true},
		{"the empty prefix, the table-less outbox off", func(c *Config) { c.Messages.Prefix = "" }, "", true},
		{"a list Go could not read", func(c *Config) { c.Messages.Debezium.Certain = false }, "audit", false},
		{"no topic.prefix", func(c *Config) { c.Messages.Debezium.Topic = "" }, "audit", false},
		{"a JSON key", func(c *Config) { c.Router.KeyConverter = router.ConverterJSON }, "audit", true},
		{"a String value", func(c *Config) { c.Router.ValueConverter = router.ConverterString }, "audit", false},
		{"a raw key", func(c *Config) { c.Router.KeyConverter = router.ConverterRaw }, "audit", false},
		{"exactly-once", func(c *Config) { c.Kafka.ExactlyOnce = true }, "audit", false},
		{"Debezium's table-less outbox", func(c *Config) { c.Messages.Format = MessagesDebezium }, "audit", false},
	} {
		cfg := base()
		if c.change != nil {
			c.change(&cfg)
		}
		s := &session{r: &Relay{cfg: cfg}}
		if got := s.writesDebeziumRecord(&replication.Message{Transactional: true, Prefix: c.prefix}); got != c.want {
			t.Errorf("%s: writes %v, want %v", c.name, got, c.want)
		}
	}
}
