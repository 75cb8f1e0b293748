package relay

import (
	"bytes"
	"testing"

	"github.com/pgoutbox/pgoutbox/router"
)

// TestNextFetch: the snapshot's fetches follow the rows' size (unit).
func TestNextFetch(t *testing.T) {
	rowsOf := func(n, size int) []pubRow {
		out := make([]pubRow, n)
		for i := range out {
			out[i].row = router.Row{Values: [][]byte{bytes.Repeat([]byte("x"), size), nil}}
		}
		return out
	}
	cases := []struct {
		name          string
		n, rows, size int
		want          int
	}{
		{"small rows double", 1, 1, 100, 2},
		{"then at most batch.size", 800, 800, 100, 1000},
		{"900 KB rows: 9 fit 8 MiB", 16, 16, 900_000, 9},
		{"a row over the budget: one at a time", 1, 1, 20 << 20, 1},
		{"empty values", 4, 4, 0, 8},
	}
	for _, c := range cases {
		if got := nextFetch(c.n, rowsOf(c.rows, c.size), 8<<20, 1000); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
