package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

// Kafka Connect import: a Debezium PostgreSQL connector configuration with
// the outbox EventRouter transform, as POSTed to Kafka Connect, becomes
// pgoutbox's configuration. Brokers are not in it (they belong to the
// Connect worker) and come from pgoutbox's own settings.

const (
	postgresConnector = "io.debezium.connector.postgresql.PostgresConnector"
	eventRouter       = "io.debezium.transforms.outbox.EventRouter"
)

// connectorIgnored are keys whose absence of effect is harmless for an
// outbox relay; they are listed in one warning.
var connectorIgnored = map[string]string{
	"name":                                      "",
	"tasks.max":                                 "pgoutbox is one process per slot",
	"topic.prefix":                              "only names Debezium's own change-event topics",
	"database.server.name":                      "only names Debezium's own change-event topics",
	"tombstones.on.delete":                      "DELETEs on the outbox table are dropped, never turned into tombstones",
	"heartbeat.interval.ms":                     "pgoutbox confirms the slot on idle keepalives; no heartbeat records are needed",
	"heartbeat.topics.prefix":                   "pgoutbox writes no heartbeat records",
	"heartbeat.action.query":                    "pgoutbox confirms the slot on idle keepalives without writing to the database",
	"schema.include.list":                       "the tables come from table.include.list",
	"include.schema.changes":                    "no schema change events are produced",
	"decimal.handling.mode":                     "outbox values are routed as their PostgreSQL text",
	"time.precision.mode":                       "outbox values are routed as their PostgreSQL text",
	"binary.handling.mode":                      "bytea payloads are routed as raw bytes",
	"max.batch.size":                            "batching is set by kafka.flush.*",
	"max.queue.size":                            "in-flight caps are relay.max.inflight.*",
	"max.queue.size.in.bytes":                   "in-flight caps are relay.max.inflight.*",
	"poll.interval.ms":                          "pgoutbox streams without polling",
	"errors.max.retries":                        "reconnects use relay.restart.backoff*",
	"errors.tolerance":                          "a row that cannot be routed stops the relay",
	"errors.log.enable":                         "",
	"errors.log.include.messages":               "",
	"slot.stream.params":                        "",
	"slot.max.retries":                          "reconnects use relay.restart.backoff*",
	"slot.retry.delay.ms":                       "reconnects use relay.restart.backoff*",
	"retriable.restart.connector.wait.ms":       "reconnects use relay.restart.backoff*",
	"database.tcpKeepAlive":                     "",
	"database.initial.statements":               "",
	"topic.creation.default.partitions":         "pgoutbox does not create topics",
	"topic.creation.default.replication.factor": "pgoutbox does not create topics",
	"topic.creation.enable":                     "pgoutbox does not create topics",
	"skipped.operations":                        "only INSERTs on the outbox table produce records",
	"signal.data.collection":                    "",
	"message.key.columns":                       "the key comes from table.field.event.key",
	"key.converter.schemas.enable":              "",
	"value.converter.schemas.enable":            "",
	"transforms.outbox.predicate":               "",
}

// connectorRefused are keys with a meaning pgoutbox cannot honour, and why.
var connectorRefused = map[string]string{
	"table.exclude.list":                  "name the outbox tables in table.include.list instead",
	"column.include.list":                 "pgoutbox routes whole outbox rows",
	"column.exclude.list":                 "pgoutbox routes whole outbox rows",
	"provide.transaction.metadata":        "pgoutbox produces no transaction metadata topic",
	"predicates":                          "predicates on transforms are not supported",
	"snapshot.select.statement.overrides": "pgoutbox takes no snapshots",
}

type connectorFile struct {
	Name   string            `json:"name"`
	Config map[string]string `json:"config"`
}

// readConnector reads the JSON a user POSTs to Kafka Connect, either
// {"name": ..., "config": {...}} or the bare config map. Values may be JSON
// strings, numbers or booleans.
func readConnector(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read connector file: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("connector file %s: not a JSON object: %w", path, err)
	}
	if cfg, ok := raw["config"]; ok {
		raw = nil
		if err := json.Unmarshal(cfg, &raw); err != nil {
			return nil, fmt.Errorf("connector file %s: \"config\" is not a JSON object: %w", path, err)
		}
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			out[k] = s
			continue
		}
		var any interface{}
		if err := json.Unmarshal(v, &any); err != nil {
			return nil, fmt.Errorf("connector file %s: key %q: %w", path, k, err)
		}
		switch x := any.(type) {
		case float64:
			out[k] = strconv.FormatFloat(x, 'f', -1, 64)
		case bool:
			out[k] = strconv.FormatBool(x)
		default:
			return nil, fmt.Errorf("connector file %s: key %q must be a string, number or boolean", path, k)
		}
	}
	return out, nil
}

// applyConnector sets cfg from a connector configuration. It returns the
// keys it ignored (for one warning) or an error naming every key it cannot
// honour.
func applyConnector(cfg *fileConfig, conn map[string]string) (ignored []string, err error) {
	var refused []string
	refuse := func(key, why string) { refused = append(refused, fmt.Sprintf("%s=%q: %s", key, conn[key], why)) }
	used := map[string]bool{}
	get := func(k string) (string, bool) {
		v, ok := conn[k]
		used[k] = true
		return v, ok
	}

	if v, _ := get("connector.class"); v != postgresConnector {
		refuse("connector.class", "pgoutbox replaces "+postgresConnector)
	}
	if v, ok := get("plugin.name"); ok && v != "pgoutput" {
		refuse("plugin.name", "pgoutbox streams with pgoutput only; create a pgoutput slot (plugin.name=pgoutput)")
	}
	if v, ok := get("snapshot.mode"); ok {
		switch v {
		case "no_data", "never":
		case "initial": // the rows already in the outbox tables, then the stream
			cfg.Snapshot.Mode = relay.SnapshotInitial
		default:
			refuse("snapshot.mode", "pgoutbox publishes the outbox tables' rows once when it creates the slot (initial) or not at all (no_data); use one of those")
		}
	}
	if v, ok := get("slot.drop.on.stop"); ok && strings.EqualFold(v, "true") {
		refuse("slot.drop.on.stop", "dropping the slot on stop loses every event written while pgoutbox is down")
	}

	// Database connection.
	u := url.URL{Scheme: "postgres", Host: "localhost:5432"}
	host, _ := get("database.hostname")
	port, _ := get("database.port")
	if host != "" || port != "" {
		if host == "" {
			host = "localhost"
		}
		if port == "" {
			port = "5432"
		}
		u.Host = host + ":" + port
	}
	user, _ := get("database.user")
	pass, hasPass := get("database.password")
	if strings.HasPrefix(pass, "${") {
		refuse("database.password", "Kafka Connect config providers are not resolved; give the password with PGOUTBOX_POSTGRES_PASSWORD, postgres.password.file or PGPASSWORD")
		hasPass = false
	}
	switch {
	case user != "" && hasPass:
		u.User = url.UserPassword(user, pass)
	case user != "":
		u.User = url.User(user)
	}
	db, _ := get("database.dbname")
	u.Path = "/" + db
	q := url.Values{}
	for _, k := range []string{"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword"} {
		if v, ok := get("database." + k); ok {
			q.Set(k, v)
		}
	}
	u.RawQuery = q.Encode()
	if host != "" || db != "" || user != "" {
		cfg.Postgres.DSN = u.String()
	}

	if v, ok := get("slot.name"); ok {
		cfg.Postgres.Slot = v
	}
	if v, ok := get("publication.name"); ok {
		cfg.Postgres.Publication = v
	}
	if v, ok := get("publication.autocreate.mode"); ok {
		switch v {
		case replication.PublicationDisabled, replication.PublicationFiltered, replication.PublicationAllTables:
			cfg.Postgres.PublicationAutocreate = v
		default:
			refuse("publication.autocreate.mode", "use disabled, filtered or all_tables")
		}
	}
	if v, ok := get("table.include.list"); ok {
		var tables []string
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			// Debezium reads these as regular expressions; pgoutbox needs the
			// tables themselves. An escaped dot is a plain dot.
			t = strings.ReplaceAll(t, `\.`, ".")
			if strings.ContainsAny(t, `*+?[](){}|^$\`) {
				refuse("table.include.list", fmt.Sprintf("%q is a regular expression; list the outbox tables by name (schema.table)", t))
				continue
			}
			if t != "" {
				tables = append(tables, t)
			}
		}
		cfg.Postgres.Tables = tables
	}
	if v, ok := get("status.update.interval.ms"); ok {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			refuse("status.update.interval.ms", "want a positive number of milliseconds")
		} else {
			cfg.Postgres.StatusInterval = time.Duration(ms) * time.Millisecond
		}
	}

	// Transforms: exactly one EventRouter; its options are the router's.
	var routerName string
	if v, ok := get("transforms"); ok {
		for _, name := range strings.Split(v, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			typ, _ := get("transforms." + name + ".type")
			if typ != eventRouter {
				refuse("transforms."+name+".type", "pgoutbox applies the outbox "+eventRouter+" only; remove this transform")
				continue
			}
			if routerName != "" {
				refuse("transforms", "more than one EventRouter transform")
				continue
			}
			routerName = name
		}
	}
	if routerName == "" && len(refused) == 0 {
		refuse("transforms", "no "+eventRouter+" transform: pgoutbox relays outbox events only")
	}
	if routerName != "" {
		prefix := "transforms." + routerName + "."
		for k, v := range conn {
			if !strings.HasPrefix(k, prefix) || k == prefix+"type" {
				continue
			}
			used[k] = true
			opt := strings.TrimPrefix(k, prefix)
			if strings.HasPrefix(opt, "predicate") || opt == "negate" {
				refuse(k, "predicates on transforms are not supported")
				continue
			}
			if err := cfg.Router.Set(opt, v); err != nil {
				refuse(k, err.Error())
			}
		}
	}
	for _, k := range []string{"key.converter", "value.converter", "key.converter.schemas.enable", "value.converter.schemas.enable"} {
		if v, ok := get(k); ok {
			if err := cfg.Router.Set(k, v); err != nil {
				refuse(k, err.Error())
			}
		}
	}

	for k, why := range connectorRefused {
		if _, ok := conn[k]; ok && !used[k] {
			used[k] = true
			refuse(k, why)
		}
	}
	for k := range conn {
		if !used[k] {
			ignored = append(ignored, k)
		}
	}
	sort.Strings(ignored)
	if len(refused) > 0 {
		sort.Strings(refused)
		return ignored, fmt.Errorf("connector configuration has settings pgoutbox cannot honour:\n  %s", strings.Join(refused, "\n  "))
	}
	return ignored, nil
}
