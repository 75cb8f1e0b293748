package replication

import (
	"errors"
	"fmt"
	"testing"
)

// The decoder carves rows out of shared slabs: a value it returned must
// never change when later messages are decoded, across slab boundaries too.
func TestDecodedRowsStayIntactAcrossLaterDecodes(t *testing.T) {
	d := NewDecoder()
	if _, err := d.Decode(relationMsg(1)); err != nil {
		t.Fatal(err)
	}
	const n = 3 * sliceSlabLen // several slabs of every kind
	kept := make([]*Change, 0, n)
	begins := make([]*Begin, 0, n)
	for i := range n {
		v, err := d.Decode(msg{'B'}.u64(uint64(i)).u64(0).u32(uint32(i)))
		if err != nil {
			t.Fatal(err)
		}
		begins = append(begins, v.(*Begin))
		ins := msg{'I'}.u32(1).u8('N').u16(3).text(fmt.Sprint("id-", i)).u8('n').text(fmt.Sprint(`{"n":`, i, `}`))
		v, err = d.Decode(ins)
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, v.(*Change))
	}
	for i, c := range kept {
		if string(c.Values[0]) != fmt.Sprint("id-", i) || c.Values[1] != nil || c.Kinds[1] != ValueNull ||
			string(c.Values[2]) != fmt.Sprint(`{"n":`, i, `}`) || len(c.Values) != 3 || cap(c.Values) != 3 || cap(c.Kinds) != 3 {
			t.Fatalf("change %d changed after later decodes: %q %q (cap %d)", i, c.Values, c.Kinds, cap(c.Values))
		}
		if begins[i].XID != uint32(i) {
			t.Fatalf("begin %d changed: %+v", i, begins[i])
		}
	}
	// Appending to one row's values must not write into the next row's.
	next := kept[1].Values[0]
	_ = append(kept[0].Values, []byte("extra"))
	if string(kept[1].Values[0]) != string(next) {
		t.Fatal("append to one change's values overwrote the next change")
	}
}

func TestDecodeInsertAllocatesNothingPerRow(t *testing.T) {
	d := NewDecoder()
	if _, err := d.Decode(benchOutboxRelation(16385)); err != nil {
		t.Fatal(err)
	}
	data := benchOutboxInsert(16385)
	begin, commit := benchBegin(1, 2), benchCommit(1, 2)
	// Slabs are refilled now and then: averaged over many rows that rounds
	// down to zero allocations per row.
	got := testing.AllocsPerRun(1000, func() {
		for _, m := range [][]byte{begin, data, commit} {
			if _, err := d.Decode(m); err != nil {
				t.Fatal(err)
			}
		}
	})
	if got != 0 {
		t.Errorf("%v allocations per BEGIN, INSERT, COMMIT; want 0 (amortised)", got)
	}
}

func TestTupleErrorsNameTheTupleAndField(t *testing.T) {
	d := NewDecoder()
	if _, err := d.Decode(relationMsg(1)); err != nil {
		t.Fatal(err)
	}
	for data, field := range map[string]string{
		string(msg{'I'}.u32(1).u8('N').u16(1).u8('q')):                            "new tuple column kind",
		string(msg{'U'}.u32(1).u8('K').u16(3).u8('t').u32(9)):                     "old tuple column data",
		string(msg{'D'}.u32(1).u8('O').u16(1).u8('t')):                            "old tuple column length",
		string(msg{'U'}.u32(1).u8('N').u16(3).text("a").text("b").u8('t').u32(5)): "new tuple column data",
	} {
		_, err := d.Decode([]byte(data))
		var de *DecodeError
		if !errors.As(err, &de) || de.Field != field {
			t.Errorf("%q: error %v, want one about %q", data, err, field)
		}
	}
}
