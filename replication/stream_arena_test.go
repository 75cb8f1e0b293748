package replication

import (
	"bytes"
	"testing"
)

func TestWALArenaCopiesAreIndependentAndCapped(t *testing.T) {
	var a walArena
	src := make([]byte, 700)
	var kept [][]byte
	var want [][]byte
	for i := range 500 { // several chunks' worth
		for j := range src {
			src[j] = byte(i + j)
		}
		n := 1 + i%len(src)
		c, chunk := a.copy(src[:n])
		if !chunk.Contains(c) {
			t.Fatalf("copy %d is not inside the chunk it names", i)
		}
		if len(c) != n || cap(c) != n {
			t.Fatalf("copy %d: len %d cap %d, want both %d", i, len(c), cap(c), n)
		}
		kept = append(kept, c)
		want = append(want, bytes.Clone(src[:n]))
	}
	// The source buffer is reused, as pgconn's is: every copy keeps its bytes.
	clear(src)
	for i := range kept {
		if !bytes.Equal(kept[i], want[i]) {
			t.Fatalf("copy %d changed", i)
		}
	}
	big := make([]byte, walChunk)
	c, chunk := a.copy(big)
	if len(c) != len(big) || &c[0] == &big[0] || chunk.Size() != len(big) {
		t.Fatal("a big message was not copied into a chunk of its own")
	}
	if chunk.Contains(kept[0]) || chunk.Contains(big) {
		t.Fatal("Contains reports bytes from elsewhere")
	}
	if !chunk.Pin() || chunk.Pin() || chunk.Unpin() || !chunk.Unpin() {
		t.Fatal("Pin and Unpin do not report the first and the last")
	}
}
