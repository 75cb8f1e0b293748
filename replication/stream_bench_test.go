package replication

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"
)

// benchXLogData wraps a pgoutput message in XLogData inside CopyData, as the
// walsender sends it.
func benchXLogData(b []byte, lsn uint64, data []byte) []byte {
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint32(b, uint32(4+1+24+len(data)))
	b = append(b, 'w')
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = binary.BigEndian.AppendUint64(b, 0)
	return append(b, data...)
}

// BenchmarkStreamReceive measures Receive on a loopback TCP connection fed
// one-event transactions (BEGIN, outbox INSERT, COMMIT) as fast as the
// socket takes them: the client side of a catch-up. The server is not
// PostgreSQL but a writer of canned bytes after the RELATION message; the
// benchmark is about the client's per-message cost.
func BenchmarkStreamReceive(b *testing.B) {
	var stream []byte
	for i := range 1000 {
		lsn := uint64(0x1000000 + i*0x100)
		stream = benchXLogData(stream, lsn, benchBegin(lsn+0x80, uint32(i)))
		stream = benchXLogData(stream, lsn+0x10, benchOutboxInsert(16385))
		stream = benchXLogData(stream, lsn+0x80, benchCommit(lsn+0x80, lsn+0xa0))
	}
	s, server := fakeWalsender(b)
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() { // the fake walsender's writer: owned by this benchmark
		defer wg.Done()
		if _, err := server.Write(benchXLogData(nil, 0, benchOutboxRelation(16385))); err != nil {
			return
		}
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := server.Write(stream); err != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deadline := time.Now().Add(time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		ev, err := s.Receive(ctx, deadline)
		if err != nil {
			b.Fatal(err)
		}
		if ev.Begin == nil && ev.Change == nil && ev.Commit == nil && ev.Relation == nil {
			b.Fatalf("unexpected event %+v", ev)
		}
	}
	b.StopTimer()
	close(done)
	_ = server.Close() // ends a blocked Write
	wg.Wait()
}
