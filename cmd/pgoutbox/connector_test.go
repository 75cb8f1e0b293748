package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestConnectorImportMapsDebeziumSettings(t *testing.T) {
	conn, err := readConnector("testdata/connector.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg := defaultFileConfig()
	ignored, err := applyConnector(&cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"dsn", cfg.Postgres.DSN, "postgres://debezium:s3cret-pa55@orders-db.internal:5432/orders?sslmode=disable"},
		{"slot", cfg.Postgres.Slot, "orders_outbox"},
		{"publication", cfg.Postgres.Publication, "orders_outbox_pub"},
		{"autocreate", cfg.Postgres.PublicationAutocreate, "filtered"},
		{"tables (regex dot unescaped)", strings.Join(cfg.Postgres.Tables, ","), "public.outbox"},
		{"router replacement", cfg.Router.RouteTopicReplacement, "orders.${routedByValue}.events"},
		{"router placement", cfg.Router.AdditionalPlacement, "type:header:eventType"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if strings.Join(ignored, ",") != "heartbeat.interval.ms,tasks.max,tombstones.on.delete" {
		t.Errorf("ignored keys: %v", ignored)
	}
}

func TestConnectorImportRefusesWhatItCannotHonour(t *testing.T) {
	base := map[string]string{
		"connector.class":        postgresConnector,
		"transforms":             "outbox",
		"transforms.outbox.type": eventRouter,
		"key.converter":          "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter",
	}
	cases := map[string]struct {
		key, value, want string
	}{
		"decoderbufs":         {"plugin.name", "decoderbufs", "pgoutput only"},
		"snapshot only":       {"snapshot.mode", "initial_only", "initial"},
		"regex tables":        {"table.include.list", "public.outbox_.*", "regular expression"},
		"other transform":     {"transforms", "outbox,unwrap", "transforms.unwrap.type"},
		"config provider":     {"database.password", "${file:/secrets:pw}", "connector.config.providers"},
		"drop slot":           {"slot.drop.on.stop", "true", "loses every event"},
		"unknown router opt":  {"transforms.outbox.no.such.option", "x", "no.such.option"},
		"transaction topic":   {"provide.transaction.metadata", "true", "transaction metadata"},
		"wrong connector":     {"connector.class", "io.debezium.connector.mysql.MySqlConnector", "connector.class"},
		"bad autocreate mode": {"publication.autocreate.mode", "sometimes", "publication.autocreate.mode"},
		// Value modes other than Debezium's defaults change the bytes of
		// typed columns, which pgoutbox reproduces at the defaults only.
		"decimals as strings":   {"decimal.handling.mode", "string", "decimal.handling.mode=precise"},
		"times as connect":      {"time.precision.mode", "connect", "time.precision.mode=adaptive"},
		"intervals as ISO":      {"interval.handling.mode", "string", "interval.handling.mode=numeric"},
		"bytes as hex":          {"binary.handling.mode", "hex", "binary.handling.mode=bytes"},
		"JSON decimals numeric": {"value.converter.decimal.format", "NUMERIC", "value.converter.decimal.format=BASE64"},
		// Masking and truncation ignored would send what was meant to be
		// hidden.
		"masked column":     {"column.mask.with.12.chars", "public.outbox.payload", "does not mask"},
		"hashed column":     {"column.mask.hash.SHA-256.with.salt.x", "public.outbox.aggregateid", "does not mask"},
		"truncated column":  {"column.truncate.to.20.chars", "public.outbox.payload", "does not truncate"},
		"custom converters": {"converters", "isbn", "Java code"},
	}
	// The defaults, given, are accepted.
	for k, v := range connectorValueModes {
		conn := map[string]string{k: strings.ToLower(v)}
		for bk, bv := range base {
			conn[bk] = bv
		}
		cfg := defaultFileConfig()
		if _, err := applyConnector(&cfg, conn); err != nil {
			t.Errorf("%s=%s (the default) refused: %v", k, v, err)
		}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			conn := map[string]string{}
			for k, v := range base {
				conn[k] = v
			}
			conn[c.key] = c.value
			cfg := defaultFileConfig()
			_, err := applyConnector(&cfg, conn)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error mentioning %q, got %v", c.want, err)
			}
		})
	}
}

func TestBareConfigMapIsAccepted(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.json")
	body := `{"connector.class": "` + postgresConnector + `", "database.port": 6543, "database.hostname": "db", "transforms": "r", "transforms.r.type": "` + eventRouter + `", "key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter", "transforms.r.route.tombstone.on.empty.payload": true}`
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := readConnector(p)
	if err != nil {
		t.Fatal(err)
	}
	cfg := defaultFileConfig()
	if _, err := applyConnector(&cfg, conn); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cfg.Postgres.DSN, "db:6543") || !cfg.Router.RouteTombstoneOnEmptyPayload {
		t.Fatalf("dsn %q tombstone %v", cfg.Postgres.DSN, cfg.Router.RouteTombstoneOnEmptyPayload)
	}
}

func TestConvertPrintsNativeYAMLWithoutThePassword(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"convert", "testdata/connector.json"}, nil, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if strings.Contains(out.String(), "s3cret-pa55") {
		t.Fatal("convert printed the database password")
	}
	// What convert prints loads back into the same configuration.
	p := filepath.Join(t.TempDir(), "converted.yaml")
	if err := os.WriteFile(p, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(p, nil)
	if err != nil {
		t.Fatalf("converted YAML does not load: %v\n%s", err, out.String())
	}
	if cfg.Postgres.Slot != "orders_outbox" || cfg.Router.RouteTopicReplacement != "orders.${routedByValue}.events" ||
		cfg.Postgres.DSN != "postgres://debezium@orders-db.internal:5432/orders?sslmode=disable" {
		t.Fatalf("round trip lost settings: %+v", cfg.Postgres)
	}
}

// TestConnectorSnapshotModeInitialMapsToTheInitialSnapshot: Debezium's
// snapshot.mode=initial becomes pgoutbox's snapshot.mode initial (the rows
// already in the outbox tables, then the stream); no_data stays no_data.
func TestConnectorSnapshotModeInitialMapsToTheInitialSnapshot(t *testing.T) {
	for mode, want := range map[string]string{"initial": "initial", "no_data": "no_data", "never": "no_data"} {
		conn := map[string]string{"connector.class": postgresConnector, "transforms": "outbox",
			"transforms.outbox.type": eventRouter, "snapshot.mode": mode, "key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
		cfg := defaultFileConfig()
		cfg.Snapshot.Mode = "initial" // the file's, which the connector's overrides
		if _, err := applyConnector(&cfg, conn); err != nil {
			t.Fatalf("snapshot.mode=%s: %v", mode, err)
		}
		if cfg.Snapshot.Mode != want {
			t.Errorf("snapshot.mode=%s: pgoutbox's snapshot.mode is %q, want %q", mode, cfg.Snapshot.Mode, want)
		}
	}
}

// TestConnectorWithoutSlotOrPublicationMeansDebeziumsDefaults: a connector
// JSON that leaves out slot.name, publication.name and snapshot.mode means
// what it means to Debezium ("debezium", "dbz_publication", "initial"):
// with pgoutbox's own names, a migration would create a new slot and skip
// the events pending in Debezium's. The environment still overrides them.
func TestConnectorWithoutSlotOrPublicationMeansDebeziumsDefaults(t *testing.T) {
	conn := map[string]string{"connector.class": postgresConnector, "transforms": "outbox", "transforms.outbox.type": eventRouter, "key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
	cfg := defaultFileConfig()
	cfg.Postgres.Slot, cfg.Postgres.Publication = "from_the_file", "from_the_file"
	if _, err := applyConnector(&cfg, conn); err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.Slot != "debezium" || cfg.Postgres.Publication != "dbz_publication" || cfg.Snapshot.Mode != "initial" {
		t.Fatalf("slot %q, publication %q, snapshot.mode %q; want Debezium's defaults", cfg.Postgres.Slot, cfg.Postgres.Publication, cfg.Snapshot.Mode)
	}
	// Debezium's slot is used, never made: a deployment that relied on
	// pgoutbox's own default would otherwise move to a new slot silently.
	if cfg.Postgres.CreateSlot {
		t.Fatal("a slot named by Debezium's default would be created")
	}
	named := map[string]string{"slot.name": "orders"}
	maps.Copy(named, conn)
	cfg = defaultFileConfig()
	if _, err := applyConnector(&cfg, named); err != nil || cfg.Postgres.Slot != "orders" || !cfg.Postgres.CreateSlot {
		t.Fatalf("with slot.name: slot %q, create %v (%v); want it created when missing", cfg.Postgres.Slot, cfg.Postgres.CreateSlot, err)
	}
	p := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(p, []byte(`{"connector.class": "`+postgresConnector+`", "transforms": "r", "transforms.r.type": "`+eventRouter+`", "key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newFlags("run", &bytes.Buffer{}, "")
	c.connector = p
	got, err := c.load(nil, []string{"PGOUTBOX_POSTGRES_SLOT_NAME=from_env"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Postgres.Slot != "from_env" || got.Postgres.Publication != "dbz_publication" {
		t.Fatalf("with the environment: slot %q, publication %q", got.Postgres.Slot, got.Postgres.Publication)
	}
}

// In TestConvertAndRunAgreeOnEveryConnector's cases, "" leaves a key out;
// these stand for the JSON values null and "".
const (
	jsonNull  = "\x00null"
	jsonEmpty = "\x00empty"
)

// TestConvertAndRunAgreeOnEveryConnector feeds the same connector
// configurations to `convert` and to `run --connector`: convert accepts
// exactly those that run accepts (run then fails to reach the database on
// port 1, exit 3, instead of refusing the configuration, exit 2).
func TestConvertAndRunAgreeOnEveryConnector(t *testing.T) {
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "db.properties"), []byte("# mounted\nuser = app\npassword=s3cret\\=x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "slot"), []byte("orders_slot"), 0o600); err != nil {
		t.Fatal(err)
	}
	jsonConv := "org.apache.kafka.connect.json.JsonConverter"
	cases := []struct {
		name   string
		set    map[string]string
		env    []string
		accept bool
	}{
		{"base", nil, nil, true},
		{"json value without schemas.enable", map[string]string{"value.converter": jsonConv}, nil, false},
		{"json value, schemas off", map[string]string{"value.converter": jsonConv, "value.converter.schemas.enable": "false"}, nil, true},
		{"regex that does not compile", map[string]string{"transforms.outbox.route.topic.regex": "(?<x>a"}, nil, false},
		{"bad op behavior", map[string]string{"transforms.outbox.table.op.invalid.behavior": "panic"}, nil, false},
		{"bad slot name", map[string]string{"slot.name": "Bad-Slot"}, nil, false},
		{"status interval too long", map[string]string{"status.update.interval.ms": "60000"}, nil, false},
		{"json headers without schemas.enable", map[string]string{"header.converter": jsonConv}, nil, false},
		{"json headers", map[string]string{"header.converter": jsonConv, "header.converter.schemas.enable": "false"}, nil, true},
		{"string header converter", map[string]string{"header.converter": "org.apache.kafka.connect.storage.StringConverter"}, nil, false},
		{"errors.tolerance all", map[string]string{"errors.tolerance": "all", "errors.log.enable": "true", "errors.log.include.messages": "true"}, nil, true},
		{"errors.tolerance other", map[string]string{"errors.tolerance": "some"}, nil, false},
		{"skipped inserts", map[string]string{"skipped.operations": "c,d"}, nil, false},
		{"skipped updates", map[string]string{"skipped.operations": "u,t"}, nil, true},
		{"tombstones and heartbeats", map[string]string{"tombstones.on.delete": "true", "heartbeat.interval.ms": "10000", "heartbeat.action.query": "UPDATE hb SET ts = now()"}, nil, true},
		{"one message prefix", map[string]string{"message.prefix.include.list": "outbox"}, nil, true},
		{"two message prefixes", map[string]string{"message.prefix.include.list": "a,b"}, nil, true},
		{"message prefix patterns", map[string]string{"message.prefix.include.list": "audit.*", "message.prefix.exclude.list": ".*"}, nil, true},
		{"fixed topic and replacement", map[string]string{"transforms.outbox.route.topic": "orders", "transforms.outbox.route.topic.replacement": "x.${routedByValue}"}, nil, false},
		{"constant replacement that is no topic", map[string]string{"transforms.outbox.route.topic.replacement": "all events"}, nil, false},
		{"constant replacement", map[string]string{"transforms.outbox.route.topic.replacement": "all.events"}, nil, true},
		{"extended headers without topic.prefix", map[string]string{"topic.prefix": "", "extended.headers.enabled": "true"}, nil, false},
		{"extended headers off", map[string]string{"extended.headers.enabled": "false"}, nil, true},
		{"initial snapshot", map[string]string{"snapshot.mode": "initial"}, nil, true},
		{"snapshot only", map[string]string{"snapshot.mode": "initial_only"}, nil, false},
		{"schema version and tracing", map[string]string{"transforms.outbox.table.field.event.schema.version": "version",
			"transforms.outbox.tracing.span.context.field": "tracingspancontext", "transforms.outbox.tracing.operation.name": "read"}, nil, true},
		{"bad autocreate mode", map[string]string{"publication.autocreate.mode": "sometimes"}, nil, false},
		{"decoderbufs", map[string]string{"plugin.name": "decoderbufs"}, nil, false},
		{"avro keys", map[string]string{"key.converter": "io.confluent.connect.avro.AvroConverter"}, nil, false},
		{"string values expanded", map[string]string{"value.converter": "org.apache.kafka.connect.storage.StringConverter", "transforms.outbox.table.expand.json.payload": "true"}, nil, false},
		{"provider not configured", map[string]string{"database.password": "${file:" + secrets + "/db.properties:password}"}, nil, false},
		{"file and dir providers", map[string]string{"database.password": "${file:" + secrets + "/db.properties:password}",
			"database.user": "${file:" + secrets + "/db.properties:user}", "slot.name": "${dir:" + secrets + ":slot}"},
			[]string{"PGOUTBOX_CONNECTOR_CONFIG_PROVIDERS=file,dir"}, true},
		{"missing key in a file", map[string]string{"database.password": "${file:" + secrets + "/db.properties:nope}"},
			[]string{"PGOUTBOX_CONNECTOR_CONFIG_PROVIDERS=file"}, false},
		{"env provider", map[string]string{"database.dbname": "${env:PGOUTBOX_TEST_CONNECTOR_DB}"},
			[]string{"PGOUTBOX_CONNECTOR_CONFIG_PROVIDERS=env"}, true},
		// Kafka Connect takes them from the worker, which pgoutbox cannot see.
		{"converters left to the worker", map[string]string{"key.converter": "", "value.converter": ""}, nil, false},
		{"value converter left to the worker", map[string]string{"value.converter": ""}, nil, false},
		{"env provider, variable unset", map[string]string{"database.dbname": "${env:PGOUTBOX_TEST_NO_SUCH_VARIABLE}"},
			[]string{"PGOUTBOX_CONNECTOR_CONFIG_PROVIDERS=env"}, false},
		// An empty include list is every table or prefix to Debezium, and
		// would be none to pgoutbox: refused. null is an absent key.
		{"empty table list", map[string]string{"table.include.list": jsonEmpty}, nil, false},
		{"blank table list", map[string]string{"table.include.list": " , "}, nil, false},
		{"null table list", map[string]string{"table.include.list": jsonNull}, nil, true},
		// Debezium's filters of the message records it writes, which set
		// nothing in pgoutbox: empty is no filter to both.
		{"empty message prefix", map[string]string{"message.prefix.include.list": jsonEmpty}, nil, true},
		{"blank message prefix", map[string]string{"message.prefix.include.list": " "}, nil, true},
		{"null message prefix", map[string]string{"message.prefix.include.list": jsonNull}, nil, true},
		{"null snapshot mode (Debezium's initial)", map[string]string{"snapshot.mode": jsonNull}, nil, true},
		// Kafka Connect's per-connector producer overrides.
		{"producer overrides", map[string]string{"producer.override.bootstrap.servers": "127.0.0.1:1", "producer.override.max.request.size": "5242880",
			"producer.override.compression.type": "zstd", "producer.override.acks": "all", "producer.override.linger.ms": "5"}, nil, true},
		{"producer override of an unknown compression", map[string]string{"producer.override.compression.type": "brotli"}, nil, false},
		{"producer override of a size that is none", map[string]string{"producer.override.max.request.size": "big"}, nil, false},
		{"producer override of the security protocol", map[string]string{"producer.override.security.protocol": "SASL_SSL"}, nil, false},
		{"producer override of no broker", map[string]string{"producer.override.bootstrap.servers": " , "}, nil, false},
		{"producer override of the partitioner", map[string]string{"producer.override.partitioner.class": "org.apache.kafka.clients.producer.RoundRobinPartitioner"}, nil, false},
		{"producer override of the default partitioner", map[string]string{"producer.override.partitioner.class": "org.apache.kafka.clients.producer.internals.DefaultPartitioner"}, nil, true},
		{"producer override ignoring keys", map[string]string{"producer.override.partitioner.ignore.keys": "true"}, nil, false},
		{"producer override keeping keys", map[string]string{"producer.override.partitioner.ignore.keys": "false"}, nil, true},
		// Debezium's table-less outbox: its message decoder before the
		// EventRouter, for one prefix, values through JsonConverter.
		{"decoded messages", decoded(nil), nil, true},
		{"decoded messages, nulls left out", decoded(map[string]string{"transforms.decode.fields.null.include": "false"}), nil, true},
		{"decoded messages with nulls", decoded(map[string]string{"transforms.decode.fields.null.include": "true"}), nil, false},
		{"decoded messages of every prefix", decoded(map[string]string{"message.prefix.include.list": ""}), nil, false},
		{"decoded messages of two prefixes", decoded(map[string]string{"message.prefix.include.list": "a,b"}), nil, false},
		{"decoded messages of a pattern", decoded(map[string]string{"message.prefix.include.list": "out.*"}), nil, false},
		{"decoded messages of a dotted prefix", decoded(map[string]string{"message.prefix.include.list": "com.acme.outbox"}), nil, true},
		{"decoded messages of a prefix with escaped dots", decoded(map[string]string{"message.prefix.include.list": `com\.acme\.outbox`}), nil, true},
		{"decoded messages through StringConverter", decoded(map[string]string{"value.converter": "org.apache.kafka.connect.storage.StringConverter"}), nil, false},
		{"decoder after the EventRouter", decoded(map[string]string{"transforms": "outbox,decode"}), nil, false},
		{"decoder with a predicate", decoded(map[string]string{"transforms.decode.predicate": "p"}), nil, false},
	}
	t.Setenv("PGOUTBOX_TEST_CONNECTOR_DB", "orders")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn := map[string]any{
				"connector.class": postgresConnector, "database.hostname": "127.0.0.1", "database.port": "1",
				"database.user": "app", "database.dbname": "orders", "topic.prefix": "orders",
				"plugin.name": "pgoutput", "slot.name": "orders_outbox", "snapshot.mode": "no_data",
				"transforms": "outbox", "transforms.outbox.type": eventRouter,
				"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter",
			}
			for k, v := range c.set {
				switch v {
				case "":
					delete(conn, k)
				case jsonNull:
					conn[k] = nil
				case jsonEmpty:
					conn[k] = ""
				default:
					conn[k] = v
				}
			}
			body, err := json.Marshal(map[string]any{"name": "c", "config": conn})
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "connector.json")
			if err := os.WriteFile(p, body, 0o600); err != nil {
				t.Fatal(err)
			}
			var out, convErr bytes.Buffer
			convCode := run([]string{"convert", p}, c.env, &out, &convErr)
			var runOut, runErr bytes.Buffer
			runCode := run([]string{"run", "--connector", p, "--brokers", "127.0.0.1:1", "--log-format", "json"}, c.env, &runOut, &runErr)
			if (convCode == exitOK) != (runCode != exitConfig) {
				t.Fatalf("convert exit %d, run exit %d\nconvert: %s\nrun: %s", convCode, runCode, convErr.String(), runErr.String())
			}
			if (convCode == exitOK) != c.accept {
				t.Fatalf("convert exit %d, want acceptance %v: %s", convCode, c.accept, convErr.String())
			}
			if !c.accept && runCode != exitConfig {
				t.Fatalf("run exit %d, want %d: %s", runCode, exitConfig, runErr.String())
			}
			if strings.Contains(out.String()+convErr.String()+runOut.String()+runErr.String(), "s3cret") {
				t.Fatal("a password from a config provider was printed")
			}
		})
	}
}

// convertConnector writes the connector JSON body to a file, runs pgoutbox
// convert on it and returns its configuration, its output and the file.
func convertConnector(t *testing.T, body any) (cfg fileConfig, out, path string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "connector.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, errOut bytes.Buffer
	if code := run([]string{"convert", p}, nil, &stdout, &errOut); code != exitOK {
		t.Fatalf("convert: exit %d: %s", code, errOut.String())
	}
	if err := yaml.Unmarshal(stdout.Bytes(), &cfg); err != nil {
		t.Fatalf("convert's output: %v\n%s", err, stdout.String())
	}
	return cfg, stdout.String(), p
}

// decoded is a connector with Debezium's DecodeLogicalDecodingMessageContent
// before its EventRouter, over set.
func decoded(set map[string]string) map[string]string {
	out := map[string]string{"transforms": "decode,outbox", "transforms.decode.type": decodeMessages,
		"message.prefix.include.list": "outbox", "value.converter": "org.apache.kafka.connect.json.JsonConverter",
		"value.converter.schemas.enable": "false"}
	maps.Copy(out, set)
	return out
}

// TestConnectorProducerOverridesAreHonoured: a connector whose records
// Kafka Connect sent to another cluster (producer.override.bootstrap.servers),
// larger than Kafka's default (max.request.size) or compressed
// (compression.type) gets the same from pgoutbox; ignored, the events
// went to a cluster its consumers do not read, and records Debezium sent
// were refused as too large. A kafka.brokers that names another cluster,
// in the file or the environment, is refused.
func TestConnectorProducerOverridesAreHonoured(t *testing.T) {
	conn := map[string]any{"name": "c", "config": map[string]any{
		"connector.class": postgresConnector, "database.hostname": "127.0.0.1", "database.dbname": "orders", "topic.prefix": "orders",
		"plugin.name": "pgoutput", "snapshot.mode": "no_data", "transforms": "outbox", "transforms.outbox.type": eventRouter,
		"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter",
		"producer.override.bootstrap.servers": "kafka-b:9092, kafka-a:9092", "producer.override.max.request.size": "5242880",
		"producer.override.compression.type": "ZSTD",
	}}
	got, _, p := convertConnector(t, conn)
	if !slices.Equal(got.Kafka.Brokers, []string{"kafka-b:9092", "kafka-a:9092"}) || got.Kafka.MaxMessageBytes != 5242880 || got.Kafka.Compression != "zstd" {
		t.Fatalf("convert made brokers %v, max.message.bytes %d, compression %q of the producer overrides", got.Kafka.Brokers, got.Kafka.MaxMessageBytes, got.Kafka.Compression)
	}
	for name, env := range map[string][]string{
		"the same brokers in another order": {"PGOUTBOX_KAFKA_BROKERS=kafka-a:9092,kafka-b:9092"},
		"another cluster":                   {"PGOUTBOX_KAFKA_BROKERS=kafka-c:9092"},
	} {
		var vOut, vErr bytes.Buffer
		code := run([]string{"validate", "--config-only", "--connector", p}, env, &vOut, &vErr)
		refused := code == exitConfig && strings.Contains(vErr.String(), "producer.override.bootstrap.servers")
		if refused != (name == "another cluster") {
			t.Errorf("%s: validate --config-only exit %d: %s%s", name, code, vOut.String(), vErr.String())
		}
	}
}

// TestRunPrintsARouterOptionErrorOnce: each bad router option is reported
// once, not once by the router section's check and again by the routes'.
func TestRunPrintsARouterOptionErrorOnce(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"run", "--dsn", "postgres://u@127.0.0.1:1/d", "--brokers", "127.0.0.1:1"},
		[]string{"PGOUTBOX_ROUTER_TABLE_OP_INVALID_BEHAVIOR=panic"}, &out, &errOut)
	if code != exitConfig {
		t.Fatalf("exit %d, want %d: %s", code, exitConfig, errOut.String())
	}
	if n := strings.Count(errOut.String(), "table.op.invalid.behavior"); n != 1 {
		t.Fatalf("the option error is printed %d times:\n%s", n, errOut.String())
	}
}

// TestConnectorWithoutTableIncludeListSaysSo: without table.include.list
// Debezium captures every table of its publication; pgoutbox relays its
// configured tables only (public.outbox by default), so convert and run
// must say so with the ignored keys, and say nothing once it is set.
func TestConnectorWithoutTableIncludeListSaysSo(t *testing.T) {
	conn := map[string]string{"connector.class": postgresConnector, "transforms": "outbox", "transforms.outbox.type": eventRouter, "key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
	cfg := defaultFileConfig()
	ignored, err := applyConnector(&cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, k := range describeIgnored(ignored) {
		found = found || (strings.HasPrefix(k, tablesNotListed) && strings.Contains(k, "every table"))
	}
	if !found {
		t.Fatalf("ignored %v: no word of the missing table.include.list", describeIgnored(ignored))
	}
	conn["table.include.list"] = "public.outbox"
	cfg = defaultFileConfig()
	if ignored, err = applyConnector(&cfg, conn); err != nil || slices.Contains(ignored, tablesNotListed) {
		t.Fatalf("with table.include.list: ignored %v (%v)", ignored, err)
	}
}

// TestConnectorNullIsAnAbsentKey: a key whose JSON value is null means
// what leaving it out means (Debezium's default, pgoutbox's tables and
// prefix), never an empty value: an empty table.include.list would relay
// no table and an empty prefix no table-less message.
func TestConnectorNullIsAnAbsentKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.json")
	body := `{"config": {"connector.class": "` + postgresConnector + `", "transforms": "r", "transforms.r.type": "` + eventRouter + `",
		"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter",
		"table.include.list": null, "message.prefix.include.list": null, "snapshot.mode": null, "slot.name": null}}`
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := readConnector(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"table.include.list", "message.prefix.include.list", "snapshot.mode", "slot.name"} {
		if v, ok := conn[k]; ok {
			t.Errorf("%s: null read as %q, want the key left out", k, v)
		}
	}
	cfg := defaultFileConfig()
	ignored, err := applyConnector(&cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Postgres.Tables, ","); got != "public.outbox" || !slices.Contains(ignored, tablesNotListed) {
		t.Errorf("tables %q (ignored %v), want pgoutbox's public.outbox and the word that Debezium would capture more", got, ignored)
	}
	if cfg.Messages.Prefix != "outbox" || cfg.Snapshot.Mode != "initial" || cfg.Postgres.Slot != "debezium" {
		t.Errorf("prefix %q, snapshot.mode %q, slot %q: want outbox, initial, debezium", cfg.Messages.Prefix, cfg.Snapshot.Mode, cfg.Postgres.Slot)
	}
}

// TestConnectorRefusesEmptyIncludeLists: the error names the key and says
// why, for an empty or blank table.include.list.
func TestConnectorRefusesEmptyIncludeLists(t *testing.T) {
	for _, c := range []struct{ key, value, want string }{
		{"table.include.list", "", "Debezium reads an empty list as every table"},
		{"table.include.list", " ,, ", "Debezium reads an empty list as every table"},
	} {
		conn := map[string]string{"connector.class": postgresConnector, "transforms": "outbox", "transforms.outbox.type": eventRouter,
			"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter", c.key: c.value}
		cfg := defaultFileConfig()
		_, err := applyConnector(&cfg, conn)
		if err == nil || !strings.Contains(err.Error(), c.key+"=") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%q: got %v, want an error naming the key and saying %q", c.key, c.value, err, c.want)
		}
	}
}

// TestConnectorWithoutSnapshotModeOnThePollSourceSaysWhereInitialCameFrom:
// a connector JSON without snapshot.mode means Debezium's initial, which
// the poll source refuses; the refusal says the JSON has no snapshot.mode
// and what to set, not only that mode initial (which nobody wrote) belongs
// to the WAL source. Set in the JSON or the environment, no_data passes.
func TestConnectorWithoutSnapshotModeOnThePollSourceSaysWhereInitialCameFrom(t *testing.T) {
	write := func(extra string) string {
		p := filepath.Join(t.TempDir(), "c.json")
		body := `{"connector.class": "` + postgresConnector + `", "transforms": "r", "transforms.r.type": "` + eventRouter + `", "slot.name": "orders",
			"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"` + extra + `}`
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	args := func(p string) []string {
		return []string{"validate", "--config-only", "--connector", p, "--dsn", "postgres://u@127.0.0.1:1/d", "--brokers", "127.0.0.1:1"}
	}
	poll := []string{"PGOUTBOX_RELAY_SOURCE=poll"}
	var out, errOut bytes.Buffer
	p := write("")
	if code := run(args(p), poll, &out, &errOut); code != exitConfig ||
		!strings.Contains(errOut.String(), "connector "+p+" has no snapshot.mode, which means Debezium's default, initial") ||
		!strings.Contains(errOut.String(), `set "snapshot.mode": "no_data" in the connector JSON`) {
		t.Fatalf("exit %d, want %d and where initial came from:\n%s", code, exitConfig, errOut.String())
	}
	for name, c := range map[string]struct {
		path string
		env  []string
	}{
		"no_data in the JSON":        {write(`, "snapshot.mode": "no_data"`), poll},
		"no_data in the environment": {p, append([]string{"PGOUTBOX_SNAPSHOT_MODE=no_data"}, poll...)},
	} {
		out.Reset()
		errOut.Reset()
		if code := run(args(c.path), c.env, &out, &errOut); code != exitOK {
			t.Errorf("%s: exit %d, want %d: %s", name, code, exitOK, errOut.String())
		}
	}
	// Written in the JSON, initial is refused by the poll source's own
	// check, which says what to set.
	out.Reset()
	errOut.Reset()
	if code := run(args(write(`, "snapshot.mode": "initial"`)), poll, &out, &errOut); code != exitConfig ||
		!strings.Contains(errOut.String(), "belongs to the WAL source") || !strings.Contains(errOut.String(), "set snapshot.mode to no_data") {
		t.Fatalf("snapshot.mode initial written: exit %d: %s", code, errOut.String())
	}
}

// TestEveryCommandThatLoadsTheConfigurationTakesTheConnector: run, migrate,
// status, validate and cleanup all read --connector (migrate and cleanup
// answered "flag provided but not defined"), and apply it: a key pgoutbox
// cannot honour is refused by each, and migrate --print creates the
// connector's tables and publication.
func TestEveryCommandThatLoadsTheConfigurationTakesTheConnector(t *testing.T) {
	write := func(extra string) string {
		return writeFile(t, `{"config": {"connector.class": "`+postgresConnector+`", "transforms": "r", "transforms.r.type": "`+eventRouter+`",
			"database.hostname": "127.0.0.1", "database.port": 1, "database.dbname": "orders", "database.user": "app",
			"slot.name": "orders_slot", "publication.name": "orders_pub", "table.include.list": "sales.outbox", "snapshot.mode": "no_data",
			"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"`+extra+`}}`)
	}
	refused := write(`, "slot.drop.on.stop": "true"`)
	for _, cmd := range []string{"run", "migrate", "status", "validate", "cleanup"} {
		var out, errOut bytes.Buffer
		code := run([]string{cmd, "--connector", refused, "--brokers", "127.0.0.1:1"}, nil, &out, &errOut)
		if code != exitConfig || !strings.Contains(errOut.String(), "slot.drop.on.stop") {
			t.Errorf("%s --connector: exit %d, want %d refusing slot.drop.on.stop:\n%s%s", cmd, code, exitConfig, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"migrate", "--print", "--connector", write("")}, nil, &out, &errOut); code != exitOK {
		t.Fatalf("migrate --print --connector: exit %d: %s", code, errOut.String())
	}
	if want := `CREATE PUBLICATION "orders_pub" FOR TABLE "sales"."outbox"`; !strings.Contains(out.String(), want) {
		t.Fatalf("migrate --print --connector: the SQL lacks %q:\n%s", want, out.String())
	}
}

// TestConnectorMessagePrefixListsAreDebeziumsFilters: a real Debezium 3.6.1
// wrote every logical decoding message its prefix filters let through to
// <topic.prefix>.message, with its change-event envelope, and its
// EventRouter passed them on unrouted, message.prefix.include.list=outbox
// included (a black-box review against it). The import read that list as
// pgoutbox's messages.prefix, so that an outbox-shaped message Debezium
// wrote to r41a_s11.message went to an aggregate's topic instead. The
// lists now only say which messages Debezium would have written (the run
// names each prefix it meets); messages.prefix stays the file's or
// pgoutbox's default.
func TestConnectorMessagePrefixListsAreDebeziumsFilters(t *testing.T) {
	base := map[string]string{"connector.class": postgresConnector, "transforms": "outbox", "transforms.outbox.type": eventRouter, "topic.prefix": "shop",
		"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
	apply := func(extra map[string]string) fileConfig {
		t.Helper()
		conn := maps.Clone(base)
		maps.Copy(conn, extra)
		cfg := defaultFileConfig()
		cfg.Messages.Prefix = "events" // as the file set it
		if _, err := applyConnector(&cfg, conn); err != nil {
			t.Fatal(err)
		}
		if cfg.Messages.Prefix != "events" || cfg.Messages.Debezium == nil || cfg.Messages.Debezium.Topic != "shop.message" {
			t.Fatalf("%v: messages.prefix %q, Debezium %+v; want the file's events, and Debezium writing to shop.message", extra, cfg.Messages.Prefix, cfg.Messages.Debezium)
		}
		return cfg
	}
	for _, c := range []struct {
		lists  map[string]string
		writes map[string]bool
		none   bool
	}{
		{nil, map[string]bool{"outbox": true, "audit": true}, false},
		{map[string]string{"message.prefix.include.list": "outbox"}, map[string]bool{"outbox": true, "OUTBOX": true, "audit": false, "outbox2": false}, false},
		{map[string]string{"message.prefix.include.list": "aud.*, ord"}, map[string]bool{"audit": true, "ord": true, "orders": false}, false},
		{map[string]string{"message.prefix.exclude.list": "audit"}, map[string]bool{"audit": false, "outbox": true}, false},
		{map[string]string{"message.prefix.exclude.list": ".*"}, map[string]bool{"audit": false, "outbox": false}, true},
		// A list Go cannot read: every prefix written, none excluded.
		{map[string]string{"message.prefix.include.list": "(?<=a)b"}, map[string]bool{"audit": true}, false},
		{map[string]string{"message.prefix.exclude.list": "(?<=a)b"}, map[string]bool{"audit": true}, false},
		// A comma escaped is part of its expression; a pattern that only
		// compiles inside the anchors (Java refuses it) excludes nothing;
		// Java's meaning of a class intersection is kept or refused.
		{map[string]string{"message.prefix.exclude.list": `a\,b`}, map[string]bool{"a,b": false, "b": true, "a": true}, false},
		{map[string]string{"message.prefix.exclude.list": `a)|(.*`}, map[string]bool{"audit": true}, false},
		{map[string]string{"message.prefix.exclude.list": `[a-z&&[^x]]+`}, map[string]bool{"audit": true}, false},
	} {
		d := apply(c.lists).Messages.Debezium
		for prefix, want := range c.writes {
			if d.Writes(prefix) != want {
				t.Errorf("%v: writes %q = %v, want %v", c.lists, prefix, !want, want)
			}
		}
		if writesNoMessage(d) != c.none {
			t.Errorf("%v: writes no message = %v, want %v", c.lists, !c.none, c.none)
		}
	}
}

// TestConnectorDecodedMessagesAreTheTableLessOutbox: a connector with
// Debezium's DecodeLogicalDecodingMessageContent before its EventRouter
// routes the messages of its one message.prefix.include.list prefix as
// outbox rows; convert makes that prefix messages.prefix, read with
// messages.format=debezium, and says nothing of Debezium's raw message
// topic (Debezium writes none there).
func TestConnectorDecodedMessagesAreTheTableLessOutbox(t *testing.T) {
	conn := map[string]string{"connector.class": postgresConnector, "database.hostname": "127.0.0.1", "database.dbname": "orders",
		"topic.prefix": "orders", "plugin.name": "pgoutput", "slot.name": "orders_outbox", "snapshot.mode": "no_data",
		"transforms.outbox.type": eventRouter, "key.converter": "org.apache.kafka.connect.storage.StringConverter"}
	maps.Copy(conn, decoded(map[string]string{"message.prefix.include.list": "orders_events"}))
	got, out, _ := convertConnector(t, map[string]any{"name": "c", "config": conn})
	if got.Messages.Prefix != "orders_events" || got.Messages.Format != "debezium" {
		t.Fatalf("messages %+v, want prefix orders_events, format debezium\n%s", got.Messages, out)
	}
	if strings.Contains(out, "orders.message") {
		t.Fatalf("convert speaks of Debezium's raw message topic, to which Debezium writes nothing here:\n%s", out)
	}
}
