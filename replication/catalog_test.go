package replication

import (
	"strings"
	"testing"
)

func TestCatalogProblemsNameWhatKeepsInsertsOut(t *testing.T) {
	cfg := DefaultConfig()
	ok := TableInfo{Name: "public.outbox", OID: 10, Kind: 'r', Persistence: 'p', Published: true}
	cases := []struct {
		name string
		cat  Catalog
		want string // "" for no problem
	}{
		{"fine", Catalog{Publication: 1, Insert: true, Tables: []TableInfo{ok}}, ""},
		{"no publication", Catalog{Tables: []TableInfo{ok}}, "does not exist"},
		{"no inserts", Catalog{Publication: 1, Tables: []TableInfo{ok}}, "does not publish inserts"},
		{"no table", Catalog{Publication: 1, Insert: true, Tables: []TableInfo{{Name: "public.outbox"}}}, "outbox table public.outbox does not exist"},
		{"not published", Catalog{Publication: 1, Insert: true, Tables: []TableInfo{func() TableInfo { t := ok; t.Published = false; return t }()}}, "does not include table public.outbox"},
		// FOR ALL TABLES leaves unlogged tables out without a word.
		{"unlogged", Catalog{Publication: 1, Insert: true, AllTables: true, Tables: []TableInfo{func() TableInfo { t := ok; t.Persistence = 'u'; return t }()}}, "UNLOGGED"},
		{"row filter", Catalog{Publication: 1, Insert: true, Tables: []TableInfo{func() TableInfo { t := ok; t.RowFilter = true; return t }()}}, "row filter"},
		{"column list", Catalog{Publication: 1, Insert: true, Tables: []TableInfo{func() TableInfo { t := ok; t.ColumnList = true; return t }()}}, "only some columns"},
		{"foreign partition", Catalog{Publication: 1, Insert: true, Tables: []TableInfo{func() TableInfo {
			t := ok
			t.Kind = 'p'
			t.Partitions = []PartitionInfo{{OID: 11, Name: "public.outbox_remote", Kind: 'f', Persistence: 'p'}}
			return t
		}()}}, "is a foreign table"},
		{"inheriting table", Catalog{Publication: 1, Insert: true, Tables: []TableInfo{func() TableInfo {
			t := ok
			t.Inheritors = []string{"public.outbox_2026"}
			return t
		}()}}, "table public.outbox_2026 inherits from outbox table public.outbox"},
	}
	for _, c := range cases {
		got := strings.Join(c.cat.Problems(cfg), "; ")
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%s: problems %q, want one saying %q", c.name, got, c.want)
		}
	}
}

func TestCatalogChangesTellARecreatedTableAndPublication(t *testing.T) {
	cfg := DefaultConfig()
	start := Catalog{Publication: 1, Insert: true, Tables: []TableInfo{{Name: "public.outbox", OID: 10, Kind: 'r', Persistence: 'p', Published: true}}}
	same := start
	if ch := start.Changes(&same, cfg); len(ch) != 0 {
		t.Fatalf("no change reported as %q", ch)
	}
	moved := start
	moved.Publication = 2
	moved.Tables = []TableInfo{{Name: "public.outbox", OID: 12, Kind: 'r', Persistence: 'p', Published: true}}
	got := strings.Join(start.Changes(&moved, cfg), "; ")
	for _, want := range []string{"publication \"pgoutbox\" was dropped and created again", "public.outbox was dropped and created again"} {
		if !strings.Contains(got, want) {
			t.Errorf("changes %q lack %q", got, want)
		}
	}
	gone := start
	gone.Tables = []TableInfo{{Name: "public.outbox"}}
	if got := strings.Join(start.Changes(&gone, cfg), "; "); !strings.Contains(got, "dropped or renamed") {
		t.Errorf("changes %q do not say the table went", got)
	}
	// A partition attached is no change: the relay classifies it.
	attached := start
	attached.Tables = []TableInfo{{Name: "public.outbox", OID: 10, Kind: 'r', Persistence: 'p', Published: true, Partitions: []PartitionInfo{{OID: 20, Name: "public.p1", Kind: 'r', Persistence: 'p'}}}}
	if ch := start.Changes(&attached, cfg); len(ch) != 0 {
		t.Errorf("an attached partition reported as %q", ch)
	}
	if r, ok := attached.Root(20); !ok || r != "public.outbox" {
		t.Errorf("Root(partition) = %q, %v", r, ok)
	}
}
