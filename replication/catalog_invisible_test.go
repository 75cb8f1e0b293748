package replication

import (
	"slices"
	"testing"
)

// TestInvisibleComparesIDsAsPostgreSQLDoes: a waiting transaction is
// invisible when the snapshot lists it or when it is at or after the
// snapshot's xmax, compared modulo 2^32 (pg_stat_activity shows 32-bit IDs,
// the snapshot 64-bit ones), across an epoch boundary too.
func TestInvisibleComparesIDsAsPostgreSQLDoes(t *testing.T) {
	for _, c := range []struct {
		snap    string
		waiting []string
		want    []string
	}{
		{"100:105:", []string{"99", "104", "105", "106"}, []string{"105", "106"}},
		{"100:105:101,103", []string{"101", "102", "103"}, []string{"101", "103"}},
		{"100:105:", nil, nil},
		// xmax just past an epoch boundary: 4294967295 precedes it, 0 and 3
		// (the next epoch's IDs 0 and 3 are 2^32 and 2^32+3) are not all.
		{"4294967290:4294967298:", []string{"4294967295", "1", "2", "3"}, []string{"2", "3"}},
		{"8589934590:8589934594:8589934591", []string{"4294967295", "1", "2"}, []string{"4294967295", "2"}},
	} {
		got, err := invisible(c.snap, c.waiting)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("invisible(%q, %v) = %v, %v; want %v", c.snap, c.waiting, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "1:2", "1:x:", "1:2:y"} {
		if _, err := invisible(bad, []string{"1"}); err == nil {
			t.Errorf("invisible(%q) accepted a malformed snapshot", bad)
		}
	}
}
