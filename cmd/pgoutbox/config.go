package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
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
	return loadConfigWith(path, environ, nil)
}

// loadConfigWith is loadConfig with a step between the file and the
// environment (the Kafka Connect import).
func loadConfigWith(path string, environ []string, between func(*fileConfig) error) (fileConfig, error) {
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
		if err := applyEnv(&cfg, environ); err != nil {
			return cfg, err
		}
		if err := between(&cfg); err != nil {
			return cfg, err
		}
	}
	if err := applyEnv(&cfg, environ); err != nil {
		return cfg, err
	}
	return cfg, nil
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

func applyEnv(cfg *fileConfig, environ []string) error {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	known := map[string]bool{}
	sections := map[string]bool{}
	for _, s := range settings(cfg) {
		name := envName(s.section, s.key)
		known[name] = true
		sections[envName(s.section, "")] = true
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
	// A variable of a settings section that names no setting is a typo
	// (PGOUTBOX_KAFKA_BROKER, say), which must not fall back to the
	// default silently, as an unknown key in the file does not.
	var unknown []string
	for name := range env {
		if known[name] {
			continue
		}
		if strings.HasPrefix(name, "PGOUTBOX_ROUTES_") {
			// routes (per-table settings) is a map: the file only.
			return fmt.Errorf("environment variable %s: routes (the per-table settings) can be set in the configuration file only", name)
		}
		for prefix := range sections {
			if strings.HasPrefix(name, prefix) {
				unknown = append(unknown, name)
				break
			}
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("unknown environment variables %s: no such setting (pgoutbox run --help lists them)", strings.Join(unknown, ", "))
	}
	return nil
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
