package poll

import "testing"

// TestArenaKeepsAnEmptyValueNotNULL: a value is NULL when its slice is
// nil. An empty one (an empty text) copied before the arena had a
// chunk came back nil, and went to Kafka as null (an empty key, then, to a
// random partition).
func TestArenaKeepsAnEmptyValueNotNULL(t *testing.T) {
	var a arena
	for _, v := range [][]byte{{}, []byte("x"), {}, make([]byte, arenaChunk), {}} {
		if got := a.copy(v); got == nil || len(got) != len(v) {
			t.Fatalf("copy of a %d-byte value: %v (nil %v)", len(v), len(got), got == nil)
		}
	}
	a.reset()
	if got := a.copy([]byte{}); got == nil {
		t.Fatal("copy of an empty value after reset is nil (NULL)")
	}
}
