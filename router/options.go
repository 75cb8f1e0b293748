package router

import (
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Options configures a Router. The YAML keys are Debezium's EventRouter
// option names and Kafka Connect's converter option names, so a Kafka
// Connect configuration carries over unchanged, plus a few options of
// pgoutbox's own; the package documentation describes each option.
//
// Start from DefaultOptions and overwrite what is configured (for example
// by unmarshalling YAML into the result, or with Set for the string map of
// a Kafka Connect connector); a zero Options is not valid.
type Options struct {
	EventIDField        string `yaml:"table.field.event.id"`
	EventKeyField       string `yaml:"table.field.event.key"`
	EventTypeField      string `yaml:"table.field.event.type"`
	EventPayloadField   string `yaml:"table.field.event.payload"`
	EventTimestampField string `yaml:"table.field.event.timestamp"`

	// AdditionalPlacement is Debezium's comma-separated list of
	// column:placement[:alias] entries.
	AdditionalPlacement string `yaml:"table.fields.additional.placement"`
	// AdditionalMissing is "error" or "ignore".
	AdditionalMissing string `yaml:"table.field.additional.missing"`
	// AdditionalErrorOnMissing is the older boolean form of
	// AdditionalMissing; nil when not given. false means "ignore".
	AdditionalErrorOnMissing *bool `yaml:"table.fields.additional.error.on.missing"`

	// OpInvalidBehavior is "warn", "error" or "fatal".
	OpInvalidBehavior string `yaml:"table.op.invalid.behavior"`

	// ExpandJSONPayload parses a string payload that starts with { or [ as
	// JSON and emits it as JSON.
	ExpandJSONPayload bool `yaml:"table.expand.json.payload"`
	// JSONPayloadNullBehavior is "ignore" (object fields whose value is null
	// are dropped from an expanded payload) or "optional_bytes" (they are
	// kept); it only matters with ExpandJSONPayload.
	JSONPayloadNullBehavior string `yaml:"table.json.payload.null.behavior"`

	RouteByField          string `yaml:"route.by.field"`
	RouteTopicRegex       string `yaml:"route.topic.regex"`
	RouteTopicReplacement string `yaml:"route.topic.replacement"`

	RouteTombstoneOnEmptyPayload bool `yaml:"route.tombstone.on.empty.payload"`

	// SchemaVersionField is Debezium's table.field.event.schema.version: an
	// integer column whose value Debezium sets as the version of the value
	// schema. Schemaless converters write no schema, so it changes no byte;
	// pgoutbox checks the column as Debezium reads it (present, NULL or an
	// int32). Empty for none.
	SchemaVersionField string `yaml:"table.field.event.schema.version"`
	// TracingSpanContextField is Debezium's tracing.span.context.field: a
	// column holding a java.util.Properties text with the application's
	// W3C trace context (traceparent=..., tracestate=...), which becomes
	// the headers traceparent and tracestate. Empty for none.
	TracingSpanContextField string `yaml:"tracing.span.context.field"`

	// ExtendedHeaders is Debezium 3's extended.headers.enabled: every
	// record starts with the headers __debezium.context.connectorLogicalName
	// (ExtendedHeadersLogicalName), .taskId (0), .connectorName
	// (postgresql) and .runId (ExtendedHeadersRunID). pgoutbox's default
	// is false; a Kafka Connect connector configuration turns it on, as
	// Debezium's default is true.
	ExtendedHeaders bool `yaml:"extended.headers.enabled"`
	// ExtendedHeadersLogicalName is the connector's logical name (Debezium's
	// topic.prefix) for the extended headers.
	ExtendedHeadersLogicalName string `yaml:"extended.headers.logical.name"`
	// ExtendedHeadersRunID identifies the run for the extended headers;
	// empty lets the relay pick a new UUIDv7 at each start, as Debezium
	// does at each task start.
	ExtendedHeadersRunID string `yaml:"extended.headers.run.id"`

	// The options below are pgoutbox's own; Debezium has no such options.

	// EventTraceField names a column holding a W3C trace context
	// (traceparent) that becomes the header "traceparent"; empty for none.
	EventTraceField string `yaml:"table.field.event.trace"`
	// RouteTopic, when not empty, is the topic of every row, instead of the
	// topic computed from route.by.field.
	RouteTopic string `yaml:"route.topic"`

	// KeyConverter and ValueConverter choose the bytes of the record key and
	// value: "raw" (the default: the column's own bytes), or a Kafka Connect
	// converter reproduced byte for byte:
	// "org.apache.kafka.connect.json.JsonConverter" or
	// "org.apache.kafka.connect.storage.StringConverter" (the simple class
	// names JsonConverter and StringConverter are accepted too). The names
	// are Kafka Connect's worker and connector options.
	KeyConverter   string `yaml:"key.converter"`
	ValueConverter string `yaml:"value.converter"`
	// KeyConverterSchemasEnable and ValueConverterSchemasEnable are
	// JsonConverter's schemas.enable; nil when not given, which for
	// JsonConverter means Kafka Connect's default, true. pgoutbox has no
	// schemas, so JsonConverter requires them to be false.
	KeyConverterSchemasEnable   *bool `yaml:"key.converter.schemas.enable"`
	ValueConverterSchemasEnable *bool `yaml:"value.converter.schemas.enable"`
	// HeaderConverter chooses the bytes of header values: "raw" (the
	// default: the column's own bytes), or Kafka Connect's
	// "org.apache.kafka.connect.storage.SimpleHeaderConverter" (the worker's
	// default: Java's text of the value, bytea as base64) or JsonConverter,
	// reproduced byte for byte. HeaderConverterSchemasEnable is
	// header.converter.schemas.enable, which must be false with
	// JsonConverter.
	HeaderConverter              string `yaml:"header.converter"`
	HeaderConverterSchemasEnable *bool  `yaml:"header.converter.schemas.enable"`
}

// Option names, as Debezium spells them.
const (
	optEventID             = "table.field.event.id"
	optEventKey            = "table.field.event.key"
	optEventType           = "table.field.event.type"
	optEventPayload        = "table.field.event.payload"
	optEventTimestamp      = "table.field.event.timestamp"
	optAdditionalPlacement = "table.fields.additional.placement"
	optAdditionalMissing   = "table.field.additional.missing"
	optErrorOnMissing      = "table.fields.additional.error.on.missing"
	optOpInvalidBehavior   = "table.op.invalid.behavior"
	optExpandJSONPayload   = "table.expand.json.payload"
	optJSONNullBehavior    = "table.json.payload.null.behavior"
	optRouteByField        = "route.by.field"
	optRouteTopicRegex     = "route.topic.regex"
	optRouteReplacement    = "route.topic.replacement"
	optTombstoneOnEmpty    = "route.tombstone.on.empty.payload"
	optSchemaVersion       = "table.field.event.schema.version"
	optTracingContext      = "tracing.span.context.field"
	optExtendedHeaders     = "extended.headers.enabled"

	// pgoutbox's own.
	optEventTrace         = "table.field.event.trace"
	optRouteTopic         = "route.topic"
	optKeyConverter       = "key.converter"
	optValueConverter     = "value.converter"
	optKeySchemasEnable   = "key.converter.schemas.enable"
	optValueSchemasEnable = "value.converter.schemas.enable"
	optHeaderConverter    = "header.converter"
	optHeaderSchemas      = "header.converter.schemas.enable"
	optLogicalName        = "extended.headers.logical.name"
	optRunID              = "extended.headers.run.id"
)

// Converter names accepted by key.converter and value.converter.
const (
	ConverterRaw    = "raw"
	ConverterJSON   = "org.apache.kafka.connect.json.JsonConverter"
	ConverterString = "org.apache.kafka.connect.storage.StringConverter"
	ConverterHeader = "org.apache.kafka.connect.storage.SimpleHeaderConverter"
)

// DefaultOptions returns Debezium's defaults, and for pgoutbox's own
// options: no trace column, no fixed topic, raw key and value.
func DefaultOptions() Options {
	return Options{
		EventIDField:            "id",
		EventKeyField:           "aggregateid",
		EventTypeField:          "type",
		EventPayloadField:       "payload",
		AdditionalMissing:       "error",
		OpInvalidBehavior:       "warn",
		JSONPayloadNullBehavior: "ignore",
		RouteByField:            "aggregatetype",
		RouteTopicRegex:         "(?<routedByValue>.*)",
		RouteTopicReplacement:   "outbox.event.${routedByValue}",
		KeyConverter:            ConverterRaw,
		ValueConverter:          ConverterRaw,
		HeaderConverter:         ConverterRaw,
	}
}

// Set assigns one option from its name and string value, as found in a
// Kafka Connect connector configuration (transforms.<name>.<option> for the
// router's options; key.converter, value.converter and their
// schemas.enable at the top level). Booleans are "true" or "false" in any
// case, as Kafka Connect reads them.
// An unknown name gives an *OptionError wrapping ErrUnsupportedOption; Set
// does not validate values otherwise (Validate does).
func (o *Options) Set(name, value string) error {
	i, ok := optionFields[name]
	if !ok {
		return &OptionError{Option: name, Value: value, Reason: "unknown or unsupported outbox router option", Err: ErrUnsupportedOption}
	}
	f := reflect.ValueOf(o).Elem().Field(i)
	if f.Kind() == reflect.String {
		f.SetString(value)
		return nil
	}
	b, err := parseBool(name, value)
	if err != nil {
		return err
	}
	if f.Kind() == reflect.Pointer {
		f.Set(reflect.ValueOf(&b))
	} else {
		f.SetBool(b)
	}
	return nil
}

// optionFields maps each option name to the index of its field in Options.
// The names are the YAML tags, so that Set and YAML cannot disagree.
var optionFields = func() map[string]int {
	m := make(map[string]int)
	typ := reflect.TypeFor[Options]()
	for i := range typ.NumField() {
		if tag := typ.Field(i).Tag.Get("yaml"); tag != "" && tag != "-" {
			m[tag] = i
		}
	}
	return m
}()

func parseBool(name, value string) (bool, error) {
	switch v := strings.TrimSpace(value); {
	case strings.EqualFold(v, "true"):
		return true, nil
	case strings.EqualFold(v, "false"):
		return false, nil
	}
	return false, &OptionError{Option: name, Value: value, Reason: "must be true or false", Err: ErrInvalidOption}
}

// Validate reports every invalid option, each as an *OptionError naming the
// option, joined with errors.Join. New calls it.
func (o Options) Validate() error {
	_, err := compile(o, "")
	return err
}

// placement is where an additional field goes.
type placement uint8

const (
	placeHeader placement = iota + 1
	placeEnvelope
	placePartition
)

// additionalField is one entry of table.fields.additional.placement.
type additionalField struct {
	column string
	place  placement
	name   string // the alias, or the column name when none was given

	// jsonKey and jacksonKey are name as a JSON object key with its colon,
	// for raw and JsonConverter envelopes.
	jsonKey, jacksonKey string
}

// parsePlacements parses Debezium's "column:placement[:alias],..." list.
// Entries are trimmed; empty entries are skipped (Debezium splits the same
// way); an empty alias means none, as Java's String.split drops a trailing
// empty part.
func parsePlacements(s string) ([]additionalField, error) {
	var out []additionalField
	bad := func(reason string) error {
		return &OptionError{Option: optAdditionalPlacement, Value: s, Reason: reason, Err: ErrInvalidOption}
	}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.Split(entry, ":")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		if len(parts) == 3 && parts[2] == "" {
			parts = parts[:2]
		}
		if len(parts) < 2 || len(parts) > 3 {
			return nil, bad(strconv.Quote(entry) + " is not column:placement[:alias]")
		}
		f := additionalField{column: parts[0], name: parts[0]}
		if f.column == "" {
			return nil, bad(strconv.Quote(entry) + " has an empty column name")
		}
		switch strings.ToLower(parts[1]) {
		case "header":
			f.place = placeHeader
		case "envelope":
			f.place = placeEnvelope
		case "partition":
			f.place = placePartition
		default:
			return nil, bad(strconv.Quote(entry) + ": placement " + strconv.Quote(parts[1]) + " is not header, envelope or partition")
		}
		if len(parts) == 3 {
			f.name = parts[2]
		}
		f.jsonKey = string(appendJSONString(nil, []byte(f.name))) + ":"
		f.jacksonKey = string(appendJacksonString(nil, []byte(f.name))) + ":"
		out = append(out, f)
	}
	var partitions int
	envelopeNames := map[string]bool{"payload": true}
	for _, f := range out {
		switch f.place {
		case placePartition:
			partitions++
			if partitions > 1 {
				return nil, bad("more than one column has placement partition")
			}
		case placeEnvelope:
			if envelopeNames[f.name] {
				return nil, bad("envelope field " + strconv.Quote(f.name) + " is used twice (\"payload\" is the payload's own field)")
			}
			envelopeNames[f.name] = true
		}
	}
	return out, nil
}

// opBehavior is table.op.invalid.behavior.
type opBehavior uint8

const (
	opWarn opBehavior = iota + 1
	opError
	opFatal
)

// converter is key.converter or value.converter.
type converter uint8

const (
	convRaw    converter = iota // the column's own bytes
	convString                  // Kafka Connect's StringConverter
	convJSON                    // Kafka Connect's JsonConverter, schemas.enable=false
	convHeader                  // Kafka Connect's SimpleHeaderConverter
)

// config is Options compiled for routing.
type config struct {
	idCol, keyCol, payloadCol, routeCol, tsCol, traceCol string
	versionCol, spanCol                                  string

	extras        []additionalField
	missingIgnore bool
	hasEnvelope   bool
	onUpdate      opBehavior
	route         *topicRoute
	fixedTopic    string
	tombstone     bool

	expand    bool
	keepNulls bool // table.json.payload.null.behavior=optional_bytes

	keyConv, valueConv converter
	headerConv         converter // convRaw, convHeader or convJSON

	// contextHeaders are Debezium's extended headers, converted; empty
	// when extended.headers.enabled is false.
	contextHeaders []Header
}

// parseConverter reads key.converter or value.converter: pgoutbox's raw
// (or empty), or a Kafka Connect converter by class name or simple class
// name, as Kafka Connect accepts plugin aliases.
func parseConverter(s string) (converter, bool) {
	switch strings.TrimSpace(s) {
	case "", ConverterRaw:
		return convRaw, true
	case ConverterJSON, "JsonConverter":
		return convJSON, true
	case ConverterString, "StringConverter":
		return convString, true
	case ConverterHeader, "SimpleHeaderConverter":
		return convHeader, true
	}
	return 0, false
}

// IsJSONConverter reports whether a key.converter or value.converter
// setting names Kafka Connect's JsonConverter.
func IsJSONConverter(s string) bool {
	c, ok := parseConverter(s)
	return ok && c == convJSON
}

// IsStringConverter reports whether a key.converter or value.converter
// setting names Kafka Connect's StringConverter.
func IsStringConverter(s string) bool {
	c, ok := parseConverter(s)
	return ok && c == convString
}

// compile validates o and compiles it. Every problem is reported, joined;
// table, when not empty, names the table whose per-table options o are.
func compile(o Options, table string) (*config, error) {
	var errs []error
	invalid := func(opt, value, reason string) {
		errs = append(errs, &OptionError{Option: opt, Value: value, Reason: reason, Err: ErrInvalidOption})
	}
	unsupported := func(opt, value, reason string) {
		errs = append(errs, &OptionError{Option: opt, Value: value, Reason: reason, Err: ErrUnsupportedOption})
	}
	c := &config{
		idCol:      o.EventIDField,
		keyCol:     o.EventKeyField,
		payloadCol: o.EventPayloadField,
		routeCol:   o.RouteByField,
		tsCol:      o.EventTimestampField,
		traceCol:   o.EventTraceField,
		versionCol: o.SchemaVersionField,
		spanCol:    o.TracingSpanContextField,
		fixedTopic: o.RouteTopic,
		tombstone:  o.RouteTombstoneOnEmptyPayload,
		expand:     o.ExpandJSONPayload,
	}
	for _, f := range []struct{ opt, v string }{
		{optEventID, o.EventIDField},
		{optEventKey, o.EventKeyField},
		{optEventPayload, o.EventPayloadField},
		{optRouteByField, o.RouteByField},
	} {
		if f.v == "" {
			invalid(f.opt, f.v, "must name a column")
		}
	}

	extras, err := parsePlacements(o.AdditionalPlacement)
	if err != nil {
		errs = append(errs, err)
	}
	c.extras = extras
	for _, f := range extras {
		if f.place == placeEnvelope {
			c.hasEnvelope = true
		}
	}

	switch strings.ToLower(strings.TrimSpace(o.AdditionalMissing)) {
	case "error":
		c.missingIgnore = o.AdditionalErrorOnMissing != nil && !*o.AdditionalErrorOnMissing
	case "ignore":
		c.missingIgnore = true
		if o.AdditionalErrorOnMissing != nil && *o.AdditionalErrorOnMissing {
			errs = append(errs, &OptionError{Option: optErrorOnMissing, Value: "true",
				Reason: "conflicts with " + optAdditionalMissing + "=ignore; set only one of them", Err: ErrInvalidOption})
		}
	default:
		invalid(optAdditionalMissing, o.AdditionalMissing, "must be error or ignore")
	}

	switch strings.ToLower(strings.TrimSpace(o.OpInvalidBehavior)) {
	case "warn":
		c.onUpdate = opWarn
	case "error":
		c.onUpdate = opError
	case "fatal":
		c.onUpdate = opFatal
	default:
		invalid(optOpInvalidBehavior, o.OpInvalidBehavior, "must be warn, error or fatal")
	}

	switch strings.ToLower(strings.TrimSpace(o.JSONPayloadNullBehavior)) {
	case "ignore":
	case "optional_bytes":
		c.keepNulls = true
	default:
		invalid(optJSONNullBehavior, o.JSONPayloadNullBehavior, "must be ignore or optional_bytes")
	}

	route, err := compileRoute(o.RouteTopicRegex, o.RouteTopicReplacement)
	if err != nil {
		errs = append(errs, err)
	}
	c.route = route
	if o.RouteTopic != "" && !validTopic(o.RouteTopic) {
		invalid(optRouteTopic, o.RouteTopic, "is not a legal Kafka topic name (1 to 249 characters of [a-zA-Z0-9._-], not . or ..)")
	}

	for _, cv := range []struct {
		opt, schemasOpt string
		value           string
		schemas         *bool
		dst             *converter
		allowed         []converter
	}{
		{optKeyConverter, optKeySchemasEnable, o.KeyConverter, o.KeyConverterSchemasEnable, &c.keyConv, []converter{convRaw, convJSON, convString}},
		{optValueConverter, optValueSchemasEnable, o.ValueConverter, o.ValueConverterSchemasEnable, &c.valueConv, []converter{convRaw, convJSON, convString}},
		{optHeaderConverter, optHeaderSchemas, o.HeaderConverter, o.HeaderConverterSchemasEnable, &c.headerConv, []converter{convRaw, convJSON, convHeader}},
	} {
		conv, ok := parseConverter(cv.value)
		if !ok || !slices.Contains(cv.allowed, conv) {
			names := "raw, " + ConverterJSON + " or " + ConverterString
			if cv.opt == optHeaderConverter {
				names = "raw, " + ConverterHeader + " or " + ConverterJSON
			}
			unsupported(cv.opt, cv.value, "must be "+names+" (other Kafka Connect converters are not supported)")
			continue
		}
		*cv.dst = conv
		if conv == convJSON && (cv.schemas == nil || *cv.schemas) {
			value := "true"
			reason := "pgoutbox has no schemas and writes JsonConverter's schemaless form only; set " + cv.schemasOpt + "=false"
			if cv.schemas == nil {
				value = ""
				reason = "is not set, and Kafka Connect's default for JsonConverter is true (a schema envelope); " + reason
			}
			unsupported(cv.schemasOpt, value, reason)
		}
	}
	if o.RouteTopic != "" && (o.RouteTopicReplacement != DefaultOptions().RouteTopicReplacement || o.RouteTopicRegex != DefaultOptions().RouteTopicRegex) {
		invalid(optRouteTopic, o.RouteTopic, "is a fixed topic for every row, so "+optRouteTopicRegex+" and "+optRouteReplacement+" would never apply: set either route.topic or the regex and replacement")
	}
	if o.ExtendedHeaders {
		if o.ExtendedHeadersLogicalName == "" {
			invalid(optLogicalName, "", "must be set with "+optExtendedHeaders+"=true (it is Debezium's topic.prefix, the connector's logical name)")
		}
		if o.ExtendedHeadersRunID == "" {
			invalid(optRunID, "", "must be set with "+optExtendedHeaders+"=true (the relay sets a new UUIDv7 at each start when it is empty)")
		}
		for _, h := range [][2]string{
			{"__debezium.context.connectorLogicalName", o.ExtendedHeadersLogicalName},
			{"__debezium.context.taskId", "0"},
			{"__debezium.context.connectorName", "postgresql"},
			{"__debezium.context.runId", o.ExtendedHeadersRunID},
		} {
			v := []byte(h[1])
			if c.headerConv == convJSON {
				v = appendJacksonString(nil, v)
			}
			c.contextHeaders = append(c.contextHeaders, Header{Key: h[0], Value: v})
		}
	}
	if c.valueConv == convString {
		// StringConverter writes Java's toString() of a Struct, e.g.
		// Struct{total=12}; nobody wants that reproduced.
		if c.hasEnvelope {
			unsupported(optValueConverter, o.ValueConverter,
				"StringConverter would write an envelope as Java's Struct.toString() (Struct{payload=...}); use JsonConverter or raw with envelope placements")
		}
		if c.expand {
			unsupported(optValueConverter, o.ValueConverter,
				"StringConverter would write an expanded payload as Java's Struct.toString() (Struct{total=12}); use JsonConverter or raw with "+optExpandJSONPayload+"=true")
		}
	}

	if len(errs) > 0 {
		if table != "" {
			for _, e := range errs {
				var oe *OptionError
				if errors.As(e, &oe) {
					oe.Table = table
				}
			}
		}
		return nil, errors.Join(errs...)
	}
	return c, nil
}
