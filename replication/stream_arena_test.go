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
		c := a.copy(src[:n])
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
	if c := a.copy(big); len(c) != len(big) || &c[0] == &big[0] {
		t.Fatal("a big message was not copied into its own allocation")
	}
}
