package router

import (
	"errors"
	"strings"
	"testing"
)

func TestSetRoutesByTable(t *testing.T) {
	def := DefaultOptions()
	orders := def
	orders.RouteTopic = "orders"
	billing := def
	billing.RouteTopicReplacement = "${table}.${routedByValue}"
	billing.EventPayloadField = "body"
	billing.ValueConverter, billing.ValueConverterSchemasEnable = ConverterJSON, new(false)

	s, err := NewSet(def, map[string]Options{
		"public.orders_outbox": orders,
		"billing_outbox":       billing, // no schema: public
	})
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	for _, c := range []struct {
		table string
		mod   func(*Row)
		topic string
		value string
	}{
		{"public.outbox", nil, "outbox.event.Order", `{"total":12}`},
		{"public.orders_outbox", nil, "orders", `{"total":12}`},
		{"sales.orders_outbox", nil, "outbox.event.Order", `{"total":12}`}, // another schema: the default
		{"public.billing_outbox", func(r *Row) { r.Names[4] = "body" }, "public.billing_outbox.Order", `"{\"total\":12}"`},
	} {
		row := outbox(func(r *Row) { r.Names = append([]string(nil), r.Names...) })
		row.Table = c.table
		if c.mod != nil {
			c.mod(row)
		}
		a, err := s.Route(row, testNow, &rec)
		if err != nil || a != Emit {
			t.Fatalf("%s: %v, %v", c.table, a, err)
		}
		if rec.Topic != c.topic || string(rec.Value) != c.value {
			t.Errorf("%s: topic %q value %s, want %q %s", c.table, rec.Topic, rec.Value, c.topic, c.value)
		}
	}
	if s.For("public.orders_outbox") == s.For("public.outbox") || s.For("x.y") != s.For("public.outbox") {
		t.Error("For does not pick the table's Router")
	}
}

func TestNewSetReportsEveryProblemWithItsTable(t *testing.T) {
	def := DefaultOptions()
	def.OpInvalidBehavior = "nope"
	bad := DefaultOptions()
	bad.RouteTopic = "a b"
	_, err := NewSet(def, map[string]Options{
		"public.a": bad,
		"a":        DefaultOptions(), // the same table as public.a
		".x":       DefaultOptions(),
	})
	if err == nil {
		t.Fatal("NewSet accepted bad options")
	}
	msg := err.Error()
	for _, want := range []string{
		`router: option table.op.invalid.behavior="nope"`,
		`router: table "public.a": option route.topic="a b": is not a legal Kafka topic name`,
		`router: table "public.a": names the same table as a (public.a)`,
		`router: table ".x": is not a table name`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	var oe *OptionError
	if !errors.As(err, &oe) || !errors.Is(err, ErrInvalidOption) {
		t.Errorf("error %v is not an *OptionError", err)
	}
}

func TestSetWithoutTablesUsesDefault(t *testing.T) {
	s, err := NewSet(DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	row := outbox()
	if _, err := s.Route(row, testNow, &rec); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := s.Route(row, testNow, &rec); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Set.Route allocated %v times per row, want 0", allocs)
	}
}
