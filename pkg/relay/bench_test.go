package relay

import "testing"

// BenchmarkMessageRow measures turning the JSON of a table-less outbox
// message (pg_logical_emit_message) into the row the router maps: the
// per-event work that replaces the decoder's tuple for that mode.
func BenchmarkMessageRow(b *testing.B) {
	content := []byte(`{"id": "0192f5c4-7d3e-7a51-9c2b-4e8f1a6d3b70", "aggregatetype": "Order", "aggregateid": "order-1842",` +
		` "type": "OrderCreated", "payload": {"total": 129.95, "currency": "EUR", "customer": {"id": "c-77", "name": "Alice Example"},` +
		` "lines": [{"sku": "A-1", "qty": 2, "price": 39.99}, {"sku": "B-7", "qty": 1, "price": 49.97}]}}`)
	b.SetBytes(int64(len(content)))
	b.ReportAllocs()
	for b.Loop() {
		row, err := messageRow("outbox", "payload", content)
		if err != nil {
			b.Fatal(err)
		}
		if len(row.Names) != 5 {
			b.Fatalf("row has %d fields", len(row.Names))
		}
	}
}
