package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestConnectorExactlyOnceSupportMapsToTheMode: Kafka Connect's
// exactly.once.support=required turns exactly-once mode on (with the
// connector's offsets.storage.topic as the offsets topic); requested, its
// default, leaves it off; anything else is refused.
func TestConnectorExactlyOnceSupportMapsToTheMode(t *testing.T) {
	base := map[string]string{"connector.class": postgresConnector, "database.dbname": "shop", "topic.prefix": "shop",
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter", "key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
	for _, c := range []struct {
		support, topic string
		want           bool
		wantTopic      string
		refused        bool
	}{
		{support: "required", want: true, wantTopic: "pgoutbox.offsets"},
		{support: "required", topic: "shop.offsets", want: true, wantTopic: "shop.offsets"},
		{support: "REQUIRED", want: true, wantTopic: "pgoutbox.offsets"},
		{support: "requested", wantTopic: "pgoutbox.offsets"},
		{support: "always", refused: true},
	} {
		conn := map[string]string{"exactly.once.support": c.support}
		for k, v := range base {
			conn[k] = v
		}
		if c.topic != "" {
			conn["offsets.storage.topic"] = c.topic
		}
		cfg := defaultFileConfig()
		_, err := applyConnector(&cfg, conn)
		if c.refused {
			if err == nil || !strings.Contains(err.Error(), "exactly.once.support") {
				t.Errorf("%s: got %v, want a refusal naming exactly.once.support", c.support, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.support, err)
		}
		if cfg.Kafka.ExactlyOnce != c.want || cfg.Kafka.OffsetsTopic != c.wantTopic {
			t.Errorf("%s %q: exactly.once %v, offsets.topic %q; want %v, %q", c.support, c.topic, cfg.Kafka.ExactlyOnce, cfg.Kafka.OffsetsTopic, c.want, c.wantTopic)
		}
	}
}

// TestExactlyOnceOptionsLoadAndValidate: the mode is off by default, and
// its options come from the environment like every other and are checked.
func TestExactlyOnceOptionsLoadAndValidate(t *testing.T) {
	cfg, err := loadConfig("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kafka.ExactlyOnce || cfg.Kafka.TransactionalID != "" {
		t.Fatalf("exactly-once is on by default: %+v", cfg.Kafka)
	}
	cfg, err = loadConfig("", []string{"PGOUTBOX_KAFKA_EXACTLY_ONCE=true", "PGOUTBOX_KAFKA_TRANSACTIONAL_ID=orders-outbox",
		"PGOUTBOX_KAFKA_TRANSACTION_TIMEOUT=2m", "PGOUTBOX_KAFKA_TRANSACTION_INTERVAL=-1ms", "PGOUTBOX_KAFKA_OFFSETS_TOPIC=orders.offsets"})
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Kafka
	if !k.ExactlyOnce || k.TransactionalID != "orders-outbox" || k.TransactionTimeout != 2*time.Minute || k.TransactionInterval >= 0 || k.OffsetsTopic != "orders.offsets" {
		t.Fatalf("loaded %+v", k)
	}
	k.Brokers = []string{"kafka:9092"}
	if err := k.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		env, option string
	}{
		{"PGOUTBOX_KAFKA_TRANSACTION_TIMEOUT=500ms", "transaction.timeout"},
		{"PGOUTBOX_KAFKA_TRANSACTION_INTERVAL=40s", "transaction.interval"},
		{"PGOUTBOX_KAFKA_OFFSETS_TOPIC=no/slash", "offsets.topic"},
		{"PGOUTBOX_KAFKA_TRANSACTION_MAX_RECORDS=0", "transaction.max.records"},
	} {
		cfg, err := loadConfig("", []string{"PGOUTBOX_KAFKA_EXACTLY_ONCE=true", bad.env})
		if err == nil {
			cfg.Kafka.Brokers = []string{"kafka:9092"}
			err = cfg.Kafka.Validate()
			if err == nil {
				err = cfg.Kafka.ValidateExplicit()
			}
		}
		if err == nil || !strings.Contains(err.Error(), bad.option) {
			t.Errorf("%s: got %v, want an error naming %s", bad.env, err, bad.option)
		}
	}
}

// TestMigrateRefusesExactlyOnceWhereRunDoes: migrate validates less than
// run, and set up (the offsets topic, the poll table) for configurations
// that run then refused.
func TestMigrateRefusesExactlyOnceWhereRunDoes(t *testing.T) {
	base := []string{"PGOUTBOX_POSTGRES_DSN=postgres://u@127.0.0.1:1/d", "PGOUTBOX_KAFKA_BROKERS=127.0.0.1:1", "PGOUTBOX_KAFKA_EXACTLY_ONCE=true"}
	for _, c := range []struct{ env, want string }{
		{"PGOUTBOX_RELAY_SOURCE=poll", "exactly.once belongs to the WAL source"},
		// (In the file: an empty PGOUTBOX_POSTGRES_STATE_TABLE is refused.)
		{"PGOUTBOX_CONFIG=" + writeFile(t, "postgres:\n  state.table: \"\"\n"), "exactly.once needs postgres.state.table"},
	} {
		env := append(slices.Clone(base), c.env)
		for _, cmd := range []func(args, environ []string, stdout, stderr io.Writer) int{cmdMigrate, cmdRun} {
			r := invoke(cmd, nil, env)
			if r.code != exitConfig || !strings.Contains(r.stderr, c.want) {
				t.Errorf("%s: want exit %d saying %q:\n%s", c.env, exitConfig, c.want, r)
			}
		}
	}
}
