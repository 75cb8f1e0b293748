package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/router"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Postgres.DSN = "postgres://u@127.0.0.1:1/d"
	c.Kafka.Brokers = []string{"127.0.0.1:1"}
	return c
}

func TestValidateReportsARouterOptionOnce(t *testing.T) {
	c := validConfig()
	c.Router.OpInvalidBehavior = "panic"
	err := c.Validate()
	if err == nil || strings.Count(err.Error(), "table.op.invalid.behavior") != 1 {
		t.Fatalf("Validate: %v; want the option named once", err)
	}
}

func TestATablesFixedTopicReplacesTheSectionsRouting(t *testing.T) {
	c := validConfig()
	c.Postgres.Tables = []string{"public.outbox", "public.payments"}
	c.Router.RouteTopicReplacement = "orders.${routedByValue}"
	c.Routes = map[string]map[string]string{"public.payments": {"route.topic": "payments"}}
	s, err := c.RouterSet()
	if err != nil {
		t.Fatal(err)
	}
	row := &router.Row{Table: "public.payments", Op: router.OpInsert, Names: []string{"id", "payload"}, Values: [][]byte{[]byte("1"), []byte("{}")}}
	var rec router.Record
	if _, err := s.Route(row, time.Unix(0, 0), &rec); err != nil || rec.Topic != "payments" {
		t.Fatalf("Route: %v, topic %q", err, rec.Topic)
	}
	// A fixed topic and a replacement in one table's options is refused.
	c.Routes["public.payments"]["route.topic.replacement"] = "p.${routedByValue}"
	if _, err := c.RouterSet(); err == nil || !strings.Contains(err.Error(), "set either route.topic") {
		t.Fatalf("RouterSet: %v", err)
	}
}

func TestExtendedHeadersGetOneRunIDPerConfig(t *testing.T) {
	c := validConfig()
	c.Router.ExtendedHeaders, c.Router.ExtendedHeadersLogicalName = true, "orders"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	id := c.Router.ExtendedHeadersRunID
	if len(id) != 36 {
		t.Fatalf("run id %q", id)
	}
	if _, err := c.RouterSet(); err != nil || c.Router.ExtendedHeadersRunID != id {
		t.Fatalf("RouterSet: %v, run id %q then %q", err, id, c.Router.ExtendedHeadersRunID)
	}
}

// TestExactlyOnceIsRefusedWhereItCannotHold: the poll source is at least
// once (a row is marked after Kafka acknowledged it), and the WAL source
// tells a failover's fork by the state row's timeline; exactly-once
// without them was accepted and held nothing.
func TestExactlyOnceIsRefusedWhereItCannotHold(t *testing.T) {
	c := validConfig()
	c.Kafka.ExactlyOnce = true
	if err := c.Validate(); err != nil {
		t.Fatalf("exactly-once on the WAL source with a state table: %v", err)
	}
	p := c
	p.Relay.Source = SourcePoll
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "exactly.once belongs to the WAL source") {
		t.Fatalf("poll source with exactly-once: %v", err)
	}
	s := c
	s.Postgres.StateTable = ""
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "exactly.once needs postgres.state.table") {
		t.Fatalf("exactly-once without a state table: %v", err)
	}
	s.Kafka.ExactlyOnce = false
	if err := s.Validate(); err != nil {
		t.Fatalf("at-least-once without a state table: %v", err)
	}
}

// TestInFlightBytesMustFitTheRetryBuffer: while a broker is away sarama
// keeps the records in flight in its retry buffer, and when that is full it
// drops records from its middle and sends later ones (their keys' order
// lost). A cap on bytes in flight larger than the buffer is refused, naming
// both options.
func TestInFlightBytesMustFitTheRetryBuffer(t *testing.T) {
	for _, c := range []struct {
		inflight, buffer int64
		eos, refused     bool
	}{
		{8 << 20, 256 << 20, false, false},
		{255 << 20, 256 << 20, false, false},
		{256 << 20, 256 << 20, false, true},
		{300 << 20, 256 << 20, false, true},
		{200 << 20, 256 << 20, true, true},
		{127 << 20, 256 << 20, true, false},
	} {
		cfg := DefaultConfig()
		cfg.Postgres.DSN, cfg.Kafka.Brokers = "postgres://x", []string{"k:9092"}
		cfg.Relay.MaxInFlightBytes, cfg.Kafka.RetryBufferBytes, cfg.Kafka.ExactlyOnce = c.inflight, c.buffer, c.eos
		err := cfg.Validate()
		named := err != nil && strings.Contains(err.Error(), "retry.buffer.bytes") && strings.Contains(err.Error(), "max.inflight.bytes")
		if named != c.refused {
			t.Errorf("in flight %d, buffer %d, exactly-once %v: %v; want refused %v", c.inflight, c.buffer, c.eos, err, c.refused)
		}
	}
}

// TestTwoRoutesKeysForOneTableAreRefused: "team_a_outbox" and
// "public.team_a_outbox" name one table; both were kept under the same
// qualified name, so whichever key Go's map order put last chose the
// table's topic, anew at each start, and nothing said so.
func TestTwoRoutesKeysForOneTableAreRefused(t *testing.T) {
	c := validConfig()
	c.Postgres.Tables = []string{"public.team_a_outbox"}
	c.Routes = map[string]map[string]string{
		"team_a_outbox":        {"route.topic": "x"},
		"public.team_a_outbox": {"route.topic": "y"},
	}
	// Map order varies from run to run: ask several times, so a check that
	// depends on which key comes first cannot pass by luck.
	for range 20 {
		_, err := c.RouterSet()
		if err == nil {
			t.Fatal("RouterSet accepted two routes keys for public.team_a_outbox")
		}
		for _, want := range []string{`"team_a_outbox"`, `"public.team_a_outbox"`, "table public.team_a_outbox"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("RouterSet: %v; want it to name %s", err, want)
			}
		}
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "both name table public.team_a_outbox") {
		t.Fatalf("Validate: %v", err)
	}
	// One key for each of two tables is still fine.
	c.Postgres.Tables = []string{"public.team_a_outbox", "app.team_a_outbox"}
	c.Routes = map[string]map[string]string{
		"team_a_outbox":     {"route.topic": "x"},
		"app.team_a_outbox": {"route.topic": "y"},
	}
	if _, err := c.RouterSet(); err != nil {
		t.Fatalf("RouterSet with two tables: %v", err)
	}
}

// TestMessagesFormat: messages.format is pgoutbox (or empty) or debezium,
// and debezium, which writes payload objects as JsonConverter does, needs
// value.converter=JsonConverter, and a messages.prefix to read.
func TestMessagesFormat(t *testing.T) {
	no := false
	for _, c := range []struct {
		format, converter string
		ok                bool
	}{
		{"", "", true},
		{MessagesPgoutbox, "", true},
		{MessagesDebezium, router.ConverterJSON, true},
		{MessagesDebezium, "JsonConverter", true},
		{MessagesDebezium, "", false},
		{MessagesDebezium, router.ConverterString, false},
		{"jackson", router.ConverterJSON, false},
	} {
		cfg := validConfig()
		cfg.Messages.Format = c.format
		cfg.Router.ValueConverter = c.converter
		if c.converter != "" {
			cfg.Router.ValueConverterSchemasEnable = &no
		}
		if err := cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("format %q, value.converter %q: %v, want ok %v", c.format, c.converter, err, c.ok)
		}
		cfg.Messages.Prefix = "" // the table-less outbox off
		if err := cfg.Validate(); c.format == MessagesDebezium && c.ok && err == nil {
			t.Errorf("format debezium without messages.prefix accepted")
		}
	}
}
