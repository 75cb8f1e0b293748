package replication

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// msg builds pgoutput messages for tests.
type msg []byte

func (m msg) u8(v byte) msg     { return append(m, v) }
func (m msg) u16(v uint16) msg  { return binary.BigEndian.AppendUint16(m, v) }
func (m msg) u32(v uint32) msg  { return binary.BigEndian.AppendUint32(m, v) }
func (m msg) u64(v uint64) msg  { return binary.BigEndian.AppendUint64(m, v) }
func (m msg) str(s string) msg  { return append(append(m, s...), 0) }
func (m msg) text(s string) msg { return m.u8('t').u32(uint32(len(s))).bytesOf(s) }
func (m msg) bytesOf(s string) msg {
	return append(m, s...)
}

func relationMsg(id uint32) []byte {
	return msg{'R'}.u32(id).str("public").str("outbox").u8('d').u16(3).
		u8(1).str("id").u32(2950).u32(0xffffffff).
		u8(0).str("aggregatetype").u32(1043).u32(259).
		u8(0).str("payload").u32(3802).u32(0xffffffff)
}

func TestDecodesATransaction(t *testing.T) {
	d := NewDecoder()
	commitTime := time.Date(2026, 11, 29, 8, 0, 0, 123456000, time.UTC)
	us := uint64(commitTime.Sub(postgresEpoch) / time.Microsecond)

	v, err := d.Decode(msg{'B'}.u64(0x16B3748).u64(us).u32(771))
	if err != nil {
		t.Fatal(err)
	}
	b := v.(*Begin)
	if b.FinalLSN != 0x16B3748 || b.XID != 771 || !b.CommitTime.Equal(commitTime) {
		t.Fatalf("begin: %+v", b)
	}

	v, err = d.Decode(relationMsg(16384))
	if err != nil {
		t.Fatal(err)
	}
	rel := v.(*Relation)
	if rel.Table != "public.outbox" || len(rel.Columns) != 3 || rel.Types[2] != 3802 || !rel.KeyFlags[0] || rel.Modifiers[1] != 259 {
		t.Fatalf("relation: %+v", rel)
	}

	ins := msg{'I'}.u32(16384).u8('N').u16(3).text("406c07f3-0000-0000-0000-000000000001").text("Order").u8('n')
	v, err = d.Decode(ins)
	if err != nil {
		t.Fatal(err)
	}
	c := v.(*Change)
	if c.Op != OpInsert || c.Rel != rel || string(c.Values[1]) != "Order" || c.Values[2] != nil || c.Kinds[2] != ValueNull {
		t.Fatalf("insert: %+v", c)
	}

	upd := msg{'U'}.u32(16384).u8('K').u16(3).text("k").u8('n').u8('n').u8('N').u16(3).text("a").text("b").u8('u')
	v, err = d.Decode(upd)
	if err != nil {
		t.Fatal(err)
	}
	c = v.(*Change)
	if c.Op != OpUpdate || string(c.Old[0]) != "k" || string(c.Values[1]) != "b" || c.Kinds[2] != ValueUnchanged {
		t.Fatalf("update: %+v", c)
	}

	del := msg{'D'}.u32(16384).u8('K').u16(3).text("k").u8('n').u8('n')
	v, err = d.Decode(del)
	if err != nil {
		t.Fatal(err)
	}
	if c = v.(*Change); c.Op != OpDelete || string(c.Old[0]) != "k" || c.Values != nil {
		t.Fatalf("delete: %+v", c)
	}

	v, err = d.Decode(msg{'T'}.u32(1).u8(1).u32(16384))
	if err != nil {
		t.Fatal(err)
	}
	if tr := v.(*Truncate); len(tr.Relations) != 1 || tr.Relations[0] != rel || tr.Options != 1 {
		t.Fatalf("truncate: %+v", tr)
	}

	v, err = d.Decode(msg{'M'}.u8(1).u64(0x16B3700).str("outbox").u32(7).bytesOf(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if m := v.(*Message); !m.Transactional || m.Prefix != "outbox" || string(m.Content) != `{"a":1}` || m.LSN != 0x16B3700 {
		t.Fatalf("message: %+v", m)
	}

	v, err = d.Decode(msg{'C'}.u8(0).u64(0x16B3748).u64(0x16B3780).u64(us))
	if err != nil {
		t.Fatal(err)
	}
	if cm := v.(*Commit); cm.CommitLSN != 0x16B3748 || cm.EndLSN != 0x16B3780 || !cm.CommitTime.Equal(commitTime) {
		t.Fatalf("commit: %+v", cm)
	}
}

// TestDecodesPostgres18StrayStreamAbort: PostgreSQL 18 sends a Stream Abort
// ('A', xid, subxid; seen as 41 00 00 03 81 00 00 03 82) to protocol v1
// clients for subtransactions of a transaction that aborted before it was
// decoded. The decoder must hand it back rather than fail the stream, also
// in v4's longer form with the abort LSN and time.
func TestDecodesPostgres18StrayStreamAbort(t *testing.T) {
	d := NewDecoder()
	for name, data := range map[string][]byte{
		"v1": {0x41, 0, 0, 3, 0x81, 0, 0, 3, 0x82},
		"v4": msg{'A'}.u32(0x381).u32(0x382).u64(0x2ECD258).u64(1),
	} {
		v, err := d.Decode(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		a, ok := v.(*StreamAbort)
		if !ok || a.XID != 0x381 || a.SubXID != 0x382 {
			t.Fatalf("%s: decoded %#v", name, v)
		}
	}
	// The next transaction decodes as usual.
	if v, err := d.Decode(msg{'B'}.u64(1).u64(2).u32(0x383)); err != nil || v.(*Begin).XID != 0x383 {
		t.Fatalf("begin after the abort: %v %v", v, err)
	}
}

func TestNewRelationMessageReplacesTheCachedOne(t *testing.T) {
	d := NewDecoder()
	if _, err := d.Decode(relationMsg(1)); err != nil {
		t.Fatal(err)
	}
	// The table gained a column: the server sends a new RELATION first.
	r2 := msg{'R'}.u32(1).str("public").str("outbox").u8('d').u16(1).u8(0).str("only").u32(25).u32(0xffffffff)
	if _, err := d.Decode(r2); err != nil {
		t.Fatal(err)
	}
	v, err := d.Decode(msg{'I'}.u32(1).u8('N').u16(1).text("x"))
	if err != nil {
		t.Fatal(err)
	}
	if c := v.(*Change); c.Rel.Columns[0] != "only" {
		t.Fatalf("decoded with the stale relation: %+v", c.Rel)
	}
}

func TestRejectsMalformedMessages(t *testing.T) {
	d := NewDecoder()
	if _, err := d.Decode(relationMsg(1)); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty":              {},
		"short begin":        msg{'B'}.u64(1),
		"unknown type":       {'Z', 1, 2},
		"unknown relation":   msg{'I'}.u32(99).u8('N').u16(0),
		"bad tuple marker":   msg{'I'}.u32(1).u8('X').u16(0),
		"column count":       msg{'I'}.u32(1).u8('N').u16(2).text("a").text("b"),
		"length overflow":    msg{'I'}.u32(1).u8('N').u16(3).u8('t').u32(0xffffffff),
		"bad value kind":     msg{'I'}.u32(1).u8('N').u16(3).u8('q'),
		"unterminated name":  msg{'R'}.u32(2).bytesOf("public"),
		"message overflow":   msg{'M'}.u8(1).u64(1).str("p").u32(100).bytesOf("x"),
		"truncate overflow":  msg{'T'}.u32(1 << 30).u8(0),
		"short stream abort": msg{'A'}.u32(1).u16(0),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := d.Decode(data)
			if err == nil {
				t.Fatalf("decoded %q without error", data)
			}
			var de *DecodeError
			if name != "empty" && name != "unknown relation" && name != "column count" && !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
		})
	}
}

// FuzzDecode feeds arbitrary bytes to the decoder after a valid RELATION:
// it must never panic, and what it returns must be internally consistent.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(msg{'I'}.u32(1).u8('N').u16(3).text("a").text("b").u8('n')))
	f.Add([]byte(msg{'B'}.u64(1).u64(2).u32(3)))
	f.Add([]byte(msg{'C'}.u8(0).u64(1).u64(2).u64(3)))
	f.Add([]byte(msg{'M'}.u8(1).u64(1).str("p").u32(1).bytesOf("x")))
	f.Add([]byte(msg{'U'}.u32(1).u8('O').u16(3).text("k").u8('n').u8('u').u8('N').u16(3).text("a").text("b").u8('u')))
	f.Add(relationMsg(2))
	f.Add([]byte(msg{'T'}.u32(1).u8(0).u32(1)))
	f.Add([]byte(msg{'A'}.u32(1).u32(2)))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewDecoder()
		if _, err := d.Decode(relationMsg(1)); err != nil {
			t.Fatal(err)
		}
		v, err := d.Decode(data)
		if err != nil {
			return
		}
		if c, ok := v.(*Change); ok {
			if c.Values != nil && len(c.Values) != len(c.Rel.Columns) {
				t.Fatalf("change with %d values for %d columns", len(c.Values), len(c.Rel.Columns))
			}
			for i, k := range c.Kinds {
				if (k == ValueNull || k == ValueUnchanged) != (c.Values[i] == nil) {
					t.Fatalf("column %d kind %q with value %q", i, k, c.Values[i])
				}
			}
		}
	})
}

func TestValueDecodesByTypeOID(t *testing.T) {
	d := NewDecoder()
	r := msg{'R'}.u32(1).str("public").str("t").u8('d').u16(4).
		u8(0).str("n").u32(23).u32(0xffffffff).
		u8(0).str("j").u32(3802).u32(0xffffffff).
		u8(0).str("ts").u32(1184).u32(0xffffffff).
		u8(0).str("x").u32(999999).u32(0xffffffff)
	if _, err := d.Decode(r); err != nil {
		t.Fatal(err)
	}
	v, err := d.Decode(msg{'I'}.u32(1).u8('N').u16(4).text("42").text(`{"a": [1, 2]}`).text("2026-11-29 08:00:00.5+00").text("opaque"))
	if err != nil {
		t.Fatal(err)
	}
	c := v.(*Change)
	n, err := d.Value(c, 0)
	if err != nil || n != int32(42) {
		t.Fatalf("int4: %v %T %v", n, n, err)
	}
	j, err := d.Value(c, 1)
	if m, ok := j.(map[string]any); err != nil || !ok || len(m["a"].([]any)) != 2 {
		t.Fatalf("jsonb: %#v %v", j, err)
	}
	ts, err := d.Value(c, 2)
	if tm, ok := ts.(time.Time); err != nil || !ok || !tm.Equal(time.Date(2026, 11, 29, 8, 0, 0, 5e8, time.UTC)) {
		t.Fatalf("timestamptz: %#v %v", ts, err)
	}
	x, err := d.Value(c, 3)
	if err != nil || x != "opaque" {
		t.Fatalf("unknown OID: %#v %v", x, err)
	}
}
