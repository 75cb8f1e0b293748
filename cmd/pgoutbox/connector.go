package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// Kafka Connect import: a Debezium PostgreSQL connector configuration with
// the outbox EventRouter transform, as POSTed to Kafka Connect, becomes
// pgoutbox's configuration. Brokers are not in it (they belong to the
// Connect worker) and come from pgoutbox's own settings, unless the
// connector overrides its producer's (producer.override.bootstrap.servers).

const (
	postgresConnector = "io.debezium.connector.postgresql.PostgresConnector"
	eventRouter       = "io.debezium.transforms.outbox.EventRouter"
	// decodeMessages is Debezium 3's transform that makes a logical
	// decoding message's JSON content the "after" of an insert, so that
	// the EventRouter after it routes the message as an outbox row: the
	// table-less outbox (messages.format=debezium).
	decodeMessages = "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent"
)

// tablesNotListed stands, among the ignored keys, for a connector without
// table.include.list.
const tablesNotListed = "table.include.list (not set)"

// connectorIgnored are keys whose absence of effect is harmless for an
// outbox relay; they are listed in one warning.
var connectorIgnored = map[string]string{
	tablesNotListed:                             "Debezium then captures every table of its publication (or of schema.include.list) and routes each through the EventRouter; pgoutbox relays postgres.table.include.list only (public.outbox unless set): if there are other outbox tables, list them all",
	"name":                                      "",
	"tasks.max":                                 "pgoutbox is one process per slot",
	"topic.prefix":                              "only names Debezium's own change-event topics",
	"database.server.name":                      "only names Debezium's own change-event topics",
	"tombstones.on.delete":                      "the EventRouter drops Debezium's delete tombstones, and pgoutbox never makes them",
	"heartbeat.interval.ms":                     "pgoutbox confirms idle keepalives, so an idle outbox never pins WAL; no heartbeat records are written",
	"heartbeat.topics.prefix":                   "pgoutbox writes no heartbeat records",
	"heartbeat.action.query":                    "pgoutbox confirms idle keepalives, so the slot advances without writes to the database",
	"schema.include.list":                       "the tables come from table.include.list",
	"include.schema.changes":                    "no schema change events are produced",
	"money.fraction.digits":                     "a money column routed through a Kafka Connect converter is refused as a poison row",
	"max.batch.size":                            "batching is set by kafka.flush.*",
	"max.queue.size":                            "in-flight caps are relay.max.inflight.*",
	"max.queue.size.in.bytes":                   "in-flight caps are relay.max.inflight.*",
	"poll.interval.ms":                          "pgoutbox streams without polling (postgres.receive.batch.wait is the nearest setting)",
	"errors.max.retries":                        "reconnects use relay.restart.backoff*",
	"errors.log.enable":                         "pgoutbox logs every poison row with its table, event id and reason",
	"errors.log.include.messages":               "pgoutbox never logs a payload",
	"errors.retry.timeout":                      "retriable errors are retried by the producer (kafka.retry.*)",
	"errors.retry.delay.max.ms":                 "retriable errors are retried by the producer (kafka.retry.*)",
	"slot.stream.params":                        "",
	"slot.max.retries":                          "reconnects use relay.restart.backoff*",
	"slot.retry.delay.ms":                       "reconnects use relay.restart.backoff*",
	"retriable.restart.connector.wait.ms":       "reconnects use relay.restart.backoff*",
	"database.tcpKeepAlive":                     "",
	"database.initial.statements":               "",
	"topic.creation.default.partitions":         "pgoutbox does not create topics",
	"topic.creation.default.replication.factor": "pgoutbox does not create topics",
	"topic.creation.enable":                     "pgoutbox does not create topics",
	"skipped.operations":                        "only INSERTs on the outbox table produce records; UPDATEs follow table.op.invalid.behavior",
	"signal.data.collection":                    "",
	"message.key.columns":                       "the key comes from table.field.event.key",
	"transforms.outbox.predicate":               "",
	"producer.override.acks":                    "pgoutbox always waits for every in-sync replica (acks=all)",
	"producer.override.enable.idempotence":      "pgoutbox's producer is always idempotent",
	"producer.override.max.in.flight.requests.per.connection": "pgoutbox keeps one request in flight per broker, which keeps the order per key",
	"producer.override.retries":                               "retries are kafka.retry.*",
	"producer.override.delivery.timeout.ms":                   "retries are kafka.retry.*",
	"producer.override.linger.ms":                             "batching is set by kafka.flush.*",
	"producer.override.batch.size":                            "batching is set by kafka.flush.*",
}

// connectorValueModes are the connector keys that change the Kafka Connect
// value Debezium makes of a column, with the one value pgoutbox reproduces
// (Debezium's default, which the conformance suite holds it to). Another
// value would change the bytes of numeric, time, interval or bytea columns
// routed through a Connect converter.
var connectorValueModes = map[string]string{
	"decimal.handling.mode":           "precise",
	"time.precision.mode":             "adaptive",
	"interval.handling.mode":          "numeric",
	"binary.handling.mode":            "bytes",
	"key.converter.decimal.format":    "BASE64",
	"value.converter.decimal.format":  "BASE64",
	"header.converter.decimal.format": "BASE64",
}

// routerIgnored are EventRouter options without effect in pgoutbox.
var routerIgnored = map[string]string{
	"tracing.operation.name":          "pgoutbox creates no spans: it forwards the application's trace context",
	"tracing.with.context.field.only": "pgoutbox writes tracing headers only for rows with a context",
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

// connectorRefusedPrefixes are families of keys pgoutbox cannot honour:
// they change column values, and ignored they would put into Kafka what the
// user meant to mask or cut.
var connectorRefusedPrefixes = map[string]string{
	"column.mask.":                "pgoutbox does not mask column values: the unmasked value would reach Kafka",
	"producer.override.security.": "pgoutbox's connection to Kafka is set by kafka.tls and kafka.sasl",
	"producer.override.sasl.":     "pgoutbox's connection to Kafka is set by kafka.tls and kafka.sasl",
	"producer.override.ssl.":      "pgoutbox's connection to Kafka is set by kafka.tls and kafka.sasl",
	"column.truncate.":            "pgoutbox does not truncate column values: the whole value would reach Kafka",
	"converters":                  "Debezium's custom converters are Java code pgoutbox cannot run",
}

// connectorConfig is the configuration file's connector section: what a
// Kafka Connect worker would have told the connector.
type connectorConfig struct {
	// ConfigProviders names the worker's config providers
	// (config.providers): file, dir and env, standing for Kafka's
	// FileConfigProvider, DirectoryConfigProvider and EnvVarConfigProvider.
	// A ${name:...} placeholder of another provider is an error.
	ConfigProviders []string `yaml:"config.providers"`
	// bootstrap is the connector's producer.override.bootstrap.servers:
	// the cluster Debezium's records went to, which kafka.brokers must
	// name once every setting is read (see checkConnectorBrokers).
	bootstrap []string
}

// readConnector reads the JSON a user POSTs to Kafka Connect, either
// {"name": ..., "config": {...}} or the bare config map. Values may be JSON
// strings, numbers or booleans; a key whose value is null is left out, as
// if absent (read as an empty string, an empty table.include.list would
// mean no table, where it means every table to Debezium).
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
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			continue
		}
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

// Debezium's PostgreSQL connector's defaults for the keys a connector JSON
// may leave out (publication.autocreate.mode aside: see applyConnector).
const (
	debeziumSlot         = "debezium"
	debeziumPublication  = "dbz_publication"
	debeziumSnapshotMode = "initial"
)

// applyConnector sets cfg from a connector configuration. It returns the
// keys it ignored (for one warning) or an error naming every key it cannot
// honour.
func applyConnector(cfg *fileConfig, given map[string]string) (ignored []string, err error) {
	var refused []string
	// Messages quote the values as given: a resolved value may be a secret.
	refuse := func(key, why string) { refused = append(refused, fmt.Sprintf("%s=%q: %s", key, given[key], why)) }
	conn := make(map[string]string, len(given))
	for k, v := range given {
		r, err := resolveProviders(v, cfg.Connector.ConfigProviders)
		if err != nil {
			refuse(k, err.Error())
			continue
		}
		conn[k] = r
	}
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
	// Keys the JSON leaves out mean Debezium's defaults, as on a Connect
	// worker: the slot and publication named so are the ones Debezium
	// streamed from, and taking pgoutbox's own names instead would create a
	// new slot and skip the events still pending in Debezium's.
	v, ok := get("snapshot.mode")
	if !ok {
		v = debeziumSnapshotMode
	}
	switch v {
	case "no_data", "never": // over a file's initial too: the connector applies over the file
		cfg.Snapshot.Mode = relay.SnapshotNoData
	case "initial": // the rows already in the outbox tables, then the stream
		cfg.Snapshot.Mode = relay.SnapshotInitial
	default:
		refuse("snapshot.mode", "pgoutbox publishes the outbox tables' rows once when it creates the slot (initial) or not at all (no_data); use one of those")
	}
	for k, want := range connectorValueModes {
		if v, ok := get(k); ok && !strings.EqualFold(strings.TrimSpace(v), want) {
			refuse(k, fmt.Sprintf("pgoutbox reproduces Debezium's values of numeric, date and time, interval and bytea columns at %s=%s (Debezium's default) only", k, want))
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

	cfg.Postgres.Slot = debeziumSlot
	if v, ok := get("slot.name"); ok {
		cfg.Postgres.Slot = v
	} else {
		// Debezium's default names the slot Debezium streamed from: one
		// that does not exist is not created under it, or a JSON that
		// relied on pgoutbox's own default (a slot named pgoutbox) would
		// move to a new slot without a word, skipping what is pending in
		// the old one. Set slot.name to create one.
		cfg.Postgres.CreateSlot = false
	}
	cfg.Postgres.Publication = debeziumPublication
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
	v, tablesListed := get("table.include.list")
	if tablesListed {
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
		if strings.Trim(v, ", \t") == "" {
			// To Debezium an empty include list is no filter at all: every
			// table of the publication is captured. To pgoutbox it would be
			// no table, and nothing would be relayed, without a word.
			refuse("table.include.list", "names no table: Debezium reads an empty list as every table of the publication, pgoutbox would relay none; name the outbox tables (schema.table, comma-separated), or remove the key to relay postgres.table.include.list (public.outbox unless set)")
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
	// Before it, Debezium's DecodeLogicalDecodingMessageContent may make
	// messages outbox rows.
	var routerName, decodeName string
	if v, ok := get("transforms"); ok {
		for _, name := range strings.Split(v, ",") {
			name = strings.TrimSpace(name)
			if name == "" {
				continue
			}
			typ, _ := get("transforms." + name + ".type")
			if typ == decodeMessages {
				switch {
				case routerName != "":
					refuse("transforms", "the "+decodeMessages+" transform comes after the EventRouter, so Debezium routes no message; put it first")
				case decodeName != "":
					refuse("transforms", "more than one "+decodeMessages+" transform")
				}
				decodeName = name
				continue
			}
			if typ != eventRouter {
				refuse("transforms."+name+".type", "pgoutbox applies the outbox "+eventRouter+" only (and, before it, "+decodeMessages+"); remove this transform")
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
		transformOptions(conn, routerName, used, refuse, func(k, opt, v string) {
			if _, ok := routerIgnored[opt]; ok {
				used[k] = false
				return
			}
			if err := cfg.Router.Set(opt, v); err != nil {
				refuse(k, err.Error())
			}
		})
	}
	// Kafka Connect's worker writes headers with SimpleHeaderConverter
	// unless told otherwise.
	cfg.Router.HeaderConverter = router.ConverterHeader
	for _, k := range []string{"key.converter", "value.converter", "key.converter.schemas.enable", "value.converter.schemas.enable",
		"header.converter", "header.converter.schemas.enable", "extended.headers.enabled"} {
		if v, ok := get(k); ok {
			if err := cfg.Router.Set(k, v); err != nil {
				refuse(k, err.Error())
			}
		}
	}
	// Kafka Connect takes a converter the connector does not name from its
	// worker's configuration, which pgoutbox cannot see. Guessing would
	// write other key bytes than Debezium did (a JsonConverter key is the
	// quoted string), and put each aggregate's events on another
	// partition after a cutover: per-key order broken, without a word.
	for _, k := range []string{"key.converter", "value.converter"} {
		if _, ok := get(k); !ok {
			refused = append(refused, fmt.Sprintf("%s: not set, so Kafka Connect takes it from its worker's configuration, which pgoutbox cannot see; copy the worker's %s (and %s.schemas.enable) into the connector JSON, as pgoutbox must write the bytes Debezium wrote", k, k, k))
		}
	}
	// Debezium 3's extended headers are on by default; they name the
	// connector by its logical name, topic.prefix, which Debezium requires
	// (without it there is no Debezium to be like, and no such headers).
	prefix, _ := get("topic.prefix")
	if _, ok := conn["extended.headers.enabled"]; !ok && prefix != "" {
		cfg.Router.ExtendedHeaders = true
	}
	cfg.Router.ExtendedHeadersLogicalName = prefix
	if cfg.Router.ExtendedHeaders && prefix == "" {
		refuse("topic.prefix", "extended headers name the connector by its logical name: set topic.prefix (Debezium requires it) or extended.headers.enabled=false")
	}

	// Errors: Kafka Connect's tolerance becomes pgoutbox's poison policy.
	// With all, Kafka Connect skips a record that fails in a transform or
	// a converter; pgoutbox dead-letters it (relay.dead.letter.topic), so
	// the outbox topics hold the same records and nothing vanishes.
	if v, ok := get("errors.tolerance"); ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "none":
			cfg.Relay.PoisonPolicy = "fail"
		case "all":
			cfg.Relay.PoisonPolicy = "dead-letter"
		default:
			refuse("errors.tolerance", "use none or all")
		}
	}
	if v, ok := get("skipped.operations"); ok {
		for _, op := range strings.Split(v, ",") {
			switch strings.TrimSpace(op) {
			case "c":
				refuse("skipped.operations", "skipping inserts (c) would relay no event at all")
			case "u", "d", "t", "none", "":
			default:
				refuse("skipped.operations", fmt.Sprintf("%q is not an operation: use c, u, d, t or none", op))
			}
		}
	}
	// Logical decoding messages: Debezium's connector writes each one its
	// prefix filters let through to <topic.prefix>.message with its
	// change-event envelope, and the EventRouter passes it on unchanged (it
	// routes rows, not messages; a real Debezium 3.6.1 did so). pgoutbox
	// writes the same records (see the relay's writesDebeziumRecord); the
	// filters say which. They do not set messages.prefix (the table-less
	// outbox, pgoutbox's own: set it in the file or with
	// PGOUTBOX_MESSAGES_PREFIX), but for Debezium's own table-less outbox
	// (decodedMessages).
	cfg.Messages.Debezium = debeziumMessages(conn, get)
	if decodeName != "" {
		decodedMessages(cfg, conn, get, refuse, used, decodeName)
	}
	// Kafka Connect's exactly-once source support (KIP-618): required is
	// pgoutbox's exactly-once mode; requested (Connect's default) and
	// anything else leave it off, as a worker without
	// exactly.once.source.support=enabled does.
	if v, ok := get("exactly.once.support"); ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "required":
			cfg.Kafka.ExactlyOnce = true
		case "requested":
		default:
			refuse("exactly.once.support", "use required or requested")
		}
	}
	if v, ok := get("offsets.storage.topic"); ok && cfg.Kafka.ExactlyOnce {
		cfg.Kafka.OffsetsTopic = v
	}

	applyProducerOverrides(cfg, get, refuse)

	for k, why := range connectorRefused {
		if _, ok := conn[k]; ok && !used[k] {
			used[k] = true
			refuse(k, why)
		}
	}
	for k := range conn {
		for prefix, why := range connectorRefusedPrefixes {
			if strings.HasPrefix(k, prefix) && !used[k] {
				used[k] = true
				refuse(k, why)
			}
		}
	}
	for k := range given {
		if !used[k] {
			ignored = append(ignored, k)
		}
	}
	if !tablesListed {
		// Not an error (the default, public.outbox, may be all there is),
		// but said with the ignored keys: Debezium would capture more.
		ignored = append(ignored, tablesNotListed)
	}
	sort.Strings(ignored)
	if len(refused) > 0 {
		sort.Strings(refused)
		return ignored, fmt.Errorf("connector configuration has settings pgoutbox cannot honour:\n  %s", strings.Join(refused, "\n  "))
	}
	return ignored, nil
}

// applyProducerOverrides reads Kafka Connect's per-connector producer
// overrides that decide where records go and what they may be: ignored,
// the cluster would be another than Debezium wrote to, and records
// Debezium could send would be refused as too large.
func applyProducerOverrides(cfg *fileConfig, get func(string) (string, bool), refuse func(key, why string)) {
	if v, ok := get("producer.override.bootstrap.servers"); ok {
		var servers []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				servers = append(servers, s)
			}
		}
		switch {
		case len(servers) == 0:
			refuse("producer.override.bootstrap.servers", "names no broker")
		case len(cfg.Kafka.Brokers) > 0 && !sameBrokers(cfg.Kafka.Brokers, servers):
			refuse("producer.override.bootstrap.servers", fmt.Sprintf("Debezium wrote to this cluster, and kafka.brokers names another (%s): make them the same", strings.Join(cfg.Kafka.Brokers, ",")))
		default:
			cfg.Kafka.Brokers, cfg.Connector.bootstrap = servers, servers
		}
	}
	if v, ok := get("producer.override.max.request.size"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err != nil || n <= 0 {
			refuse("producer.override.max.request.size", "not a positive number of bytes")
		} else {
			cfg.Kafka.MaxMessageBytes = n
		}
	}
	// The partition of a keyed record: pgoutbox hashes the key as Kafka's
	// built-in partitioner does (the conformance suite holds it to the
	// partitions Debezium wrote). A partitioner that ignores keys put a
	// real Debezium's records on other partitions than pgoutbox's, and
	// after a cutover one aggregate's events would be on two partitions,
	// their order lost (a black-box review saw a1..a6 spread differently).
	if v, ok := get("producer.override.partitioner.class"); ok {
		switch strings.TrimSpace(v) {
		case "", "org.apache.kafka.clients.producer.internals.DefaultPartitioner":
		default:
			refuse("producer.override.partitioner.class", "pgoutbox puts a keyed record on the partition Kafka's built-in partitioner chooses by its key, as Debezium does with no partitioner set; another partitioner puts records elsewhere, and after a cutover one aggregate's events would be on two partitions: remove it (or move its records to the built-in partitioner's partitions yourself)")
		}
	}
	if v, ok := get("producer.override.partitioner.ignore.keys"); ok && !strings.EqualFold(strings.TrimSpace(v), "false") {
		refuse("producer.override.partitioner.ignore.keys", "pgoutbox puts a keyed record on the partition its key hashes to, as Debezium does by default; ignoring keys put Debezium's records elsewhere, and after a cutover one aggregate's events would be on two partitions: remove it")
	}
	if v, ok := get("producer.override.compression.type"); ok {
		switch c := strings.ToLower(strings.TrimSpace(v)); c {
		case "none", "gzip", "snappy", "lz4", "zstd":
			cfg.Kafka.Compression = c
		default:
			refuse("producer.override.compression.type", "use none, gzip, snappy, lz4 or zstd")
		}
	}
}

// debeziumMessages is what Debezium's connector does with logical
// decoding messages (relay.DebeziumMessages), from topic.prefix and
// message.prefix.include.list / exclude.list. Debezium reads each list as
// regular expressions, each matching a whole prefix in either case. One
// that Go cannot compile is taken to include every prefix, or to exclude
// none, and the result marked uncertain: the relay then names too many
// messages, never too few, and writes none.
func debeziumMessages(conn map[string]string, get func(string) (string, bool)) *relay.DebeziumMessages {
	// Debezium 3 names its topics by topic.prefix alone (it does not start
	// without it; database.server.name was Debezium 1's).
	name, _ := get("topic.prefix")
	d := &relay.DebeziumMessages{Name: strings.TrimSpace(name), Certain: true}
	if d.Name != "" {
		d.Topic = d.Name + ".message"
	}
	d.DB, _ = get("database.dbname")
	list := func(key string, include bool) []*regexp.Regexp {
		v, _ := get(key)
		var out []*regexp.Regexp
		for _, p := range splitRegexList(v) {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			g, err := router.GoRegex(p)
			var re *regexp.Regexp
			if err == nil {
				re, err = regexp.Compile(`(?i)\A(?:` + g + `)\z`)
			}
			switch {
			case err == nil:
				out = append(out, re)
			case include:
				out = append(out, regexp.MustCompile(``))
				d.Certain = false
			default:
				d.Certain = false
			}
		}
		return out
	}
	d.Include, d.Exclude = list("message.prefix.include.list", true), list("message.prefix.exclude.list", false)
	return d
}

// transformOptions calls apply for each option of transform name
// (transforms.<name>.<opt>, but its type), marked used; a predicate on the
// transform is refused instead.
func transformOptions(conn map[string]string, name string, used map[string]bool, refuse func(key, why string), apply func(k, opt, v string)) {
	prefix := "transforms." + name + "."
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
		apply(k, opt, v)
	}
}

// decodedMessages applies a DecodeLogicalDecodingMessageContent transform
// (decodeName) before the EventRouter: Debezium's table-less outbox, in
// which every message its prefix filters let through is decoded and routed
// as an outbox row. pgoutbox relays the messages of one prefix: the
// connector must name it, alone and without a pattern, in
// message.prefix.include.list; it becomes messages.prefix, read with
// messages.format=debezium.
func decodedMessages(cfg *fileConfig, conn map[string]string, get func(string) (string, bool), refuse func(key, why string), used map[string]bool, decodeName string) {
	transformOptions(conn, decodeName, used, refuse, func(k, opt, v string) {
		if opt != "fields.null.include" || !strings.EqualFold(strings.TrimSpace(v), "false") {
			refuse(k, "pgoutbox reads messages as the transform's defaults do; remove this option")
		}
	})
	list, _ := get("message.prefix.include.list")
	names := splitRegexList(list)
	p := ""
	if len(names) == 1 {
		// A dot, escaped or not, is taken as itself (com.acme.outbox).
		p = strings.ReplaceAll(strings.TrimSpace(names[0]), `\.`, ".")
	}
	if p == "" || strings.ContainsAny(p, `*+?[](){}|^$\`) {
		refuse("message.prefix.include.list", "with "+decodeMessages+", name the prefix of the outbox messages here, one prefix and no pattern: Debezium decodes and routes every message its filters let through, pgoutbox relays the messages of one prefix (messages.prefix)")
		return
	}
	if v, ok := get("value.converter"); ok && !router.IsJSONConverter(v) {
		refuse("value.converter", "with "+decodeMessages+", pgoutbox writes the messages' payload objects as JsonConverter does: use "+router.ConverterJSON+" (as Debezium, whose StringConverter would write Struct{...})")
	}
	cfg.Messages.Prefix = p
	cfg.Messages.Format = relay.MessagesDebezium
}

// splitRegexList splits a Debezium list of regular expressions at its
// commas, as Debezium does: a comma escaped with a backslash is part of
// its expression (where it means a comma, as in Java).
func splitRegexList(v string) []string {
	var out []string
	start := 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case ',':
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return append(out, v[start:])
}

// writesNoMessage says whether Debezium writes no message at all: no
// include list, and an exclude list that takes every prefix (.*).
func writesNoMessage(d *relay.DebeziumMessages) bool {
	return len(d.Include) == 0 && slices.ContainsFunc(d.Exclude, func(re *regexp.Regexp) bool {
		return re.MatchString("") && re.MatchString("outbox") && re.MatchString("Z9_-.x")
	})
}

// sameBrokers says whether a and b name the same brokers, in any order.
func sameBrokers(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// checkConnectorBrokers refuses a kafka.brokers that the environment set,
// after the connector import, to another cluster than the connector's
// producer.override.bootstrap.servers named.
func checkConnectorBrokers(cfg fileConfig) error {
	if b := cfg.Connector.bootstrap; b != nil && !sameBrokers(b, cfg.Kafka.Brokers) {
		return fmt.Errorf("the connector's producer.override.bootstrap.servers names %s, where Debezium's records went, and kafka.brokers (set in the environment) names %s: make them the same",
			strings.Join(b, ","), strings.Join(cfg.Kafka.Brokers, ","))
	}
	return nil
}

// configVariable is Kafka's ConfigTransformer pattern: ${provider:[path:]key}.
var configVariable = regexp.MustCompile(`\$\{([^}]*?):(([^}]*?):)?([^}]*?)\}`)

// envReferences are the environment variables conn's ${env:NAME}
// placeholders name: read on purpose, they are no typos of a setting even
// when they start with PGOUTBOX_.
func envReferences(conn map[string]string) []string {
	var out []string
	for _, v := range conn {
		for _, g := range configVariable.FindAllStringSubmatch(v, -1) {
			if g[1] == "env" && g[3] == "" && !slices.Contains(out, g[4]) {
				out = append(out, g[4])
			}
		}
	}
	return out
}

// resolveProviders replaces the config-provider placeholders in v, as a
// Kafka Connect worker whose config.providers are providers would: file
// (FileConfigProvider: ${file:/path/to.properties:key}, a key of a
// properties file), dir (DirectoryConfigProvider: ${dir:/path:name}, the
// content of a file in a directory, as Kubernetes mounts a secret) and env
// (EnvVarConfigProvider: ${env:NAME}). A placeholder of a provider not
// configured, or one that names nothing, is an error, where Kafka Connect
// would leave the text as it is.
func resolveProviders(v string, providers []string) (string, error) {
	var err error
	out := configVariable.ReplaceAllStringFunc(v, func(m string) string {
		if err != nil {
			return m
		}
		g := configVariable.FindStringSubmatch(m)
		name, path, key := g[1], g[3], g[4]
		if !slices.Contains(providers, name) {
			err = fmt.Errorf("config provider %q is not configured: list it in connector.config.providers (PGOUTBOX_CONNECTOR_CONFIG_PROVIDERS: file, dir, env), as config.providers on the Connect worker", name)
			return m
		}
		var val string
		switch name {
		case "file":
			val, err = propertiesValue(path, key)
		case "dir":
			if strings.ContainsAny(key, "/\x00") || key == ".." || key == "." {
				err = fmt.Errorf("config provider dir: %q is not a file name", key)
				break
			}
			var b []byte
			b, err = os.ReadFile(filepath.Join(path, key))
			if err != nil {
				err = fmt.Errorf("config provider dir: %w", err)
			}
			val = string(b)
		case "env":
			if path != "" {
				err = fmt.Errorf("config provider env takes ${env:NAME}, without a path")
				break
			}
			var ok bool
			if val, ok = os.LookupEnv(key); !ok {
				err = fmt.Errorf("config provider env: environment variable %s is not set", key)
			}
		default:
			err = fmt.Errorf("config provider %q: pgoutbox knows file, dir and env (Kafka's FileConfigProvider, DirectoryConfigProvider and EnvVarConfigProvider)", name)
		}
		return val
	})
	return out, err
}

// propertiesValue reads key from the Java properties file at path.
func propertiesValue(path, key string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("config provider file: %w", err)
	}
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimLeft(lines[i], " \t\f")
		// A line ending in an odd number of backslashes continues.
		for strings.HasSuffix(line, "\\") && (len(line)-len(strings.TrimRight(line, "\\")))%2 == 1 && i+1 < len(lines) {
			i++
			line = line[:len(line)-1] + strings.TrimLeft(lines[i], " \t\f")
		}
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		k, v := splitProperty(line)
		if k == key {
			return v, nil
		}
	}
	return "", fmt.Errorf("config provider file: no key %q in %s", key, path)
}

// splitProperty splits a properties line at its first unescaped =, : or
// white space and unescapes both sides.
func splitProperty(line string) (string, string) {
	i := 0
	for i < len(line) && !strings.ContainsRune("=: \t\f", rune(line[i])) {
		if line[i] == '\\' {
			i++
		}
		i++
	}
	i = min(i, len(line))
	rest := strings.TrimLeft(line[i:], " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	return unescapeProperty(line[:i]), unescapeProperty(rest)
}

func unescapeProperty(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch s[i] {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+4 < len(s) {
				if r, err := strconv.ParseUint(s[i+1:i+5], 16, 16); err == nil {
					b.WriteRune(rune(r))
					i += 4
					continue
				}
			}
			b.WriteByte('u')
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
