package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/router"
)

// LSN is a PostgreSQL WAL position. It is the checkpoint package's type so
// that positions flow from the stream to the tracker without conversion.
type LSN = checkpoint.LSN

// Op is a row operation carried by a Change: the router's own type, so
// that a change's operation reaches the router without translation.
type Op = router.Op

// Row operations.
const (
	OpInsert = router.OpInsert
	OpUpdate = router.OpUpdate
	OpDelete = router.OpDelete
)

// Relation describes a table as announced by a pgoutput RELATION message.
// The server sends one before the first change of a table in a session and
// again whenever the table's definition changes, so the decoder replaces its
// cached copy on every new one.
type Relation struct {
	ID              uint32
	Namespace       string
	Name            string
	Table           string // schema-qualified name, e.g. "public.outbox"
	ReplicaIdentity byte
	Columns         []string
	Types           []uint32 // type OIDs, parallel to Columns
	Modifiers       []int32
	KeyFlags        []bool
}

// ValueKind tells how a column value was sent.
type ValueKind uint8

// Value kinds of a tuple column, as pgoutput marks them.
const (
	ValueNull      ValueKind = 'n'
	ValueUnchanged ValueKind = 'u' // an unchanged TOASTed value: no data was sent
	ValueText      ValueKind = 't'
	ValueBinary    ValueKind = 'b'
)

// Change is one row change of a transaction.
//
// Values holds each column's data in PostgreSQL's text format, parallel to
// Rel.Columns; a nil entry is SQL NULL or an unchanged TOASTed value (Kinds
// tells which). The byte slices alias the message they were decoded from,
// which belongs to this Change alone.
type Change struct {
	Op     Op
	Rel    *Relation
	Values [][]byte
	Kinds  []ValueKind
	// Old holds the old key (or whole old row with REPLICA IDENTITY FULL) of an
	// UPDATE or DELETE when the server sent one.
	Old      [][]byte
	OldKinds []ValueKind
	// Chunk is the memory the values lie in, set by Stream.Receive (nil
	// from Decode alone).
	Chunk *Chunk
}

// Begin starts a transaction.
type Begin struct {
	FinalLSN   LSN // the LSN of the commit record
	CommitTime time.Time
	XID        uint32
}

// Commit ends a transaction. EndLSN is the position after the commit record:
// the only position that is safe to confirm once every record of this and
// every earlier transaction is acknowledged.
type Commit struct {
	Flags      uint8
	CommitLSN  LSN
	EndLSN     LSN
	CommitTime time.Time
}

// Truncate lists the relations truncated by a TRUNCATE.
type Truncate struct {
	Options   uint8
	Relations []*Relation
}

// Message is a logical decoding message written by pg_logical_emit_message.
type Message struct {
	Transactional bool
	LSN           LSN
	Prefix        string
	Content       []byte
	// Chunk is the memory Content lies in, set by Stream.Receive.
	Chunk *Chunk
}

// StreamAbort is pgoutput's Stream Abort message. Protocol v1 carries no
// streamed transactions, yet PostgreSQL 18 sends one to v1 clients too: when
// decoding finds a transaction that has already aborted (it discards it to
// free logical_decoding_work_mem), it also marks its subtransactions that
// hold decoded changes as streamed, and their aborts then go out as Stream
// Abort messages, between transactions. No BEGIN or change of such a
// transaction was ever sent, so there is nothing to undo: the relay skips
// them. PostgreSQL 15 to 17 send none on a v1 stream.
type StreamAbort struct {
	XID    uint32 // the top-level transaction
	SubXID uint32 // the aborted subtransaction; XID for the whole transaction
}

// Decoder errors.
var (
	ErrEmptyMessage    = errors.New("replication: empty pgoutput message")
	ErrUnknownRelation = errors.New("replication: change for a relation that was never announced")
)

// DecodeError reports a malformed pgoutput message.
type DecodeError struct {
	Type   byte   // the message type byte
	Field  string // what was being read
	Offset int
	Err    error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("replication: decode pgoutput %q message: %s at byte %d: %v", e.Type, e.Field, e.Offset, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

var errShort = errors.New("message too short")

// Decoder turns pgoutput protocol v1 messages into the package's types. It
// caches relations by ID. It is not safe for concurrent use.
//
// Every value it returns is distinct and is never written again, but the
// per-row ones (Begin, Commit, Change and a Change's value and kind slices)
// are carved out of small shared slabs instead of allocated one by one, so
// that decoding a row costs no allocation most of the time. A slab stays in
// memory while anything still points into it, which is at most a few
// kilobytes per value kept.
type Decoder struct {
	relations map[uint32]*Relation
	types     *pgtype.Map // created on first use by Value

	begins  slab[Begin]
	commits slab[Commit]
	changes slab[Change]
	values  sliceSlab[[]byte]
	kinds   sliceSlab[ValueKind]
	// alone: the message being decoded is larger than aloneBytes. A slab's
	// backing array lives as long as any value handed out from it, and
	// the value slices it holds keep their rows' WAL bytes alive: the
	// values of up to 146 rows of seven columns, the Changes of 64. For
	// small rows that is a few shared chunks; rows large enough to get a
	// chunk of their own would each be kept whole, long after Kafka
	// acknowledged them (200 rows of 900 KB: 163 MB live against an
	// in-flight cap of 8 MiB). Their Change and values get their own.
	alone bool
}

// aloneBytes is the size above which a message's Change and values are
// allocated on their own, not from the slabs: the size above which the
// stream copies a message into a chunk of its own (walChunk/8).
const aloneBytes = 8 << 10

// slabLen is how many values a slab holds: small enough that a slab kept
// alive by one value costs little, big enough to make the allocation rare.
const slabLen = 64

// slab hands out pointers to zeroed Ts from a shared backing array.
type slab[T any] struct{ free []T }

func (s *slab[T]) next() *T {
	if len(s.free) == 0 {
		s.free = make([]T, slabLen)
	}
	p := &s.free[0]
	s.free = s.free[1:]
	return p
}

// sliceSlab hands out zeroed slices of Ts, each with its capacity capped at
// its length so that an append to one can never write into the next.
type sliceSlab[T any] struct{ free []T }

// sliceSlabLen is the length of a sliceSlab's backing array; tuples wider
// than a quarter of it get an array of their own.
const sliceSlabLen = 1024

func (s *sliceSlab[T]) take(n int) []T {
	if n > sliceSlabLen/4 {
		return make([]T, n)
	}
	if len(s.free) < n {
		s.free = make([]T, sliceSlabLen)
	}
	v := s.free[:n:n]
	s.free = s.free[n:]
	return v
}

// NewDecoder returns a decoder with an empty relation cache.
func NewDecoder() *Decoder {
	return &Decoder{relations: make(map[uint32]*Relation)}
}

// Value decodes column i of c's new tuple (or old tuple for a DELETE) into a
// Go value chosen by the column's type OID, as pgx would scan it: uuid →
// [16]byte, jsonb → map/slice, int4 → int32, timestamptz → time.Time, and so
// on; unknown types come back as their text. NULL and unchanged TOASTed
// values are nil. The relay itself routes on the text form; Value serves
// diagnostics and tools.
func (d *Decoder) Value(c *Change, i int) (any, error) {
	values := c.Values
	if c.Op == OpDelete {
		values = c.Old
	}
	if i < 0 || i >= len(values) || i >= len(c.Rel.Types) {
		return nil, fmt.Errorf("replication: column %d of %s out of range", i, c.Rel.Table)
	}
	if values[i] == nil {
		return nil, nil
	}
	if d.types == nil {
		d.types = pgtype.NewMap()
	}
	oid := c.Rel.Types[i]
	if _, ok := d.types.TypeForOID(oid); !ok {
		return string(values[i]), nil
	}
	var v any
	if err := d.types.Scan(oid, pgtype.TextFormatCode, values[i], &v); err != nil {
		return nil, fmt.Errorf("replication: decode %s.%s (type OID %d): %w", c.Rel.Table, c.Rel.Columns[i], oid, err)
	}
	return v, nil
}

// Relation returns the cached relation with the given ID.
func (d *Decoder) Relation(id uint32) (*Relation, bool) {
	r, ok := d.relations[id]
	return r, ok
}

// reader reads big-endian fields with bounds checks; the first failure sticks.
type reader struct {
	typ   byte
	buf   []byte
	off   int
	err   error
	field string
}

func (r *reader) fail(field string, err error) {
	if r.err == nil {
		r.err = &DecodeError{Type: r.typ, Field: field, Offset: r.off, Err: err}
	}
}

func (r *reader) need(n int, field string) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.buf)-r.off < n {
		r.fail(field, errShort)
		return false
	}
	return true
}

func (r *reader) u8(field string) uint8 {
	if !r.need(1, field) {
		return 0
	}
	v := r.buf[r.off]
	r.off++
	return v
}

func (r *reader) u16(field string) uint16 {
	if !r.need(2, field) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.buf[r.off:])
	r.off += 2
	return v
}

func (r *reader) u32(field string) uint32 {
	if !r.need(4, field) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.buf[r.off:])
	r.off += 4
	return v
}

func (r *reader) u64(field string) uint64 {
	if !r.need(8, field) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf[r.off:])
	r.off += 8
	return v
}

// postgresEpoch is 2000-01-01 UTC; pgoutput times are microseconds since it.
var postgresEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func (r *reader) time(field string) time.Time {
	us := int64(r.u64(field))
	if r.err != nil {
		return time.Time{}
	}
	return postgresEpoch.Add(time.Duration(us) * time.Microsecond)
}

// cstring reads a NUL-terminated string.
func (r *reader) cstring(field string) string {
	if r.err != nil {
		return ""
	}
	for i := r.off; i < len(r.buf); i++ {
		if r.buf[i] == 0 {
			s := string(r.buf[r.off:i])
			r.off = i + 1
			return s
		}
	}
	r.fail(field, errors.New("string without terminating NUL"))
	return ""
}

func (r *reader) bytes(n int, field string) []byte {
	if !r.need(n, field) {
		return nil
	}
	b := r.buf[r.off : r.off+n : r.off+n]
	r.off += n
	return b
}

// tupleFields names the fields of one tuple in errors. They are constants
// chosen per tuple rather than concatenated per column, which would allocate
// for every column of every row.
type tupleFields struct {
	count, kind, length, data string
}

var (
	newTupleFields = tupleFields{"new tuple column count", "new tuple column kind", "new tuple column length", "new tuple column data"}
	oldTupleFields = tupleFields{"old tuple column count", "old tuple column kind", "old tuple column length", "old tuple column data"}
)

// tuple reads TupleData into values/kinds sized for the relation, taking
// both slices from the decoder's slabs.
func (d *Decoder) tuple(r *reader, f *tupleFields) ([][]byte, []ValueKind) {
	n := int(r.u16(f.count))
	if r.err != nil {
		return nil, nil
	}
	// Each column takes at least one byte: refuse counts the buffer cannot hold
	// before allocating for them.
	if n > len(r.buf)-r.off {
		r.fail(f.count, errShort)
		return nil, nil
	}
	var values [][]byte
	if d.alone {
		values = make([][]byte, n)
	} else {
		values = d.values.take(n)
	}
	kinds := d.kinds.take(n)
	for i := 0; i < n; i++ {
		k := ValueKind(r.u8(f.kind))
		switch k {
		case ValueNull, ValueUnchanged:
		case ValueText, ValueBinary:
			l := r.u32(f.length)
			if r.err == nil && uint64(l) > uint64(len(r.buf)-r.off) {
				r.fail(f.data, errShort)
			}
			values[i] = r.bytes(int(l), f.data)
		default:
			if r.err == nil {
				r.fail(f.kind, fmt.Errorf("unknown tuple value kind %q", byte(k)))
			}
		}
		if r.err != nil {
			return nil, nil
		}
		kinds[i] = k
	}
	return values, kinds
}

// Decode decodes one pgoutput message (the WAL data of an XLogData message).
// It returns one of *Begin, *Commit, *Relation, *Change, *Truncate, *Message,
// *StreamAbort, or nil for messages the relay has no use for (ORIGIN, TYPE). The returned
// values alias data: the caller must not reuse it.
func (d *Decoder) Decode(data []byte) (any, error) {
	if len(data) == 0 {
		return nil, ErrEmptyMessage
	}
	r := &reader{typ: data[0], buf: data, off: 1}
	d.alone = len(data) > aloneBytes
	switch data[0] {
	case 'B':
		b := d.begins.next()
		*b = Begin{FinalLSN: LSN(r.u64("final LSN")), CommitTime: r.time("commit time"), XID: r.u32("xid")}
		return b, r.err
	case 'C':
		c := d.commits.next()
		*c = Commit{Flags: r.u8("flags"), CommitLSN: LSN(r.u64("commit LSN")), EndLSN: LSN(r.u64("end LSN")), CommitTime: r.time("commit time")}
		return c, r.err
	case 'O':
		r.u64("origin LSN")
		r.cstring("origin name")
		return nil, r.err
	case 'Y':
		r.u32("type OID")
		r.cstring("type namespace")
		r.cstring("type name")
		return nil, r.err
	case 'R':
		return d.decodeRelation(r)
	case 'I':
		rel := d.relation(r)
		if t := r.u8("tuple marker"); r.err == nil && t != 'N' {
			r.fail("tuple marker", fmt.Errorf("want 'N', got %q", t))
		}
		values, kinds := d.tuple(r, &newTupleFields)
		if r.err != nil {
			return nil, r.err
		}
		return d.change(OpInsert, rel, values, kinds, nil, nil)
	case 'U':
		rel := d.relation(r)
		t := r.u8("tuple marker")
		var old [][]byte
		var oldKinds []ValueKind
		if r.err == nil && (t == 'K' || t == 'O') {
			old, oldKinds = d.tuple(r, &oldTupleFields)
			t = r.u8("tuple marker")
		}
		if r.err == nil && t != 'N' {
			r.fail("tuple marker", fmt.Errorf("want 'N', got %q", t))
		}
		values, kinds := d.tuple(r, &newTupleFields)
		if r.err != nil {
			return nil, r.err
		}
		return d.change(OpUpdate, rel, values, kinds, old, oldKinds)
	case 'D':
		rel := d.relation(r)
		t := r.u8("tuple marker")
		if r.err == nil && t != 'K' && t != 'O' {
			r.fail("tuple marker", fmt.Errorf("want 'K' or 'O', got %q", t))
		}
		old, oldKinds := d.tuple(r, &oldTupleFields)
		if r.err != nil {
			return nil, r.err
		}
		return d.change(OpDelete, rel, nil, nil, old, oldKinds)
	case 'T':
		n := int(r.u32("relation count"))
		opts := r.u8("options")
		if r.err == nil && n > (len(data)-r.off)/4 {
			r.fail("relation IDs", errShort)
		}
		if r.err != nil {
			return nil, r.err
		}
		t := &Truncate{Options: opts, Relations: make([]*Relation, 0, n)}
		for i := 0; i < n; i++ {
			id := r.u32("relation ID")
			rel, ok := d.relations[id]
			if !ok {
				return nil, fmt.Errorf("truncate of relation %d: %w", id, ErrUnknownRelation)
			}
			t.Relations = append(t.Relations, rel)
		}
		return t, r.err
	case 'A':
		// Protocol v4 with streaming=parallel appends the abort's LSN and
		// time; no stream of ours asks for it, and they are not needed.
		a := &StreamAbort{XID: r.u32("xid"), SubXID: r.u32("subtransaction xid")}
		return a, r.err
	case 'M':
		m := &Message{Transactional: r.u8("flags")&1 == 1, LSN: LSN(r.u64("LSN")), Prefix: r.cstring("prefix")}
		n := r.u32("content length")
		if r.err == nil && uint64(n) > uint64(len(data)-r.off) {
			r.fail("content", errShort)
		}
		m.Content = r.bytes(int(n), "content")
		if r.err != nil {
			return nil, r.err
		}
		return m, nil
	}
	return nil, &DecodeError{Type: data[0], Field: "type", Err: errors.New("unknown message type (is the stream using protocol v1?)")}
}

func (d *Decoder) relation(r *reader) *Relation {
	id := r.u32("relation ID")
	if r.err != nil {
		return nil
	}
	rel, ok := d.relations[id]
	if !ok {
		r.err = fmt.Errorf("%q message for relation %d: %w", r.typ, id, ErrUnknownRelation)
		return nil
	}
	return rel
}

func (d *Decoder) change(op Op, rel *Relation, values [][]byte, kinds []ValueKind, old [][]byte, oldKinds []ValueKind) (*Change, error) {
	if values != nil && len(values) != len(rel.Columns) {
		return nil, fmt.Errorf("replication: %s on %s has %d columns, relation announced %d", op, rel.Table, len(values), len(rel.Columns))
	}
	var c *Change
	if d.alone {
		c = new(Change)
	} else {
		c = d.changes.next()
	}
	*c = Change{Op: op, Rel: rel, Values: values, Kinds: kinds, Old: old, OldKinds: oldKinds}
	return c, nil
}

func (d *Decoder) decodeRelation(r *reader) (*Relation, error) {
	rel := &Relation{ID: r.u32("relation ID")}
	rel.Namespace = r.cstring("namespace")
	rel.Name = r.cstring("name")
	rel.ReplicaIdentity = r.u8("replica identity")
	n := int(r.u16("column count"))
	if r.err == nil && n > len(r.buf)-r.off {
		r.fail("columns", errShort)
	}
	if r.err != nil {
		return nil, r.err
	}
	rel.Columns = make([]string, n)
	rel.Types = make([]uint32, n)
	rel.Modifiers = make([]int32, n)
	rel.KeyFlags = make([]bool, n)
	for i := 0; i < n; i++ {
		rel.KeyFlags[i] = r.u8("column flags")&1 == 1
		rel.Columns[i] = r.cstring("column name")
		rel.Types[i] = r.u32("column type")
		rel.Modifiers[i] = int32(r.u32("column type modifier"))
	}
	if r.err != nil {
		return nil, r.err
	}
	ns := rel.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	rel.Table = ns + "." + rel.Name
	d.relations[rel.ID] = rel
	return rel, nil
}
