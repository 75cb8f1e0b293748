package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pgoutbox.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigLayersFileThenEnvironmentThenFlags(t *testing.T) {
	path := writeFile(t, `
postgres:
  dsn: postgres://file@127.0.0.1:1/db
  slot.name: from_file
  table.include.list: [public.outbox, app.events]
  status.update.interval: 2s
kafka:
  brokers: [127.0.0.1:9092]
  flush.frequency: 5ms
router:
  route.topic.replacement: events.${routedByValue}
relay:
  max.inflight.records: 500
log:
  level: debug
`)
	env := []string{
		"PGOUTBOX_POSTGRES_SLOT_NAME=from_env",
		"PGOUTBOX_KAFKA_BROKERS=a:1, b:2",
		"PGOUTBOX_ROUTER_TABLE_FIELD_EVENT_KEY=aggregate_key",
		"PGOUTBOX_RELAY_SHUTDOWN_TIMEOUT=7s",
		"PGOUTBOX_POSTGRES_RECEIVE_BATCH_WAIT=0s",
	}
	c := newFlags("run", &bytes.Buffer{}, "")
	cfg, err := c.load([]string{"--config", path, "--publication", "from_flag", "--brokers", "c:3"}, env)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"dsn from file", cfg.Postgres.DSN, "postgres://file@127.0.0.1:1/db"},
		{"slot from env over file", cfg.Postgres.Slot, "from_env"},
		{"publication from flag", cfg.Postgres.Publication, "from_flag"},
		{"tables from file", strings.Join(cfg.Postgres.Tables, ","), "public.outbox,app.events"},
		{"duration from file", cfg.Postgres.StatusInterval, 2 * time.Second},
		{"duration from env over the default", cfg.Postgres.ReceiveBatchWait, time.Duration(0)},
		{"brokers from flag over env and file", strings.Join(cfg.Kafka.Brokers, ","), "c:3"},
		{"kafka duration", cfg.Kafka.FlushFrequency, 5 * time.Millisecond},
		{"router option from file", cfg.Router.RouteTopicReplacement, "events.${routedByValue}"},
		{"router option from env", cfg.Router.EventKeyField, "aggregate_key"},
		{"router default kept", cfg.Router.EventIDField, "id"},
		{"relay from file", cfg.Relay.MaxInFlightRecords, 500},
		{"relay from env", cfg.Relay.ShutdownTimeout, 7 * time.Second},
		{"log level", cfg.Log.Level, "debug"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestUnknownConfigKeyIsAnError(t *testing.T) {
	path := writeFile(t, "postgres:\n  slot_name: typo\n")
	_, err := loadConfig(path, nil)
	if err == nil || !strings.Contains(err.Error(), "slot_name") {
		t.Fatalf("want an error naming slot_name, got %v", err)
	}
}

func TestBadEnvironmentValueNamesTheVariable(t *testing.T) {
	_, err := loadConfig("", []string{"PGOUTBOX_RELAY_MAX_INFLIGHT_RECORDS=lots"})
	if err == nil || !strings.Contains(err.Error(), "PGOUTBOX_RELAY_MAX_INFLIGHT_RECORDS") {
		t.Fatalf("want an error naming the variable, got %v", err)
	}
}

func TestUnknownEnvironmentVariableOfASectionIsAnError(t *testing.T) {
	_, err := loadConfig("", []string{"PGOUTBOX_KAFKA_BROKER=k:9092", "PGOUTBOX_RELAY_SHUTDOWN_TIMOUT=5s"})
	if err == nil || !strings.Contains(err.Error(), "PGOUTBOX_KAFKA_BROKER") || !strings.Contains(err.Error(), "PGOUTBOX_RELAY_SHUTDOWN_TIMOUT") {
		t.Fatalf("want an error naming both typos, got %v", err)
	}
	// Variables outside the settings' sections are not pgoutbox's settings.
	if _, err := loadConfig("", []string{"PGOUTBOX_CONFIG=", "PGOUTBOX_TEST_ENV_DIR=/tmp/x", "PGOUTBOX_CPUPROFILE=/tmp/p"}); err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
}

func TestExitCodes(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  []string
		code int
		want string
	}{
		{"no command", nil, nil, exitConfig, "Usage"},
		{"unknown command", []string{"frobnicate"}, nil, exitConfig, "unknown command"},
		{"version", []string{"--version"}, nil, exitOK, "pgoutbox "},
		{"missing dsn", []string{"run", "--brokers", "127.0.0.1:1"}, nil, exitConfig, "dsn is empty"},
		{"bad slot name", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db", "--brokers", "127.0.0.1:1", "--slot", "Bad-Name"}, nil, exitConfig, "slot.name"},
		{"bad log level", []string{"run", "--log-level", "loud"}, nil, exitConfig, "log.level"},
		{"invalid DSN", []string{"run", "--dsn", "postgres://app:s3cr3t@db:port/shop", "--brokers", "127.0.0.1:1"}, nil, exitConfig, "postgres.dsn is not a valid connection string (its text is not shown because it may hold a password): invalid port"},
		{"unknown variable", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db", "--brokers", "127.0.0.1:1"}, []string{"PGOUTBOX_KAFKA_BROKER=x:1"}, exitConfig, "PGOUTBOX_KAFKA_BROKER"},
		{"zero max.message.bytes", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db", "--brokers", "127.0.0.1:1"}, []string{"PGOUTBOX_KAFKA_MAX_MESSAGE_BYTES=0"}, exitConfig, "max.message.bytes: 0 or empty is not a value"},
		{"bad dead-letter topic", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db", "--brokers", "127.0.0.1:1"}, []string{"PGOUTBOX_RELAY_POISON_POLICY=dead-letter", "PGOUTBOX_RELAY_DEAD_LETTER_TOPIC=bad dlq"}, exitConfig, `dead.letter.topic "bad dlq"`},
		{"unreachable PostgreSQL", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db?connect_timeout=2", "--brokers", "127.0.0.1:1"}, nil, exitStartup, "check that PostgreSQL runs and listens on 127.0.0.1:1"},
		{"blank table list in the environment", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db", "--brokers", "127.0.0.1:1"}, []string{"PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST= "}, exitConfig, "PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST (postgres.table.include.list): is set but names nothing"},
		{"blank table list flag", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db", "--brokers", "127.0.0.1:1", "--tables", " , "}, nil, exitConfig, "--tables given an empty list"},
		{"routes in the environment", []string{"run", "--dsn", "postgres://x@127.0.0.1:1/db", "--brokers", "127.0.0.1:1"}, []string{"PGOUTBOX_ROUTES_PUBLIC_PAYMENTS_ROUTE_TOPIC=payments"}, exitConfig, "configuration file only"},
		{"help", []string{"run", "--help"}, nil, exitOK, "PGOUTBOX_POSTGRES_DSN"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(c.args, c.env, &out, &errOut)
			if code != c.code {
				t.Fatalf("exit code %d, want %d; stderr: %s", code, c.code, errOut.String())
			}
			if all := out.String() + errOut.String(); !strings.Contains(all, c.want) {
				t.Fatalf("output lacks %q:\n%s", c.want, all)
			}
		})
	}
}

// Names are quoted, never pasted: a publication named p$$x (legal in
// PostgreSQL) once broke the DO $$ ... $$ block migrate ran.
func TestMigrateQuotesOddNames(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"migrate", "--print", "--tables", `app.ev"ents`, "--publication", "p$$x"}, nil, &out, &errOut)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), `CREATE PUBLICATION "p$$x" FOR TABLE "app"."ev""ents"`) || strings.Contains(out.String(), "DO $$") {
		t.Fatalf("SQL does not quote the names:\n%s", out.String())
	}
}

func TestMigratePrintsTheSQL(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"migrate", "--print", "--tables", "app.events", "--publication", "pub1"}, nil, &out, &errOut)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "app"."events"`, `CREATE PUBLICATION "pub1" FOR TABLE "app"."events" WITH (publish = 'insert', publish_via_partition_root = true)`,
		// The poll source's keep triggers go: said where an operator reads.
		"-- NOTE: this drops the poll source's triggers pgoutbox_keep_unpublished and pgoutbox_keep_unpublished_truncate from app.events"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("SQL lacks %q:\n%s", want, out.String())
		}
	}
}

// TestFlushTriggersTurnOffAsDocumented: the README turns kafka's flush
// triggers off with -1ms for flush.frequency and -1 for the counts; that
// must load from a file and from the environment and pass validation (the
// README said -1 for all three, which no duration parser accepts).
func TestFlushTriggersTurnOffAsDocumented(t *testing.T) {
	path := writeFile(t, "kafka:\n  flush.frequency: -1ms\n  flush.messages: -1\n  flush.bytes: -1\n")
	env := []string{"PGOUTBOX_KAFKA_FLUSH_FREQUENCY=-1ms", "PGOUTBOX_KAFKA_FLUSH_MESSAGES=-1", "PGOUTBOX_KAFKA_FLUSH_BYTES=-1"}
	for _, src := range []struct {
		name string
		path string
		env  []string
	}{{"file", path, nil}, {"environment", "", env}} {
		cfg, err := loadConfig(src.path, src.env)
		if err != nil {
			t.Fatalf("%s: %v", src.name, err)
		}
		k := cfg.Kafka
		if k.FlushFrequency >= 0 || k.FlushMessages != -1 || k.FlushBytes != -1 {
			t.Fatalf("%s: flush settings %v / %d / %d, want all negative", src.name, k.FlushFrequency, k.FlushMessages, k.FlushBytes)
		}
		if err := k.ValidateExplicit(); err != nil {
			t.Fatalf("%s: %v", src.name, err)
		}
		k.Brokers = []string{"127.0.0.1:9092"}
		if err := k.Validate(); err != nil {
			t.Fatalf("%s: %v", src.name, err)
		}
	}
	_, err := loadConfig("", []string{"PGOUTBOX_KAFKA_FLUSH_FREQUENCY=-1"})
	if err == nil || !strings.Contains(err.Error(), "-1ms") {
		t.Fatalf("a bare -1 for a duration: want an error that suggests -1ms, got %v", err)
	}
}

// TestTwoRoutesKeysForOneTableStopRunAndValidate: a base file's
// "team_a_outbox:" and an overlay's "public.team_a_outbox:" both survive a
// Helm or kustomize merge; validate --config-only said PASS and run
// started, sending the table's events to one key's topic or the other's
// as Go's map order fell. Both must stop at the configuration, naming both
// keys and the table.
func TestTwoRoutesKeysForOneTableStopRunAndValidate(t *testing.T) {
	path := writeFile(t, `
postgres:
  dsn: postgres://x@127.0.0.1:1/db?connect_timeout=2
  table.include.list: [public.team_a_outbox]
kafka:
  brokers: [127.0.0.1:1]
routes:
  team_a_outbox:
    route.topic: team_a.x
  public.team_a_outbox:
    route.topic: team_a.y
`)
	for _, args := range [][]string{
		{"validate", "--config-only", "--config", path},
		{"run", "--config", path},
	} {
		var out, errOut bytes.Buffer
		code := run(args, nil, &out, &errOut)
		all := out.String() + errOut.String()
		if code != exitConfig {
			t.Fatalf("%s: exit %d, want %d:\n%s", strings.Join(args, " "), code, exitConfig, all)
		}
		for _, want := range []string{`"team_a_outbox"`, `"public.team_a_outbox"`, "table public.team_a_outbox"} {
			if !strings.Contains(all, want) {
				t.Fatalf("%s: output does not name %s:\n%s", strings.Join(args, " "), want, all)
			}
		}
	}
}
