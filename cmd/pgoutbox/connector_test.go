package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if strings.Join(ignored, ",") != "heartbeat.interval.ms,tasks.max,tombstones.on.delete,topic.prefix" {
		t.Errorf("ignored keys: %v", ignored)
	}
}

func TestConnectorImportRefusesWhatItCannotHonour(t *testing.T) {
	base := map[string]string{
		"connector.class":        postgresConnector,
		"transforms":             "outbox",
		"transforms.outbox.type": eventRouter,
	}
	cases := map[string]struct {
		key, value, want string
	}{
		"decoderbufs":         {"plugin.name", "decoderbufs", "pgoutput only"},
		"snapshot only":       {"snapshot.mode", "initial_only", "initial"},
		"regex tables":        {"table.include.list", "public.outbox_.*", "regular expression"},
		"other transform":     {"transforms", "outbox,unwrap", "transforms.unwrap.type"},
		"config provider":     {"database.password", "${file:/secrets:pw}", "config providers"},
		"drop slot":           {"slot.drop.on.stop", "true", "loses every event"},
		"unknown router opt":  {"transforms.outbox.no.such.option", "x", "no.such.option"},
		"transaction topic":   {"provide.transaction.metadata", "true", "transaction metadata"},
		"wrong connector":     {"connector.class", "io.debezium.connector.mysql.MySqlConnector", "connector.class"},
		"bad autocreate mode": {"publication.autocreate.mode", "sometimes", "publication.autocreate.mode"},
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
	body := `{"connector.class": "` + postgresConnector + `", "database.port": 6543, "database.hostname": "db", "transforms": "r", "transforms.r.type": "` + eventRouter + `", "transforms.r.route.tombstone.on.empty.payload": true}`
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
			"transforms.outbox.type": eventRouter, "snapshot.mode": mode}
		cfg := defaultFileConfig()
		if _, err := applyConnector(&cfg, conn); err != nil {
			t.Fatalf("snapshot.mode=%s: %v", mode, err)
		}
		if cfg.Snapshot.Mode != want {
			t.Errorf("snapshot.mode=%s: pgoutbox's snapshot.mode is %q, want %q", mode, cfg.Snapshot.Mode, want)
		}
	}
}
