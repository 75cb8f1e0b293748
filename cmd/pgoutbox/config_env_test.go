package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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

// kubernetesServiceLinks are the variables Kubernetes gives every
// container of a pod without enableServiceLinks: false in a namespace with
// a Service named pgoutbox (cluster IP 10.96.0.12, one port named metrics,
// 9180/TCP), as the kubelet names them: {SVCNAME}_SERVICE_HOST,
// {SVCNAME}_SERVICE_PORT, {SVCNAME}_SERVICE_PORT_{PORTNAME}, and the Docker
// link style {SVCNAME}_PORT, {SVCNAME}_PORT_{PORT}_{PROTO} and its _PROTO,
// _PORT and _ADDR.
var kubernetesServiceLinks = []string{
	"PGOUTBOX_SERVICE_HOST=10.96.0.12",
	"PGOUTBOX_SERVICE_PORT=9180",
	"PGOUTBOX_SERVICE_PORT_METRICS=9180",
	"PGOUTBOX_PORT=tcp://10.96.0.12:9180",
	"PGOUTBOX_PORT_9180_TCP=tcp://10.96.0.12:9180",
	"PGOUTBOX_PORT_9180_TCP_PROTO=tcp",
	"PGOUTBOX_PORT_9180_TCP_PORT=9180",
	"PGOUTBOX_PORT_9180_TCP_ADDR=10.96.0.12",
}

// TestServiceAndDockerLinkVariablesAreAccepted: a pod not made by our
// chart (kubectl run, a Job for migrate or cleanup) in a namespace with a
// Service named pgoutbox gets the variables Kubernetes sets for it, and a
// container linked to one with the alias pgoutbox those Docker sets; they
// name no setting but are no typo either, and validate --config-only (the
// check every command runs first) passes with them, as it did before
// unknown PGOUTBOX_ variables were refused. The same names with a value
// Kubernetes or Docker never sets are refused, saying why.
func TestServiceAndDockerLinkVariablesAreAccepted(t *testing.T) {
	ipv6 := []string{ // a Service with an IPv6 cluster IP, a second port named grpc-api, 9190/UDP
		"PGOUTBOX_SERVICE_HOST=fd00:10:96::c",
		"PGOUTBOX_SERVICE_PORT=9180",
		"PGOUTBOX_SERVICE_PORT_GRPC_API=9190",
		"PGOUTBOX_PORT=tcp://[fd00:10:96::c]:9180",
		"PGOUTBOX_PORT_9190_UDP=udp://[fd00:10:96::c]:9190",
		"PGOUTBOX_PORT_9190_UDP_PROTO=udp",
		"PGOUTBOX_PORT_9190_UDP_PORT=9190",
		"PGOUTBOX_PORT_9190_UDP_ADDR=fd00:10:96::c",
	}
	dockerLink := []string{ // docker run --link relay:pgoutbox, relay exposing 9180
		"PGOUTBOX_NAME=/migrate/pgoutbox",
		"PGOUTBOX_PORT=tcp://172.17.0.2:9180",
		"PGOUTBOX_PORT_9180_TCP=tcp://172.17.0.2:9180",
		"PGOUTBOX_PORT_9180_TCP_ADDR=172.17.0.2",
		"PGOUTBOX_PORT_9180_TCP_PORT=9180",
		"PGOUTBOX_PORT_9180_TCP_PROTO=tcp",
		"PGOUTBOX_ENV_PGOUTBOX_KAFKA_BROKERS=k:9092",
		"PGOUTBOX_ENV_PATH=/usr/local/bin:/usr/bin",
	}
	for name, env := range map[string][]string{"Kubernetes": kubernetesServiceLinks, "Kubernetes, IPv6": ipv6, "Docker link": dockerLink} {
		if _, err := loadConfig("", env); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		var out, errOut bytes.Buffer
		args := []string{"validate", "--config-only", "--dsn", "postgres://u@127.0.0.1:1/d", "--brokers", "127.0.0.1:1"}
		if code := run(args, env, &out, &errOut); code != exitOK {
			t.Errorf("validate --config-only with the %s variables: exit %d, want %d:\n%s%s", name, code, exitOK, out.String(), errOut.String())
		}
	}
	for _, kv := range []string{
		"PGOUTBOX_PORT=9180", // someone's guess at the metrics port
		"PGOUTBOX_PORT=http://10.96.0.12:9180",
		"PGOUTBOX_SERVICE_HOST=pgoutbox.default.svc",
		"PGOUTBOX_SERVICE_PORT=metrics",
		"PGOUTBOX_SERVICE_PORT_METRICS=0",
		"PGOUTBOX_PORT_9180_TCP=tcp://10.96.0.12:9181",
		"PGOUTBOX_PORT_9180_TCP=udp://10.96.0.12:9180",
		"PGOUTBOX_PORT_9180_TCP_PORT=9181",
		"PGOUTBOX_PORT_9180_TCP_PROTO=udp",
		"PGOUTBOX_PORT_9180_TCP_ADDR=db",
		"PGOUTBOX_NAME=orders",
	} {
		name, value, _ := strings.Cut(kv, "=")
		_, err := loadConfig("", []string{kv})
		if err == nil || !strings.Contains(err.Error(), "unknown environment variables "+name+" (named like a variable Kubernetes or Docker sets") ||
			!strings.Contains(err.Error(), strconv.Quote(value)+" is no value they set") {
			t.Errorf("%s: got %v, want a refusal saying it is named like a link variable but its value is none", kv, err)
		}
	}
	// Other shapes near these stay refused as typos.
	for _, kv := range []string{
		"PGOUTBOX_SERVICE_HOSTS=10.96.0.12", "PGOUTBOX_SERVICE_ADDR=10.96.0.12", "PGOUTBOX_PORT_TCP=tcp://10.96.0.12:9180",
		"PGOUTBOX_PORT_9180=tcp://10.96.0.12:9180", "PGOUTBOX_PORT_9180_HTTP=tcp://10.96.0.12:9180", "PGOUTBOX_PORT_9180_TCP_HOST=10.96.0.12",
		"PGOUTBOX_METRICS_PORT=9180", "PGOUTBOX_ORDERS_SERVICE_HOST=10.96.0.12", "PGOUTBOX_ENV=x", "PGOUTBOX_NAMES=/a/pgoutbox",
	} {
		name, _, _ := strings.Cut(kv, "=")
		if _, err := loadConfig("", []string{kv}); err == nil || !strings.Contains(err.Error(), "unknown environment variables "+name) {
			t.Errorf("%s: got %v, want it refused as unknown", kv, err)
		}
	}
}

// TestLinkVariablesCannotHideATypo: no setting's variable, nor any one
// edit of it (a letter added, left out or changed), nor it with its
// section left out (PGOUTBOX_PORT for a metrics.port, say), has the shape
// of a service- or Docker-link variable, so the exemption never lets a
// mistyped setting fall back to its default without a word. It fails when
// a setting is added that would (a section named port, service, name or
// env, a key named port or host): then the exemption must be narrowed.
func TestLinkVariablesCannotHideATypo(t *testing.T) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
	linkShaped := func(name string) bool {
		return serviceLinkName.MatchString(name) || linkPortName.MatchString(name) || dockerLinkName.MatchString(name)
	}
	cfg := defaultFileConfig()
	for _, s := range settings(&cfg) {
		name := envName(s.section, s.key)
		variants := []string{name, strings.Replace(name, "_"+strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(s.section)), "", 1)}
		for i := 0; i <= len(name); i++ {
			if i < len(name) {
				variants = append(variants, name[:i]+name[i+1:])
			}
			for _, c := range alphabet {
				variants = append(variants, name[:i]+string(c)+name[i:])
				if i < len(name) {
					variants = append(variants, name[:i]+string(c)+name[i+1:])
				}
			}
		}
		for _, v := range variants {
			if linkShaped(v) {
				t.Errorf("%s (%s.%s): %s, a typo of it, has the shape of a link variable and would be taken as one", name, s.section, s.key, v)
			}
		}
	}
	// And the check can see one: a metrics.port setting would be hidden.
	if !linkShaped("PGOUTBOX_PORT") || !linkShaped("PGOUTBOX_SERVICE_PORT_METRICS") {
		t.Error("the link shapes do not match the variables they are for")
	}
}
