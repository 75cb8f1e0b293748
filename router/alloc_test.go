package router

import "testing"

// TestRouteAllocations bounds the allocations per row of the options added
// beside Debezium's: none where the record can alias the row, one per
// converted key or value otherwise.
func TestRouteAllocations(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
		row  *Row
		max  float64
	}{
		{"fixed topic", opts(t, optRouteTopic, "orders"), outbox(), 0},
		{"topic with table", opts(t, optRouteReplacement, "${table}.${routedByValue}"), outbox(), 0},
		{"trace header", opts(t, optEventTrace, "tp"), outbox(set("tp", 25, traceOK)), 0},
		{"invalid trace", opts(t, optEventTrace, "tp"), outbox(set("tp", 25, "bad")), 0},
		{"expanded compact payload", opts(t, optExpandJSONPayload, "true"), outbox(), 0},
		{"expanded payload", opts(t, optExpandJSONPayload, "true"), outbox(set("payload", 3802, `{"total": 12, "lines": [{"sku": "a", "n": null}]}`)), 1},
		{"expansion failure", opts(t, optExpandJSONPayload, "true"), outbox(set("payload", 25, "plain")), 0},
		{"string converter", opts(t, optKeyConverter, stringConv, optValueConverter, stringConv), outbox(), 0},
		{"json converter", jsonBoth(t), outbox(), 2},
		{"json converter expanded", jsonBoth(t, optExpandJSONPayload, "true"), outbox(set("payload", 3802, `{"total": 12.50, "lines": [{"sku": "a"}, {"n": 1}]}`)), 2},
	} {
		r, err := New(c.opts)
		if err != nil {
			t.Fatal(err)
		}
		var rec Record
		if _, err := r.Route(c.row, testNow, &rec); err != nil { // warm the caches and scratch memory
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(500, func() {
			if _, err := r.Route(c.row, testNow, &rec); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > c.max {
			t.Errorf("%s: %v allocations per row, want at most %v", c.name, allocs, c.max)
		}
	}
}
