package outbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// walItem is what a test needs of one pgoutput message: an INSERT with its
// relation's name and column values, or a logical decoding message.
type walItem struct {
	Kind byte // 'I' or 'M'

	// INSERT
	Relation string             // schema.table
	Values   map[string]*string // column name → text value, nil for NULL

	// Message
	Transactional bool
	Prefix        string
	Content       []byte
}

// walReader reads pgoutput's big-endian fields; the first error sticks.
type walReader struct {
	b   []byte
	off int
	err error
}

func (r *walReader) need(n int, what string) bool {
	if r.err == nil && len(r.b)-r.off < n {
		r.err = fmt.Errorf("%s at offset %d: need %d bytes, have %d", what, r.off, n, len(r.b)-r.off)
	}
	return r.err == nil
}

func (r *walReader) u8(what string) byte {
	if !r.need(1, what) {
		return 0
	}
	r.off++
	return r.b[r.off-1]
}

func (r *walReader) u16(what string) uint16 {
	if !r.need(2, what) {
		return 0
	}
	r.off += 2
	return binary.BigEndian.Uint16(r.b[r.off-2:])
}

func (r *walReader) u32(what string) uint32 {
	if !r.need(4, what) {
		return 0
	}
	r.off += 4
	return binary.BigEndian.Uint32(r.b[r.off-4:])
}

func (r *walReader) u64(what string) uint64 {
	if !r.need(8, what) {
		return 0
	}
	r.off += 8
	return binary.BigEndian.Uint64(r.b[r.off-8:])
}

func (r *walReader) bytes(n int, what string) []byte {
	if !r.need(n, what) {
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off]
}

func (r *walReader) cstring(what string) string {
	if r.err != nil {
		return ""
	}
	for i := r.off; i < len(r.b); i++ {
		if r.b[i] == 0 {
			s := string(r.b[r.off:i])
			r.off = i + 1
			return s
		}
	}
	r.err = fmt.Errorf("%s at offset %d: no terminating NUL", what, r.off)
	return ""
}

type walRelation struct {
	name    string
	columns []string
}

// parseWAL decodes the pgoutput (protocol v1) messages in data, keeping the
// INSERTs and logical decoding messages in order.
func parseWAL(data [][]byte) ([]walItem, error) {
	relations := map[uint32]walRelation{}
	var items []walItem
	for i, msg := range data {
		if len(msg) == 0 {
			return nil, fmt.Errorf("change %d: empty", i)
		}
		r := &walReader{b: msg, off: 1}
		switch msg[0] {
		case 'R':
			id := r.u32("relation id")
			rel := walRelation{name: r.cstring("namespace")}
			rel.name += "." + r.cstring("relation name")
			r.u8("replica identity")
			n := int(r.u16("column count"))
			for range n {
				r.u8("column flags")
				rel.columns = append(rel.columns, r.cstring("column name"))
				r.u32("column type")
				r.u32("column type modifier")
			}
			relations[id] = rel
		case 'I':
			rel, ok := relations[r.u32("relation id")]
			if r.err == nil && !ok {
				return nil, fmt.Errorf("change %d: insert into an unannounced relation", i)
			}
			if k := r.u8("tuple kind"); r.err == nil && k != 'N' {
				return nil, fmt.Errorf("change %d: tuple kind %q, want 'N'", i, k)
			}
			item := walItem{Kind: 'I', Relation: rel.name, Values: map[string]*string{}}
			n := int(r.u16("column count"))
			for c := range n {
				if c >= len(rel.columns) {
					return nil, fmt.Errorf("change %d: %d columns, relation has %d", i, n, len(rel.columns))
				}
				switch kind := r.u8("column kind"); kind {
				case 'n':
					item.Values[rel.columns[c]] = nil
				case 't':
					s := string(r.bytes(int(r.u32("value length")), "value"))
					item.Values[rel.columns[c]] = &s
				default:
					if r.err == nil {
						return nil, fmt.Errorf("change %d: column kind %q", i, kind)
					}
				}
			}
			items = append(items, item)
		case 'M':
			item := walItem{Kind: 'M', Transactional: r.u8("flags")&1 == 1}
			r.u64("LSN")
			item.Prefix = r.cstring("prefix")
			item.Content = r.bytes(int(r.u32("content length")), "content")
			items = append(items, item)
		}
		if r.err != nil {
			return nil, fmt.Errorf("change %d (%q): %w", i, msg[0], r.err)
		}
	}
	return items, nil
}

// peekWAL returns the INSERTs and messages that the slot would deliver,
// without consuming them.
func peekWAL(t *testing.T, conn *pgx.Conn, slot, publication string) []walItem {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		`SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
			'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, slot, publication)
	if err != nil {
		t.Fatalf("peek slot %s: %v", slot, err)
	}
	data, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatalf("peek slot %s: %v", slot, err)
	}
	items, err := parseWAL(data)
	if err != nil {
		t.Fatalf("decode slot %s: %v", slot, err)
	}
	return items
}

func TestParseWALRejectsTruncatedMessages(t *testing.T) {
	good := append([]byte{'M', 1, 0, 0, 0, 0, 0, 0, 0, 1}, "p\x00\x00\x00\x00\x02{}"...)
	items, err := parseWAL([][]byte{good})
	if err != nil || len(items) != 1 || items[0].Prefix != "p" || string(items[0].Content) != "{}" || !items[0].Transactional {
		t.Fatalf("good message: %+v, %v", items, err)
	}
	for n := 1; n < len(good); n++ {
		if _, err := parseWAL([][]byte{good[:n]}); err == nil {
			t.Fatalf("accepted a message cut to %d bytes", n)
		}
	}
	if _, err := parseWAL([][]byte{{}}); err == nil {
		t.Fatal("accepted an empty change")
	}
}
