package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
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

// TestEveryUnknownPGOUTBOXVariableIsRefused: a typo anywhere in a
// PGOUTBOX_* variable, in its section as well as in its key, is refused
// with the setting it most likely meant, where only variables starting
// with a known section were checked and the others fell back to the
// defaults without a word.
func TestEveryUnknownPGOUTBOXVariableIsRefused(t *testing.T) {
	for typo, meant := range map[string]string{
		"PGOUTBOX_SNAPSHOTMODE=initial":    "PGOUTBOX_SNAPSHOT_MODE",
		"PGOUTBOX_RELAYSOURCE=poll":        "PGOUTBOX_RELAY_SOURCE",
		"PGOUTBOX_POSTGRESS_STATE_TABLE=x": "PGOUTBOX_POSTGRES_STATE_TABLE",
		"PGOUTBOX_SNAPSHOT_MOD=initial":    "PGOUTBOX_SNAPSHOT_MODE",
		"PGOUTBOX_BROKERS=k:9092":          "",
	} {
		name, _, _ := strings.Cut(typo, "=")
		_, err := loadConfig("", []string{typo})
		if err == nil || !strings.Contains(err.Error(), "unknown environment variables "+name) || !strings.Contains(err.Error(), "("+meant+"?)") != (meant == "") {
			t.Errorf("%s: got %v, want a refusal naming it and suggesting %q", typo, err, meant)
		}
		var out, errOut bytes.Buffer
		if code := run([]string{"validate", "--config-only", "--dsn", "postgres://u@127.0.0.1:1/d", "--brokers", "127.0.0.1:1"}, []string{typo}, &out, &errOut); code != exitConfig || !strings.Contains(errOut.String(), name) {
			t.Errorf("validate --config-only with %s: exit %d, want %d naming it:\n%s%s", typo, code, exitConfig, out.String(), errOut.String())
		}
	}
	// What pgoutbox, its tests and its test environment read on purpose
	// is no setting, and no typo either.
	var onPurpose []string
	for name := range envNotSettings {
		onPurpose = append(onPurpose, name+"=x")
	}
	onPurpose = append(onPurpose, "PGOUTBOX_TEST_PG_DSN=x", "PGOUTBOX_TEST_ANYTHING_NEW=x", "NOT_PGOUTBOX_SNAPSHOTMODE=x")
	if _, err := loadConfig("", onPurpose); err != nil {
		t.Errorf("variables read on purpose: %v", err)
	}
}

// TestConnectorEnvProviderVariablesAreNoTypos: a PGOUTBOX_* variable that
// the connector reads through ${env:NAME} is read on purpose, by run and
// by convert; the same variable without the reference is refused.
func TestConnectorEnvProviderVariablesAreNoTypos(t *testing.T) {
	t.Setenv("PGOUTBOX_ORDERS_DB", "orders")
	env := []string{"PGOUTBOX_CONNECTOR_CONFIG_PROVIDERS=env", "PGOUTBOX_ORDERS_DB=orders"}
	write := func(dbname string) string {
		p := writeFile(t, `{"connector.class": "`+postgresConnector+`", "transforms": "r", "transforms.r.type": "`+eventRouter+`", "slot.name": "orders",
			"snapshot.mode": "no_data", "database.hostname": "127.0.0.1", "database.dbname": "`+dbname+`",
			"key.converter": "org.apache.kafka.connect.storage.StringConverter", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}`)
		return p
	}
	for _, c := range []struct {
		dbname string
		ok     bool
	}{{"${env:PGOUTBOX_ORDERS_DB}", true}, {"orders", false}} {
		p := write(c.dbname)
		var out, errOut bytes.Buffer
		code := run([]string{"validate", "--config-only", "--connector", p, "--brokers", "127.0.0.1:1"}, env, &out, &errOut)
		if (code == exitOK) != c.ok || !c.ok && !strings.Contains(errOut.String(), "PGOUTBOX_ORDERS_DB") {
			t.Errorf("validate, database.dbname %s: exit %d, want success %v:\n%s", c.dbname, code, c.ok, errOut.String())
		}
		out.Reset()
		errOut.Reset()
		code = run([]string{"convert", p}, env, &out, &errOut)
		if (code == exitOK) != c.ok || !c.ok && !strings.Contains(errOut.String(), "PGOUTBOX_ORDERS_DB") {
			t.Errorf("convert, database.dbname %s: exit %d, want success %v:\n%s", c.dbname, code, c.ok, errOut.String())
		}
	}
}

// pgoutboxVariable is a PGOUTBOX_* variable's name as the repository's
// scripts, deployments and examples write it.
var pgoutboxVariable = regexp.MustCompile(`PGOUTBOX_[A-Z0-9_]*[A-Z0-9]`)

// TestTheRepositorysVariablesAreAccepted: nothing the repository's CI,
// Makefile, scripts, deployments and examples set or pass is refused as a
// typo.
func TestTheRepositorysVariablesAreAccepted(t *testing.T) {
	root := filepath.Join("..", "..")
	var files []string
	for _, f := range []string{"Makefile", "Dockerfile", "docker-compose.yml", ".ci/run"} {
		files = append(files, filepath.Join(root, f))
	}
	for _, dir := range []string{"scripts", "deploy", "examples", ".ci"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && !strings.HasSuffix(p, "_test.go") && !strings.HasSuffix(p, ".golden.yaml") {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	cfg := defaultFileConfig()
	known := map[string]bool{}
	for _, s := range settings(&cfg) {
		known[envName(s.section, s.key)] = true
	}
	seen := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range pgoutboxVariable.FindAllString(string(data), -1) {
			seen++
			if known[name] || name == "PGOUTBOX_ROUTES" {
				continue
			}
			if _, err := loadConfig("", []string{name + "=x"}); err != nil {
				t.Errorf("%s: %s would be refused: %v", f, name, err)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no PGOUTBOX_ variable found: the scan looks in the wrong place")
	}
}
