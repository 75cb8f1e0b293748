package router

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestDefaultOptionsAreDebeziums checks every option's default: Debezium's
// for its options, and for pgoutbox's own the documented ones.
func TestDefaultOptionsAreDebeziums(t *testing.T) {
	want := map[string]string{
		// pgoutbox's own.
		"table.field.event.trace":        "",
		"route.topic":                    "",
		"key.converter":                  "raw",
		"value.converter":                "raw",
		"key.converter.schemas.enable":   "<nil>",
		"value.converter.schemas.enable": "<nil>",
		// Debezium's.
		"table.field.event.id":                     "id",
		"table.field.event.key":                    "aggregateid",
		"table.field.event.type":                   "type",
		"table.field.event.payload":                "payload",
		"table.field.event.timestamp":              "",
		"table.fields.additional.placement":        "",
		"table.field.additional.missing":           "error",
		"table.fields.additional.error.on.missing": "<nil>",
		"table.op.invalid.behavior":                "warn",
		"table.expand.json.payload":                "false",
		"table.json.payload.null.behavior":         "ignore",
		"route.by.field":                           "aggregatetype",
		"route.topic.regex":                        "(?<routedByValue>.*)",
		"route.topic.replacement":                  "outbox.event.${routedByValue}",
		"route.tombstone.on.empty.payload":         "false",
		"table.field.event.schema.version":         "",
		"tracing.span.context.field":               "",
		// Debezium's connector options the router honours; pgoutbox's
		// default for extended headers is off (a connector JSON turns it on).
		"extended.headers.enabled":        "false",
		"extended.headers.logical.name":   "",
		"extended.headers.run.id":         "",
		"header.converter":                "raw",
		"header.converter.schemas.enable": "<nil>",
	}
	d := reflect.ValueOf(DefaultOptions())
	typ := d.Type()
	seen := map[string]bool{}
	for i := range typ.NumField() {
		tag := typ.Field(i).Tag.Get("yaml")
		seen[tag] = true
		w, ok := want[tag]
		if !ok {
			t.Errorf("field %s has yaml tag %q, not a known option", typ.Field(i).Name, tag)
			continue
		}
		f := d.Field(i)
		got := ""
		switch f.Kind() {
		case reflect.String:
			got = f.String()
		case reflect.Bool:
			got = map[bool]string{true: "true", false: "false"}[f.Bool()]
		case reflect.Pointer:
			got = "<nil>"
			if !f.IsNil() {
				got = "set"
			}
		}
		if got != w {
			t.Errorf("default %s = %q, want %q", tag, got, w)
		}
	}
	for tag := range want {
		if !seen[tag] {
			t.Errorf("option %s has no field", tag)
		}
	}
	if err := DefaultOptions().Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

func TestSetAcceptsEveryYAMLName(t *testing.T) {
	typ := reflect.TypeFor[Options]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("yaml")
		value := "x"
		if f.Type.Kind() == reflect.Bool || f.Type.Kind() == reflect.Pointer {
			value = "TRUE"
		}
		var o Options
		if err := o.Set(tag, value); err != nil {
			t.Errorf("Set(%q): %v", tag, err)
			continue
		}
		v := reflect.ValueOf(o).Field(i)
		if v.IsZero() {
			t.Errorf("Set(%q, %q) did not set field %s", tag, value, f.Name)
		}
	}
}

func TestSet(t *testing.T) {
	o := DefaultOptions()
	if err := o.Set("table.fields.additional.error.on.missing", " False "); err != nil {
		t.Fatal(err)
	}
	if o.AdditionalErrorOnMissing == nil || *o.AdditionalErrorOnMissing {
		t.Errorf("AdditionalErrorOnMissing = %v, want false", o.AdditionalErrorOnMissing)
	}
	err := o.Set("route.tombstone.on.empty.payload", "yes")
	var oe *OptionError
	if !errors.As(err, &oe) || oe.Option != "route.tombstone.on.empty.payload" || !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Set with a bad boolean: %v", err)
	}
	for _, kv := range [][2]string{
		{"table.field.event.trace", "tp"}, {"route.topic", "orders"},
		{"key.converter", ConverterJSON}, {"value.converter", ConverterString},
		{"key.converter.schemas.enable", "false"}, {"value.converter.schemas.enable", "TRUE"},
	} {
		if err := o.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if o.EventTraceField != "tp" || o.RouteTopic != "orders" || o.KeyConverter != ConverterJSON || o.ValueConverter != ConverterString ||
		o.KeyConverterSchemasEnable == nil || *o.KeyConverterSchemasEnable || o.ValueConverterSchemasEnable == nil || !*o.ValueConverterSchemasEnable {
		t.Errorf("pgoutbox options not set: %+v", o)
	}
	if err := o.Set("value.converter.schemas.enable", "no"); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Set with a bad schemas.enable: %v", err)
	}
	err = o.Set("tracing.span.context.fields", "tracingspancontext")
	if !errors.Is(err, ErrUnsupportedOption) || !strings.Contains(err.Error(), "tracing.span.context.fields") {
		t.Errorf("Set with an unknown name: %v", err)
	}
}

func TestValidateNamesTheOption(t *testing.T) {
	f := false
	tr := true
	cases := []struct {
		name   string
		mod    func(*Options)
		option string // every error names it
		want   string // and contains this
		class  error
	}{
		{"empty id column", func(o *Options) { o.EventIDField = "" }, "table.field.event.id", "must name a column", ErrInvalidOption},
		{"empty key column", func(o *Options) { o.EventKeyField = "" }, "table.field.event.key", "must name a column", ErrInvalidOption},
		{"empty payload column", func(o *Options) { o.EventPayloadField = "" }, "table.field.event.payload", "must name a column", ErrInvalidOption},
		{"empty routing column", func(o *Options) { o.RouteByField = "" }, "route.by.field", "must name a column", ErrInvalidOption},
		{"bad placement kind", func(o *Options) { o.AdditionalPlacement = "type:body" }, "table.fields.additional.placement", `placement "body" is not header, envelope or partition`, ErrInvalidOption},
		{"placement without kind", func(o *Options) { o.AdditionalPlacement = "type" }, "table.fields.additional.placement", "is not column:placement[:alias]", ErrInvalidOption},
		{"placement with four parts", func(o *Options) { o.AdditionalPlacement = "type:header:a:b" }, "table.fields.additional.placement", "is not column:placement[:alias]", ErrInvalidOption},
		{"placement without column", func(o *Options) { o.AdditionalPlacement = ":header:x" }, "table.fields.additional.placement", "empty column name", ErrInvalidOption},
		{"two partition columns", func(o *Options) { o.AdditionalPlacement = "a:partition,b:partition" }, "table.fields.additional.placement", "more than one column has placement partition", ErrInvalidOption},
		{"envelope alias payload", func(o *Options) { o.AdditionalPlacement = "type:envelope:payload" }, "table.fields.additional.placement", `envelope field "payload" is used twice`, ErrInvalidOption},
		{"duplicate envelope alias", func(o *Options) { o.AdditionalPlacement = "a:envelope:x,b:envelope:x" }, "table.fields.additional.placement", `envelope field "x" is used twice`, ErrInvalidOption},
		{"bad missing behavior", func(o *Options) { o.AdditionalMissing = "skip" }, "table.field.additional.missing", "must be error or ignore", ErrInvalidOption},
		{"conflicting missing options", func(o *Options) { o.AdditionalMissing = "ignore"; o.AdditionalErrorOnMissing = &tr }, "table.fields.additional.error.on.missing", "conflicts with table.field.additional.missing=ignore", ErrInvalidOption},
		{"bad op behavior", func(o *Options) { o.OpInvalidBehavior = "panic" }, "table.op.invalid.behavior", "must be warn, error or fatal", ErrInvalidOption},
		{"bad null behavior", func(o *Options) { o.JSONPayloadNullBehavior = "keep" }, "table.json.payload.null.behavior", "must be ignore or optional_bytes", ErrInvalidOption},
		{"empty regex", func(o *Options) { o.RouteTopicRegex = "" }, "route.topic.regex", "must not be empty", ErrInvalidOption},
		{"regex does not compile", func(o *Options) { o.RouteTopicRegex = "(?<x>a" }, "route.topic.regex", "does not compile", ErrInvalidOption},
		{"regex lookbehind", func(o *Options) { o.RouteTopicRegex = "(?<=a)b" }, "route.topic.regex", "lookaround", ErrInvalidOption},
		{"regex bad group name", func(o *Options) { o.RouteTopicRegex = "(?<my_name>.*)" }, "route.topic.regex", "a group name is a letter followed by letters or digits", ErrInvalidOption},
		{"empty replacement", func(o *Options) { o.RouteTopicReplacement = "" }, "route.topic.replacement", "must not be empty", ErrInvalidOption},
		{"replacement unknown group name", func(o *Options) { o.RouteTopicReplacement = "t.${nope}" }, "route.topic.replacement", "no group with name {nope}", ErrInvalidOption},
		{"replacement group number too big", func(o *Options) { o.RouteTopicReplacement = "t.$2" }, "route.topic.replacement", "no group 2", ErrInvalidOption},
		{"replacement bare dollar", func(o *Options) { o.RouteTopicReplacement = "t.$x" }, "route.topic.replacement", "illegal group reference", ErrInvalidOption},
		{"replacement trailing dollar", func(o *Options) { o.RouteTopicReplacement = "t.$" }, "route.topic.replacement", "group index is missing", ErrInvalidOption},
		{"replacement trailing backslash", func(o *Options) { o.RouteTopicReplacement = `t.\` }, "route.topic.replacement", "character to be escaped is missing", ErrInvalidOption},
		{"replacement unclosed name", func(o *Options) { o.RouteTopicReplacement = "t.${routedByValue" }, "route.topic.replacement", "missing trailing '}'", ErrInvalidOption},
		{"replacement empty name", func(o *Options) { o.RouteTopicReplacement = "t.${}" }, "route.topic.replacement", "0 length name", ErrInvalidOption},
		{"replacement name starts with digit", func(o *Options) { o.RouteTopicReplacement = "t.${1a}" }, "route.topic.replacement", "starts with digit", ErrInvalidOption},
		{"bad fixed topic", func(o *Options) { o.RouteTopic = "orders/eu" }, "route.topic", "not a legal Kafka topic name", ErrInvalidOption},
		{"bad constant replacement", func(o *Options) { o.RouteTopicReplacement = "orders.eu.." + strings.Repeat("x", 249) }, "route.topic.replacement", "not a legal Kafka topic name", ErrInvalidOption},
		{"constant replacement dot", func(o *Options) { o.RouteTopicReplacement = "." }, "route.topic.replacement", "not a legal Kafka topic name", ErrInvalidOption},
		{"replacement with illegal text", func(o *Options) { o.RouteTopicReplacement = "orders/${routedByValue}" }, "route.topic.replacement", `has '/'`, ErrInvalidOption},
		{"replacement with escaped dollar", func(o *Options) { o.RouteTopicReplacement = `t\$${routedByValue}` }, "route.topic.replacement", `has '$'`, ErrInvalidOption},
		{"fixed topic and replacement", func(o *Options) { o.RouteTopic = "orders"; o.RouteTopicReplacement = "x.${routedByValue}" }, "route.topic", "set either route.topic or the regex and replacement", ErrInvalidOption},
		{"fixed topic and regex", func(o *Options) { o.RouteTopic = "orders"; o.RouteTopicRegex = "(?<routedByValue>.+)" }, "route.topic", "set either route.topic", ErrInvalidOption},
		{"extended headers without a name", func(o *Options) { o.ExtendedHeaders, o.ExtendedHeadersRunID = true, "r" }, "extended.headers.logical.name", "Debezium's topic.prefix", ErrInvalidOption},
		{"extended headers without a run id", func(o *Options) { o.ExtendedHeaders, o.ExtendedHeadersLogicalName = true, "orders" }, "extended.headers.run.id", "new UUIDv7", ErrInvalidOption},
		{"string header converter", func(o *Options) { o.HeaderConverter = "StringConverter" }, "header.converter", "SimpleHeaderConverter", ErrUnsupportedOption},
		{"json header converter schemas default", func(o *Options) { o.HeaderConverter = "JsonConverter" }, "header.converter.schemas.enable", "Kafka Connect's default for JsonConverter is true", ErrUnsupportedOption},
		{"fixed topic dot", func(o *Options) { o.RouteTopic = "." }, "route.topic", "not a legal Kafka topic name", ErrInvalidOption},
		{"unknown key converter", func(o *Options) { o.KeyConverter = "io.confluent.connect.avro.AvroConverter" }, "key.converter", "must be raw, org.apache.kafka.connect.json.JsonConverter or org.apache.kafka.connect.storage.StringConverter", ErrUnsupportedOption},
		{"byte array value converter", func(o *Options) { o.ValueConverter = "org.apache.kafka.connect.converters.ByteArrayConverter" }, "value.converter", "other Kafka Connect converters are not supported", ErrUnsupportedOption},
		{"json converter schemas default", func(o *Options) { o.ValueConverter = "org.apache.kafka.connect.json.JsonConverter" }, "value.converter.schemas.enable", "Kafka Connect's default for JsonConverter is true", ErrUnsupportedOption},
		{"json converter schemas true", func(o *Options) { o.KeyConverter = "JsonConverter"; o.KeyConverterSchemasEnable = &tr }, "key.converter.schemas.enable", "set key.converter.schemas.enable=false", ErrUnsupportedOption},
		{"string converter envelope", func(o *Options) {
			o.ValueConverter = "org.apache.kafka.connect.storage.StringConverter"
			o.AdditionalPlacement = "type:envelope"
		}, "value.converter", "Struct.toString()", ErrUnsupportedOption},
		{"string converter expansion", func(o *Options) {
			o.ValueConverter = "StringConverter"
			o.ExpandJSONPayload = true
		}, "value.converter", "Struct{total=12}", ErrUnsupportedOption},
	}
	_ = f
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.mod(&o)
			err := o.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			var oe *OptionError
			if !errors.As(err, &oe) || oe.Option != tc.option {
				t.Errorf("error %v is not an *OptionError for %s", err, tc.option)
			}
			if !errors.Is(err, tc.class) {
				t.Errorf("error %v is not %v", err, tc.class)
			}
			msg := err.Error()
			if !strings.Contains(msg, "router: option "+tc.option+"=") || !strings.Contains(msg, tc.want) {
				t.Errorf("message %q lacks the option name or %q", msg, tc.want)
			}
			if _, err := New(o); err == nil {
				t.Error("New accepted options that Validate rejects")
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	o := DefaultOptions()
	o.EventIDField = ""
	o.OpInvalidBehavior = "nope"
	o.RouteTopicRegex = "("
	err := o.Validate()
	for _, opt := range []string{"table.field.event.id", "table.op.invalid.behavior", "route.topic.regex"} {
		if err == nil || !strings.Contains(err.Error(), "option "+opt+"=") {
			t.Errorf("error %v does not report %s", err, opt)
		}
	}
}

func TestValidateAccepts(t *testing.T) {
	f := false
	for _, mod := range []func(*Options){
		func(o *Options) {
			o.AdditionalPlacement = "type:header:eventType, aggregateid:envelope , shard:PARTITION,"
		},
		func(o *Options) { o.AdditionalPlacement = "type:header:" }, // empty alias: none, as Java's split drops it
		func(o *Options) { o.AdditionalMissing = "IGNORE" },
		func(o *Options) { o.AdditionalErrorOnMissing = &f },
		func(o *Options) { o.OpInvalidBehavior = "Fatal" },
		func(o *Options) { o.JSONPayloadNullBehavior = "optional_bytes" },
		func(o *Options) { o.RouteTopicRegex = `\Q(?<notAGroup>\E(?<g>x)`; o.RouteTopicReplacement = "${g}" },
		func(o *Options) { o.RouteTopicRegex = `[(?<]+`; o.RouteTopicReplacement = "t" },
		func(o *Options) { o.RouteTopicReplacement = `literal\.dot` },
		func(o *Options) {
			o.ExtendedHeaders, o.ExtendedHeadersLogicalName, o.ExtendedHeadersRunID = true, "orders", "r1"
		},
		func(o *Options) {
			o.HeaderConverter, o.HeaderConverterSchemasEnable = "JsonConverter", &f
			o.SchemaVersionField, o.TracingSpanContextField = "version", "tracingspancontext"
		},
		func(o *Options) { o.HeaderConverter = "org.apache.kafka.connect.storage.SimpleHeaderConverter" },
		func(o *Options) { o.EventTypeField = "" }, // unused by itself
		func(o *Options) { o.ExpandJSONPayload = true },
		func(o *Options) { o.ExpandJSONPayload = true; o.JSONPayloadNullBehavior = "OPTIONAL_BYTES" },
		func(o *Options) { o.RouteTopic = "orders.v1" },
		func(o *Options) { o.RouteTopicReplacement = "${table}.${routedByValue}" }, // pgoutbox's ${table}
		func(o *Options) { o.EventTraceField = "traceparent" },
		func(o *Options) { o.KeyConverter, o.ValueConverter = "", "" }, // empty means raw
		func(o *Options) {
			o.KeyConverter, o.KeyConverterSchemasEnable = "org.apache.kafka.connect.json.JsonConverter", &f
			o.ValueConverter, o.ValueConverterSchemasEnable = "JsonConverter", &f
			o.ExpandJSONPayload = true
			o.AdditionalPlacement = "type:envelope"
		},
		func(o *Options) {
			o.KeyConverter, o.ValueConverter = "StringConverter", "org.apache.kafka.connect.storage.StringConverter"
			o.ValueConverterSchemasEnable = new(true) // ignored by StringConverter
		},
	} {
		o := DefaultOptions()
		mod(&o)
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}
