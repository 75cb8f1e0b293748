package main

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadConfig feeds arbitrary YAML to the config loader: it may reject
// it, but never panic, and what it accepts must survive Validate without
// panicking.
func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte("postgres:\n  dsn: postgres://x@127.0.0.1/db\n  slot.name: s\nkafka:\n  brokers: [a:1]\n"))
	f.Add([]byte("router:\n  table.fields.additional.placement: type:header:eventType,x:envelope\n  table.fields.additional.error.on.missing: false\n"))
	f.Add([]byte("relay:\n  max.inflight.records: -1\n  shutdown.timeout: 1h\n"))
	f.Add([]byte("postgres: [1, 2]\n"))
	f.Add([]byte("{}"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig(p, []string{"PGOUTBOX_RELAY_SHUTDOWN_TIMEOUT=5s"})
		if err != nil {
			return
		}
		_ = cfg.Validate()
	})
}
