package router

import (
	"slices"
	"strconv"
	"testing"
)

func benchRoute(b *testing.B, o Options, rows []*Row) {
	r, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	var rec Record
	for _, row := range rows {
		if _, err := r.Route(row, testNow, &rec); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := r.Route(rows[i%len(rows)], testNow, &rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRouteDefault is the steady state of the default options: one
// table, one routing value.
func BenchmarkRouteDefault(b *testing.B) {
	benchRoute(b, DefaultOptions(), []*Row{outbox()})
}

// BenchmarkRouteDefaultManyTopics cycles through 1000 routing values.
func BenchmarkRouteDefaultManyTopics(b *testing.B) {
	rows := make([]*Row, 1000)
	for i := range rows {
		rows[i] = outbox(val("aggregatetype", "Aggregate"+strconv.Itoa(i)))
		rows[i].Names = rows[0].Names // as a decoder shares a relation's column list
	}
	benchRoute(b, DefaultOptions(), rows)
}

func BenchmarkRouteHeaders(b *testing.B) {
	o := DefaultOptions()
	o.AdditionalPlacement = "type:header:eventType,aggregatetype:header:aggregateType,shard:partition"
	o.EventTimestampField = "ts"
	benchRoute(b, o, []*Row{outbox(set("shard", 23, "3"), set("ts", 1184, "2024-01-02 03:04:05.123456+00"))})
}

func BenchmarkRouteEnvelope(b *testing.B) {
	o := DefaultOptions()
	o.AdditionalPlacement = "type:envelope:eventType,aggregateid:envelope"
	benchRoute(b, o, []*Row{outbox()})
}

func BenchmarkRouteRegexReplacement(b *testing.B) {
	o := DefaultOptions()
	o.RouteTopicRegex = `(?<domain>[a-z]+)_(?<version>v\d+)`
	o.RouteTopicReplacement = "events.${domain}.${version}"
	benchRoute(b, o, []*Row{outbox(val("aggregatetype", "order_v2"))})
}

// BenchmarkTopicUncached is the cost of a routing value seen for the first
// time (or after the cache was emptied).
func BenchmarkTopicUncached(b *testing.B) {
	tr, err := compileRoute(`(?<routedByValue>.*)`, "outbox.event.${routedByValue}")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if t := tr.topic("Order", "public.outbox"); !validTopic(t) {
			b.Fatal(t)
		}
	}
}

// BenchmarkColumnLookup compares the layout cache with looking every
// configured column up by a linear scan on each row.
func BenchmarkColumnLookup(b *testing.B) {
	row := outbox(set("created_at", 1184, "x"), set("tenant", 25, "t"))
	r, err := New(DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if l := r.layoutFor(row.Names); l.payload < 0 {
				b.Fatal("no payload")
			}
		}
	})
	b.Run("linear", func(b *testing.B) {
		b.ReportAllocs()
		cfg := r.cfg
		for b.Loop() {
			id := slices.Index(row.Names, cfg.idCol)
			key := slices.Index(row.Names, cfg.keyCol)
			payload := slices.Index(row.Names, cfg.payloadCol)
			route := slices.Index(row.Names, cfg.routeCol)
			if id < 0 || key < 0 || payload < 0 || route < 0 {
				b.Fatal("missing")
			}
		}
	})
	b.Run("cached_copied_names", func(b *testing.B) {
		// A caller that builds a new Names slice (new strings) per row.
		names := make([][]string, 64)
		for i := range names {
			names[i] = make([]string, len(row.Names))
			for j, n := range row.Names {
				names[i][j] = string([]byte(n))
			}
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if l := r.layoutFor(names[i%len(names)]); l.payload < 0 {
				b.Fatal("no payload")
			}
		}
	})
}

// benchPayload is a realistic jsonb payload as PostgreSQL prints it.
const benchPayload = `{"total": 12.50, "currency": "EUR", "note": null, "lines": [{"sku": "A-1", "qty": 2, "price": 5.25}, {"sku": "B-2", "qty": 1, "price": 2.00}]}`

func BenchmarkRouteExpandRaw(b *testing.B) {
	o := DefaultOptions()
	o.ExpandJSONPayload = true
	benchRoute(b, o, []*Row{outbox(set("payload", 3802, benchPayload))})
}

func BenchmarkRouteExpandJSONConverter(b *testing.B) {
	o := DefaultOptions()
	o.ExpandJSONPayload = true
	o.ValueConverter, o.ValueConverterSchemasEnable = ConverterJSON, new(false)
	benchRoute(b, o, []*Row{outbox(set("payload", 3802, benchPayload))})
}

func BenchmarkRouteJSONConverter(b *testing.B) {
	o := DefaultOptions()
	o.KeyConverter, o.KeyConverterSchemasEnable = ConverterJSON, new(false)
	o.ValueConverter, o.ValueConverterSchemasEnable = ConverterJSON, new(false)
	benchRoute(b, o, []*Row{outbox(set("payload", 3802, benchPayload))})
}

func BenchmarkRouteTrace(b *testing.B) {
	o := DefaultOptions()
	o.EventTraceField = "traceparent"
	benchRoute(b, o, []*Row{outbox(set("traceparent", 25, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))})
}

// BenchmarkSetRoute routes rows of two tables through a Set.
func BenchmarkSetRoute(b *testing.B) {
	orders := DefaultOptions()
	orders.RouteTopic = "orders"
	s, err := NewSet(DefaultOptions(), map[string]Options{"public.orders_outbox": orders})
	if err != nil {
		b.Fatal(err)
	}
	rows := []*Row{outbox(), outbox()}
	rows[1].Table = "public.orders_outbox"
	var rec Record
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Route(rows[i%2], testNow, &rec); err != nil {
			b.Fatal(err)
		}
	}
}
