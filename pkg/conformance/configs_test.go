package conformance

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
)

const (
	jsonConverter   = "org.apache.kafka.connect.json.JsonConverter"
	stringConverter = "org.apache.kafka.connect.storage.StringConverter"
)

// confCase is one connector configuration: the keys that differ from the
// common Kafka Connect setup (String keys, JsonConverter values without
// schemas, the EventRouter with its defaults).
type confCase struct {
	name string
	conn map[string]string
	// null selects the NULL-event-id table and publication.
	null bool
	// timestampColumn: the records' timestamps come from the ts column and
	// are compared.
	timestampColumn bool
	// forwardsTrace: pgoutbox writes the tracing headers of the rows' span
	// contexts, which Debezium without OpenTelemetry does not.
	forwardsTrace bool
	// providers: the database name and user come from Kafka's config
	// providers (${env:...}, ${file:...}), as on Kubernetes.
	providers bool
	// messages: Debezium's table-less outbox, its
	// DecodeLogicalDecodingMessageContent before the EventRouter, with the
	// message workload (the other configurations leave its prefixes out).
	messages bool
	// rawMessages: the message workload without the decoder: Debezium
	// writes every message to <topic.prefix>.message, unrouted.
	rawMessages bool
}

func confCases() []confCase {
	return []confCase{
		{name: "connect-default"},
		{name: "json-key", conn: map[string]string{
			"key.converter": jsonConverter, "key.converter.schemas.enable": "false"}},
		{name: "expand", conn: map[string]string{
			"transforms.outbox.table.expand.json.payload": "true"}},
		{name: "expand-tolerant", conn: map[string]string{
			"transforms.outbox.table.expand.json.payload": "true",
			"errors.tolerance":                            "all", "errors.log.enable": "true"}},
		{name: "expand-nulls-json-key", conn: map[string]string{
			"transforms.outbox.table.expand.json.payload":        "true",
			"transforms.outbox.table.json.payload.null.behavior": "optional_bytes",
			"key.converter": jsonConverter, "key.converter.schemas.enable": "false",
			"errors.tolerance": "all"}},
		{name: "placements", conn: map[string]string{
			"transforms.outbox.table.fields.additional.placement": "type:header:eventType,flag:header,part:header:partHeader,aggregateid:envelope:aggregate,type:envelope,part:partition"}},
		{name: "tombstone", conn: map[string]string{
			"transforms.outbox.route.tombstone.on.empty.payload": "true"}},
		{name: "routing", conn: map[string]string{
			"transforms.outbox.route.by.field":          "type",
			"transforms.outbox.route.topic.regex":       `(?<kind>[A-Z][a-z]+)(?<verb>Created|Paid)(?<run>[a-z0-9]+)`,
			"transforms.outbox.route.topic.replacement": "conf.${kind}.$2.${run}"}},
		{name: "no-extended-headers", conn: map[string]string{
			"extended.headers.enabled": "false"}},
		{name: "timestamp", timestampColumn: true, conn: map[string]string{
			"transforms.outbox.table.field.event.timestamp": "ts"}},
		{name: "version-tracing", forwardsTrace: true, conn: map[string]string{
			"transforms.outbox.table.field.event.schema.version": "version",
			"transforms.outbox.tracing.span.context.field":       "tracingspancontext"}},
		{name: "json-headers", conn: map[string]string{
			"header.converter": jsonConverter, "header.converter.schemas.enable": "false",
			"transforms.outbox.table.fields.additional.placement": "type:header:eventType,flag:header,part:header"}},
		// Columns of every common type placed into headers (Kafka Connect's
		// SimpleHeaderConverter, a connector JSON's default) and into the
		// envelope (JsonConverter), at Debezium's default handling modes.
		{name: "typed-placements", conn: map[string]string{
			"transforms.outbox.table.fields.additional.placement": typedPlacements("header", "") + "," + typedPlacements("envelope", "")}},
		// Typed keys: a timestamp under JsonConverter, a numeric(p,s)
		// under StringConverter (NULL in most rows: a null key).
		{name: "typed-json-key", conn: map[string]string{
			"key.converter": jsonConverter, "key.converter.schemas.enable": "false",
			"transforms.outbox.table.field.event.key": "at"}},
		{name: "typed-string-key", conn: map[string]string{
			"transforms.outbox.table.field.event.key": "tiny"}},
		{name: "typed-json-headers", conn: map[string]string{
			"header.converter": jsonConverter, "header.converter.schemas.enable": "false",
			"transforms.outbox.table.fields.additional.placement": typedPlacements("header", "")}},
		{name: "config-providers", providers: true},
		{name: "null-id", null: true},
		{name: "decode-messages", messages: true},
		{name: "decode-messages-tolerant", messages: true, conn: map[string]string{
			"errors.tolerance": "all", "errors.log.enable": "true"}},
		{name: "raw-messages", rawMessages: true},
		{name: "raw-messages-json-key", rawMessages: true, conn: map[string]string{
			"key.converter": jsonConverter, "key.converter.schemas.enable": "false"}},
	}
}

// typedPlacements places every typed column at placement, under its own
// name with suffix.
func typedPlacements(placement, suffix string) string {
	var out []string
	for _, c := range typedColumns {
		out = append(out, c+":"+placement+":"+c+suffix)
	}
	return strings.Join(out, ",")
}

// connector is the connector JSON pgoutbox runs (what a user POSTs to Kafka
// Connect); Debezium's is the same plus a RegexRouter that prefixes every
// topic, so that both can write to one broker, and topic creation for those
// prefixed topics.
func (c confCase) connector(env connEnv, slot string) map[string]string {
	cfg := map[string]string{
		"connector.class":                "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname":              "127.0.0.1",
		"database.port":                  strconv.Itoa(env.pgPort),
		"database.user":                  "postgres",
		"database.dbname":                env.dbname,
		"topic.prefix":                   "conformance" + env.tok,
		"plugin.name":                    "pgoutput",
		"slot.name":                      slot,
		"publication.name":               "conf_pub",
		"publication.autocreate.mode":    "disabled",
		"table.include.list":             `public\.conf_outbox,public\.conf_outbox_text`,
		"snapshot.mode":                  "no_data",
		"tasks.max":                      "1",
		"key.converter":                  stringConverter,
		"value.converter":                jsonConverter,
		"value.converter.schemas.enable": "false",
		"transforms":                     "outbox",
		"transforms.outbox.type":         "io.debezium.transforms.outbox.EventRouter",
	}
	if c.providers {
		cfg["database.dbname"] = "${env:" + providerEnv + "}"
		cfg["database.user"] = "${file:" + env.secrets + ":user}"
	}
	if c.null {
		cfg["publication.name"] = "conf_pub_null"
		cfg["table.include.list"] = `public\.conf_outbox_null`
	}
	if c.messages || c.rawMessages {
		cfg["publication.name"] = "conf_pub_msg"
		cfg["table.include.list"] = `public\.conf_outbox_msg`
	}
	switch {
	case c.rawMessages:
	case c.messages:
		cfg["transforms"] = "decode,outbox"
		cfg["transforms.decode.type"] = "io.debezium.connector.postgresql.transforms.DecodeLogicalDecodingMessageContent"
		cfg["message.prefix.include.list"] = msgPrefix
		// Debezium's transform fails on the tombstone of a delete (its
		// value has no schema: a NullPointerException stops the task), so
		// a deployment with it turns them off.
		cfg["tombstones.on.delete"] = "false"
	default:
		cfg["message.prefix.exclude.list"] = msgPrefix + "," + otherPrefix
	}
	maps.Copy(cfg, c.conn)
	return cfg
}

// debeziumPrefix is the prefix of the case's topics on Debezium's side.
func (c confCase) debeziumPrefix(tok string) string { return "dbz" + tok + "." + c.name + "." }

func (c confCase) debeziumConnector(env connEnv, slot string) map[string]string {
	cfg := c.connector(env, slot)
	cfg["transforms"] += ",prefix"
	cfg["transforms.prefix.type"] = "org.apache.kafka.connect.transforms.RegexRouter"
	cfg["transforms.prefix.regex"] = "(.*)"
	cfg["transforms.prefix.replacement"] = c.debeziumPrefix(env.tok) + "$1"
	cfg["topic.creation.default.replication.factor"] = "1"
	cfg["topic.creation.default.partitions"] = strconv.Itoa(topicPartitions)
	return cfg
}

type connEnv struct {
	pgPort int
	dbname string
	tok    string
	// secrets is the properties file of the file config provider.
	secrets string
}

// providerEnv is the environment variable of the env config provider.
const providerEnv = "PGOUTBOX_CONFORMANCE_DBNAME"

// providerWorker is the Connect worker's config.providers, and
// providerPgoutbox the same told to pgoutbox.
var (
	providerWorker = map[string]string{
		"config.providers":            "env,file",
		"config.providers.env.class":  "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
		"config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
	}
	providerPgoutbox = "PGOUTBOX_CONNECTOR_CONFIG_PROVIDERS=env,file"
)

func connectorJSON(name string, cfg map[string]string) []byte {
	b, err := json.MarshalIndent(map[string]any{"name": name, "config": cfg}, "", "  ")
	if err != nil {
		panic(fmt.Sprint("connector JSON: ", err))
	}
	return b
}
