package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestEmptyEnvironmentValueThatTurnsAProtectionOffIsRefused: an empty
// PGOUTBOX_POSTGRES_STATE_TABLE or PGOUTBOX_MESSAGES_PREFIX (most likely a
// template's variable left unfilled) would turn the state table or the
// table-less outbox off without a word; it is refused, naming the variable
// and the YAML key that turns it off on purpose, which still works.
func TestEmptyEnvironmentValueThatTurnsAProtectionOffIsRefused(t *testing.T) {
	for _, c := range []struct{ env, key, yaml string }{
		{"PGOUTBOX_POSTGRES_STATE_TABLE", "postgres.state.table", "postgres:\n  state.table: \"\"\n"},
		{"PGOUTBOX_MESSAGES_PREFIX", "messages.prefix", "messages:\n  prefix: \"\"\n"},
	} {
		for _, v := range []string{"", "  "} {
			_, err := loadConfig("", []string{c.env + "=" + v})
			if err == nil || !strings.Contains(err.Error(), c.env+" ("+c.key+") is set but empty") || !strings.Contains(err.Error(), "YAML file") {
				t.Errorf("%s=%q: got %v, want a refusal naming the variable and the YAML file", c.env, v, err)
			}
		}
		cfg, err := loadConfig(writeFile(t, c.yaml), nil)
		if err != nil {
			t.Fatalf("%s: \"\" in the file: %v", c.key, err)
		}
		if cfg.Postgres.StateTable != "" && c.key == "postgres.state.table" || cfg.Messages.Prefix != "" && c.key == "messages.prefix" {
			t.Errorf("%s: \"\" in the file did not turn it off", c.key)
		}
		if _, err := loadConfig("", []string{c.env + "=x"}); err != nil {
			t.Errorf("%s=x: %v", c.env, err)
		}
	}
	// Every key the check names is a setting, so none is left unchecked
	// by a typo in the list.
	cfg := defaultFileConfig()
	known := map[string]bool{}
	for _, s := range settings(&cfg) {
		known[s.section+"."+s.key] = true
	}
	for k := range emptyTurnsOff {
		if !known[k] {
			t.Errorf("emptyTurnsOff names %s, which is no setting", k)
		}
	}
}

// TestRunAndValidateWarnWithoutAStateTable: with postgres.state.table
// turned off (in the file) run logs a warning before it starts and
// validate reports a WARN of the durability audit; with the default table,
// or on the poll source (no slot), neither says a word of it.
func TestRunAndValidateWarnWithoutAStateTable(t *testing.T) {
	off := writeFile(t, "postgres:\n  state.table: \"\"\n")
	args := []string{"--dsn", "postgres://u@127.0.0.1:1/d?connect_timeout=2", "--brokers", "127.0.0.1:1", "--log-format", "json"}
	for _, c := range []struct {
		name string
		env  []string
		warn bool
	}{
		{"off", []string{"PGOUTBOX_CONFIG=" + off}, true},
		{"default", nil, false},
		{"off, poll source", []string{"PGOUTBOX_CONFIG=" + off, "PGOUTBOX_RELAY_SOURCE=poll"}, false},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"run"}, args...), c.env, &out, &errOut)
		if code == exitConfig {
			t.Fatalf("%s: run refused the configuration: %s", c.name, errOut.String())
		}
		warned := false
		for _, line := range strings.Split(errOut.String(), "\n") {
			warned = warned || strings.Contains(line, `"level":"warn"`) && strings.Contains(line, `"check":"durability postgres.state.table"`) &&
				strings.Contains(line, "created again without a word")
		}
		if warned != c.warn {
			t.Errorf("%s: run warned of the state table: %v, want %v:\n%s", c.name, warned, c.warn, errOut.String())
		}
		if c.warn && strings.Index(errOut.String(), "durability postgres.state.table") > strings.Index(errOut.String(), "pgoutbox starting") {
			t.Errorf("%s: the warning comes after the start:\n%s", c.name, errOut.String())
		}
		out.Reset()
		errOut.Reset()
		// Without a DSN or brokers validate connects to nothing.
		run([]string{"validate"}, c.env, &out, &errOut)
		if got := strings.Contains(out.String(), "WARN durability postgres.state.table:"); got != c.warn {
			t.Errorf("%s: validate warned of the state table: %v, want %v:\n%s", c.name, got, c.warn, out.String())
		}
	}
}
