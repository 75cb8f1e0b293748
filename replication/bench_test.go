package replication

import (
	"encoding/binary"
	"testing"
	"time"
)

// The builders below are this file's own (not decode_test.go's msg type),
// so the benchmarks keep compiling whatever the tests' helpers become.

func benchAppendCString(b []byte, s string) []byte { return append(append(b, s...), 0) }

func benchAppendText(b []byte, s string) []byte {
	b = append(b, 't')
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// benchOutboxRelation is the RELATION message PostgreSQL 15 sends for the
// default outbox table (Debezium's shape, as pgoutbox migrate creates it).
func benchOutboxRelation(id uint32) []byte {
	cols := []struct {
		name string
		oid  uint32
		mod  int32
		key  bool
	}{
		{"id", 2950, -1, true},              // uuid
		{"aggregatetype", 1043, 259, false}, // varchar(255)
		{"aggregateid", 1043, 259, false},
		{"type", 1043, 259, false},
		{"payload", 3802, -1, false},    // jsonb
		{"created_at", 1184, -1, false}, // timestamptz
	}
	m := []byte{'R'}
	m = binary.BigEndian.AppendUint32(m, id)
	m = benchAppendCString(m, "public")
	m = benchAppendCString(m, "outbox")
	m = append(m, 'd')
	m = binary.BigEndian.AppendUint16(m, uint16(len(cols)))
	for _, c := range cols {
		var flags byte
		if c.key {
			flags = 1
		}
		m = append(m, flags)
		m = benchAppendCString(m, c.name)
		m = binary.BigEndian.AppendUint32(m, c.oid)
		m = binary.BigEndian.AppendUint32(m, uint32(c.mod))
	}
	return m
}

// benchOutboxInsert is an INSERT of one outbox row in pgoutput's text
// format, with a payload of about 200 bytes of JSON.
func benchOutboxInsert(id uint32) []byte {
	m := []byte{'I'}
	m = binary.BigEndian.AppendUint32(m, id)
	m = append(m, 'N')
	m = binary.BigEndian.AppendUint16(m, 6)
	m = benchAppendText(m, "0192f5c4-7d3e-7a51-9c2b-4e8f1a6d3b70")
	m = benchAppendText(m, "Order")
	m = benchAppendText(m, "order-1842")
	m = benchAppendText(m, "OrderCreated")
	m = benchAppendText(m, `{"total": 129.95, "currency": "EUR", "customer": {"id": "c-77", "name": "Alice Example"}, "lines": [{"sku": "A-1", "qty": 2, "price": 39.99}, {"sku": "B-7", "qty": 1, "price": 49.97}]}`)
	m = benchAppendText(m, "2026-11-29 09:38:58.123456+00")
	return m
}

func benchBegin(final uint64, xid uint32) []byte {
	m := []byte{'B'}
	m = binary.BigEndian.AppendUint64(m, final)
	m = binary.BigEndian.AppendUint64(m, uint64(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC).Sub(postgresEpoch)/time.Microsecond))
	return binary.BigEndian.AppendUint32(m, xid)
}

func benchCommit(commit, end uint64) []byte {
	m := []byte{'C', 0}
	m = binary.BigEndian.AppendUint64(m, commit)
	m = binary.BigEndian.AppendUint64(m, end)
	return binary.BigEndian.AppendUint64(m, uint64(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC).Sub(postgresEpoch)/time.Microsecond))
}

// BenchmarkDecodeInsert decodes one INSERT into the outbox table: the
// decoder's per-event work on the relay's path.
func BenchmarkDecodeInsert(b *testing.B) {
	d := NewDecoder()
	if _, err := d.Decode(benchOutboxRelation(16385)); err != nil {
		b.Fatal(err)
	}
	data := benchOutboxInsert(16385)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		v, err := d.Decode(data)
		if err != nil {
			b.Fatal(err)
		}
		if c, ok := v.(*Change); !ok || c.Op != OpInsert {
			b.Fatalf("decoded %T", v)
		}
	}
}

// BenchmarkDecodeBeginCommit decodes the BEGIN and COMMIT that frame every
// transaction: the per-transaction overhead of a one-event transaction.
func BenchmarkDecodeBeginCommit(b *testing.B) {
	d := NewDecoder()
	begin := benchBegin(0x16B3748, 771)
	commit := benchCommit(0x16B3748, 0x16B3780)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(begin); err != nil {
			b.Fatal(err)
		}
		if _, err := d.Decode(commit); err != nil {
			b.Fatal(err)
		}
	}
}
