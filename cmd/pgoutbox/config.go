package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pgoutbox/pgoutbox/pkg/metrics"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
)

// fileConfig is the YAML file: the relay's sections plus the process's own.
type fileConfig struct {
	relay.Config `yaml:",inline"`
	Log          logConfig       `yaml:"log"`
	Metrics      metrics.Config  `yaml:"metrics"`
	Connector    connectorConfig `yaml:"connector"`
}

type logConfig struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // auto (console on a terminal, else JSON), json, console
}

func defaultFileConfig() fileConfig {
	return fileConfig{Config: relay.DefaultConfig(), Log: logConfig{Level: "info", Format: "auto"}, Metrics: metrics.DefaultConfig()}
}

// loadConfig reads path (if not empty) over the defaults, then applies
// environment overrides. Unknown keys in the file are errors: a typo must not
// silently fall back to a default.
func loadConfig(path string, environ []string) (fileConfig, error) {
	return loadConfigWith(path, environ, nil, nil)
}

// loadConfigWith is loadConfig with a step between the file and the
// environment (the Kafka Connect import), and the PGOUTBOX_* variables that
// step reads on purpose (a connector's ${env:NAME}), which are not settings
// but no typos either.
func loadConfigWith(path string, environ []string, between func(*fileConfig) error, readOnPurpose []string) (fileConfig, error) {
	cfg := defaultFileConfig()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("read config file: %w", err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) /* an empty file */ {
			return cfg, fmt.Errorf("config file %s: %w", path, err)
		}
	}
	if between != nil {
		// The environment may configure the connector import itself
		// (connector.config.providers): apply it before, and again after
		// so that it overrides what the import set.
		if err := applyEnv(&cfg, environ, readOnPurpose...); err != nil {
			return cfg, err
		}
		if err := between(&cfg); err != nil {
			return cfg, err
		}
	}
	if err := applyEnv(&cfg, environ, readOnPurpose...); err != nil {
		return cfg, err
	}
	return cfg, checkConnectorBrokers(cfg)
}

// envName maps a section and a YAML key to its environment variable:
// PGOUTBOX_<SECTION>_<KEY> with dots and dashes as underscores, upper case.
// For example postgres.dsn → PGOUTBOX_POSTGRES_DSN and
// router.table.field.event.key → PGOUTBOX_ROUTER_TABLE_FIELD_EVENT_KEY.
func envName(section, key string) string {
	r := strings.NewReplacer(".", "_", "-", "_")
	return "PGOUTBOX_" + strings.ToUpper(r.Replace(section)) + "_" + strings.ToUpper(r.Replace(key))
}

// settings lists every configurable leaf: its section, key, and field.
type setting struct {
	section, key string
	field        reflect.Value
}

func settings(cfg *fileConfig) []setting {
	var out []setting
	root := reflect.ValueOf(cfg).Elem()
	var walkSection func(v reflect.Value)
	walkSection = func(v reflect.Value) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := strings.Split(f.Tag.Get("yaml"), ",")
			if len(tag) > 1 && tag[1] == "inline" {
				walkSection(v.Field(i))
				continue
			}
			name := tag[0]
			if name == "" || name == "-" || v.Field(i).Kind() != reflect.Struct {
				continue
			}
			walkKeys(name, v.Field(i), &out)
		}
	}
	walkSection(root)
	return out
}

// walkKeys appends the keys of section sv, descending into inline structs
// (such as the kafka section's security options).
func walkKeys(section string, sv reflect.Value, out *[]setting) {
	st := sv.Type()
	for j := 0; j < st.NumField(); j++ {
		f := st.Field(j)
		tag := strings.Split(f.Tag.Get("yaml"), ",")
		if len(tag) > 1 && tag[1] == "inline" && f.Type.Kind() == reflect.Struct {
			walkKeys(section, sv.Field(j), out)
			continue
		}
		k := tag[0]
		if k == "" || k == "-" || !f.IsExported() {
			continue
		}
		*out = append(*out, setting{section: section, key: k, field: sv.Field(j)})
	}
}

// emptyTurnsOff are the string settings whose empty value turns a
// protection or a feature off, with what it turns off. From the
// environment an empty value is refused, as an empty list is: it is most
// likely a template's variable left unfilled, and the file is where one
// turns them off on purpose.
var emptyTurnsOff = map[string]string{
	"postgres.state.table": "turns the state table off, and with it the checks it makes possible: a slot dropped or lost is then created again without a word, skipping every event not yet relayed",
	"messages.prefix":      "turns the table-less outbox off: the messages written with pg_logical_emit_message are then skipped, without a word",
}

// envNotSettings are the PGOUTBOX_* variables that are no settings but
// are read on purpose, by pgoutbox (the configuration file, the profiles)
// or by its tests, benchmarks and test environment (scripts/testenv.sh),
// which may run pgoutbox with them in its environment. Every other
// PGOUTBOX_* variable must name a setting: a typo would otherwise fall
// back to the default without a word. Besides these, every variable
// starting with envTestPrefix is the tests'.
var envNotSettings = map[string]bool{
	"PGOUTBOX_CONFIG": true,
	envCPUProfile:     true, envMemProfile: true, envTrace: true,
	// The tests' switches and reports (Makefile, pkg/testenv, pkg/relay,
	// pkg/conformance).
	"PGOUTBOX_REQUIRE_INTEGRATION": true, "PGOUTBOX_REQUIRE_DEBEZIUM": true, "PGOUTBOX_INTEGRATION_MARKER": true,
	"PGOUTBOX_FAULTS": true, "PGOUTBOX_FAULTS_REPORT": true, "PGOUTBOX_CONFORMANCE_REPORT": true, "PGOUTBOX_CONFORMANCE_DBNAME": true,
	"PGOUTBOX_DEBEZIUM_LIBS": true,
	// scripts/testenv.sh and scripts/debezium/fetch.sh.
	"PGOUTBOX_CACHE": true, "PGOUTBOX_PG_MAJOR": true, "PGOUTBOX_PG_MAJORS": true, "PGOUTBOX_PG_BIN": true,
	"PGOUTBOX_PG_DIST": true, "PGOUTBOX_PG_USER": true,
	// In the kafka section's names, but scripts/testenv.sh's (an exec'd
	// test runs pgoutbox with them).
	"PGOUTBOX_KAFKA_READY_TIMEOUT": true, "PGOUTBOX_KAFKA_CLUSTER_READY_TIMEOUT": true,
}

// envTestPrefix starts the test environment's variables (env.sh's
// PGOUTBOX_TEST_PG_DSN and the like).
const envTestPrefix = "PGOUTBOX_TEST_"

// applyEnv sets cfg from the PGOUTBOX_* variables of environ. A variable
// that is no setting is an error, unless envNotSettings names it or it is
// one of readOnPurpose.
func applyEnv(cfg *fileConfig, environ []string, readOnPurpose ...string) error {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	known := map[string]bool{}
	for _, s := range settings(cfg) {
		name := envName(s.section, s.key)
		known[name] = true
		v, ok := env[name]
		if !ok {
			continue
		}
		if off, ok := emptyTurnsOff[s.section+"."+s.key]; ok && strings.TrimSpace(v) == "" {
			return fmt.Errorf("environment variable %s (%s.%s) is set but empty, which %s: unset it to keep the value of the file (or the default), or, if that is what you mean, set %s: \"\" in the %s section of the YAML file",
				name, s.section, s.key, off, s.key, s.section)
		}
		if err := setValue(s.field, v); err != nil {
			return fmt.Errorf("environment variable %s (%s.%s): %w", name, s.section, s.key, err)
		}
	}
	// A PGOUTBOX_* variable that names no setting is a typo
	// (PGOUTBOX_KAFKA_BROKER, PGOUTBOX_SNAPSHOTMODE, say), which must not
	// fall back to the default silently, as an unknown key in the file
	// does not.
	var unknown []string
	for name, value := range env {
		if known[name] || !strings.HasPrefix(name, "PGOUTBOX_") || envNotSettings[name] ||
			strings.HasPrefix(name, envTestPrefix) || slices.Contains(readOnPurpose, name) {
			continue
		}
		named, ok := linkVariable(name, value)
		if ok {
			continue
		}
		if strings.HasPrefix(name, "PGOUTBOX_ROUTES_") {
			// routes (per-table settings) is a map: the file only.
			return fmt.Errorf("environment variable %s: routes (the per-table settings) can be set in the configuration file only", name)
		}
		if named {
			name += fmt.Sprintf(" (named like a variable Kubernetes or Docker sets for a Service or link named pgoutbox, but %q is no value they set)", value)
		} else if near := nearestName(name, known); near != "" {
			name += " (" + near + "?)"
		}
		unknown = append(unknown, name)
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("unknown environment variables %s: no such setting, and a PGOUTBOX_ variable must name one (pgoutbox run --help lists them): correct or unset it", strings.Join(unknown, ", "))
	}
	return nil
}

// The variables Kubernetes and Docker set for a Service or a link named
// pgoutbox, which are no settings and no typos either. Kubernetes gives
// every container of a pod (unless the pod sets enableServiceLinks: false,
// as our Helm chart does) these variables for each Service with a cluster
// IP (not a headless one) in its namespace, named after the Service: for a
// Service pgoutbox at 10.96.0.12 with a port named metrics, 9180/TCP,
//
//	PGOUTBOX_SERVICE_HOST=10.96.0.12
//	PGOUTBOX_SERVICE_PORT=9180
//	PGOUTBOX_SERVICE_PORT_METRICS=9180
//	PGOUTBOX_PORT=tcp://10.96.0.12:9180
//	PGOUTBOX_PORT_9180_TCP=tcp://10.96.0.12:9180
//	PGOUTBOX_PORT_9180_TCP_PROTO=tcp
//	PGOUTBOX_PORT_9180_TCP_PORT=9180
//	PGOUTBOX_PORT_9180_TCP_ADDR=10.96.0.12
//
// (SERVICE_PORT and PORT are the first port's; each port has its own
// PORT_<port>_<protocol> group, and each named one its SERVICE_PORT_<name>).
// A Docker link with the alias pgoutbox (docker run --link c:pgoutbox, or
// Compose's links) sets the same PGOUTBOX_PORT group for each exposed port,
// PGOUTBOX_NAME=/<container>/pgoutbox and PGOUTBOX_ENV_<name> for each
// variable of the linked container. So a relay run by hand in a namespace
// where a Service pgoutbox has a cluster IP (kubectl run, a Job for migrate
// or cleanup) found them in its environment, and refusing them stopped it.
//
// These are exempt only where they cannot hide a typo of a setting: no
// section is named service, port, name or env, so no setting is one edit
// (nor its section left out) away from these shapes, which
// TestLinkVariablesCannotHideATypo keeps true. Where Kubernetes and Docker
// set a value of a fixed form (an IP, a port number, tcp://IP:port), the
// value must have it too: PGOUTBOX_PORT=9180 is someone's guess at a
// setting (there is no port setting; metrics.listen is the metrics
// server's address), not a link, and is refused.
var (
	serviceLinkName = regexp.MustCompile(`^PGOUTBOX_SERVICE_(HOST|PORT(_[A-Z0-9_]+)?)$`)
	linkPortName    = regexp.MustCompile(`^PGOUTBOX_PORT(?:_([0-9]+)_(TCP|UDP|SCTP)(?:_(ADDR|PORT|PROTO))?)?$`)
	dockerLinkName  = regexp.MustCompile(`^PGOUTBOX_(NAME|ENV_.+)$`)
)

// linkVariable reports whether name has the shape of a Kubernetes
// service-link or Docker-link variable (named) and whether value is then
// one they set (ok).
func linkVariable(name, value string) (named, ok bool) {
	isIP := func(s string) bool { return net.ParseIP(s) != nil }
	isPort := func(s string) bool {
		n, err := strconv.Atoi(s)
		return err == nil && n > 0 && n < 65536 && strconv.Itoa(n) == s
	}
	// isURL is proto://IP:port, with port and protocol those given if
	// not empty (an IPv6 address in brackets, as net.JoinHostPort writes).
	isURL := func(s, port, proto string) bool {
		p, hostPort, found := strings.Cut(s, "://")
		if proto == "" {
			found = found && (p == "tcp" || p == "udp" || p == "sctp")
		} else {
			found = found && p == proto
		}
		if !found {
			return false
		}
		h, pt, err := net.SplitHostPort(hostPort)
		return err == nil && isIP(h) && isPort(pt) && (port == "" || pt == port)
	}
	if m := serviceLinkName.FindStringSubmatch(name); m != nil {
		if m[1] == "HOST" {
			return true, isIP(value)
		}
		return true, isPort(value)
	}
	if m := linkPortName.FindStringSubmatch(name); m != nil {
		port, proto, part := m[1], strings.ToLower(m[2]), m[3]
		switch {
		case port == "":
			return true, isURL(value, "", "")
		case part == "":
			return true, isURL(value, port, proto)
		case part == "ADDR":
			return true, isIP(value)
		case part == "PORT":
			return true, value == port
		default: // PROTO
			return true, value == proto
		}
	}
	if m := dockerLinkName.FindStringSubmatch(name); m != nil {
		if m[1] == "NAME" {
			return true, strings.HasPrefix(value, "/")
		}
		return true, true
	}
	return false, false
}

// nearestName is the known name closest to name, within two edits (a
// letter added, left out or changed), or "".
func nearestName(name string, known map[string]bool) string {
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	sort.Strings(names)
	best, bestDist := "", 3
	for _, k := range names {
		if d := editDistance(name, k, bestDist); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, or limit when it is
// limit or more.
func editDistance(a, b string, limit int) int {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return limit
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= limit {
			return limit
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}

var durationType = reflect.TypeOf(time.Duration(0))

// setValue parses text into a config field of a supported kind.
func setValue(f reflect.Value, text string) error {
	switch {
	case f.Type() == durationType:
		d, err := time.ParseDuration(text)
		if err != nil {
			return fmt.Errorf("want a duration such as 500ms or 10s (-1ms where a negative value turns the option off): %w", err)
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.String:
		f.SetString(text)
	case f.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", text)
		}
		f.SetBool(b)
	case f.Kind() >= reflect.Int && f.Kind() <= reflect.Int64:
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return fmt.Errorf("want an integer, got %q", text)
		}
		f.SetInt(n)
	case f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Bool:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", text)
		}
		f.Set(reflect.ValueOf(&b))
	case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.String:
		var parts []string
		for _, p := range strings.Split(text, ",") {
			if p = strings.TrimSpace(p); p != "" {
				parts = append(parts, p)
			}
		}
		if parts == nil {
			// Most likely a template's variable left unfilled: an empty
			// table list, say, relays no table, without a word.
			return errors.New("is set but names nothing: unset it to keep the value of the file (or the default), or name the values, comma-separated; an empty list can be set in the file")
		}
		f.Set(reflect.ValueOf(parts))
	default:
		return fmt.Errorf("unsupported setting type %s", f.Type())
	}
	return nil
}

// describeSettings lists every setting with its environment variable and
// default, for --help.
func describeSettings() string {
	cfg := defaultFileConfig()
	var b strings.Builder
	section := ""
	for _, s := range settings(&cfg) {
		if s.section != section {
			section = s.section
			fmt.Fprintf(&b, "\n  %s:\n", section)
		}
		def := fmt.Sprint(s.field.Interface())
		if s.field.Kind() == reflect.Pointer {
			def = "unset"
			if !s.field.IsNil() {
				def = fmt.Sprint(s.field.Elem().Interface())
			}
		}
		if s.field.Kind() == reflect.Slice {
			def = strings.Trim(def, "[]")
			def = strings.ReplaceAll(def, " ", ",")
		}
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(&b, "    %-40s %-48s default %s\n", s.key, envName(s.section, s.key), def)
	}
	return b.String()
}
