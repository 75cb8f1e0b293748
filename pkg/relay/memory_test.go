package relay

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// TestInFlightBytesCountTheWALChunksRecordsHold: a record whose bytes lie in
// a 64 KiB WAL chunk holds the whole chunk until it is acknowledged, however
// small it is; the in-flight byte cap must count that, or one slow record per
// chunk could hold far more memory than relay.max.inflight.bytes says.
func TestInFlightBytesCountTheWALChunksRecordsHold(t *testing.T) {
	s := &session{r: &Relay{obs: NopObserver{}}, clock: realClock{}, tr: checkpoint.New(1)}
	chunk, wal := replication.NewChunk([]byte("key1value1key2value2"), 64<<10)
	id, _ := s.tr.Begin()
	_ = s.tr.Add(3)
	rec1 := router.Record{Key: wal[0:4], Value: wal[4:10], Headers: []router.Header{{Key: "id", Value: wal[0:4]}}}
	rec2 := router.Record{Key: wal[10:14], Value: wal[14:20]}
	own := router.Record{Key: []byte("k"), Value: make([]byte, 1000)} // converted by the router: its own memory
	m1, m2, m3 := s.meta(&rec1, chunk, id, 0), s.meta(&rec2, chunk, id, 0), s.meta(&own, chunk, id, 0)
	if s.pinned != 64<<10 {
		t.Fatalf("two records in one chunk pin %d bytes, want the chunk's %d", s.pinned, 64<<10)
	}
	if want := int64(3*recordOverhead + len("id") + 1 + 1000); s.inflightBytes != want {
		t.Fatalf("own bytes %d, want %d (the chunk's bytes counted once, in pinned)", s.inflightBytes, want)
	}
	if m3.Hold != nil {
		t.Fatal("a record with no byte in the chunk pins it")
	}
	// The chunk stays held until the last record in it is acknowledged.
	for i, step := range []struct {
		m      kafka.Meta
		pinned int64
	}{{m1, 64 << 10}, {m3, 64 << 10}, {m2, 0}} {
		if err := s.ack(kafka.Ack{Meta: step.m}); err != nil {
			t.Fatal(err)
		}
		if s.pinned != step.pinned {
			t.Fatalf("after ack %d: pinned %d, want %d", i, s.pinned, step.pinned)
		}
	}
	if s.pinned != 0 || s.inflightBytes != 0 {
		t.Fatalf("after every ack: pinned %d, own bytes %d; want 0, 0", s.pinned, s.inflightBytes)
	}
}
