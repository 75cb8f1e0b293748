package replication

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/router"
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
		{"all tables, partitions by their own names", Catalog{Publication: 1, Insert: true, AllTables: true, Tables: []TableInfo{func() TableInfo {
			t := ok
			t.Kind = 'p'
			return t
		}()}}, "is FOR ALL TABLES and reports the changes of partitions under their own names"},
		{"all tables, partitions through the root", Catalog{Publication: 1, Insert: true, AllTables: true, ViaRoot: true, Tables: []TableInfo{func() TableInfo {
			t := ok
			t.Kind = 'p'
			return t
		}()}}, ""},
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

// TestCatalogChangesTellWhatLeftNoTrace: a table taken out of the
// publication and put back (a new membership row), and the publication's
// options changed and changed back (its row written), look the same as
// before in every other column; both are changes, at a running check and
// against the state row at the next start. A membership kept by either of
// its rows, an added schema membership, and a publication FOR ALL TABLES
// are not.
func TestCatalogChangesTellWhatLeftNoTrace(t *testing.T) {
	cfg := DefaultConfig()
	table := TableInfo{Name: "public.outbox", OID: 10, Kind: 'r', Persistence: 'p', Published: true, Membership: Membership{Rel: 100}}
	start := Catalog{Publication: 1, Insert: true, PublicationXmin: 500, Tables: []TableInfo{table}}
	with := func(f func(c *Catalog)) Catalog {
		c := start
		c.Tables = slices.Clone(start.Tables)
		f(&c)
		return c
	}
	var recorded State
	recorded.SetCatalog(&start)
	cases := []struct {
		name string
		now  Catalog
		want string // "" for no change
	}{
		{"same", start, ""},
		{"put back", with(func(c *Catalog) { c.Tables[0].Membership.Rel = 101 }), "was taken out of publication \"pgoutbox\" and put back"},
		{"kept by its schema", with(func(c *Catalog) {
			c.Tables[0].Membership = Membership{Rel: 101, Schema: 200}
		}), "was taken out of publication"},
		{"schema added beside", with(func(c *Catalog) { c.Tables[0].Membership.Schema = 200 }), ""},
		// The publication's row written is a warning (Altered), not a
		// change: OWNER TO and a SET that changes nothing write it too.
		{"options altered", with(func(c *Catalog) { c.PublicationXmin = 501 }), ""},
	}
	for _, c := range cases {
		for _, way := range []struct {
			name string
			got  []string
		}{
			{"running", start.Changes(&c.now, cfg)},
			{"at start", recorded.ChangesSince(&c.now, cfg)},
		} {
			got := strings.Join(way.got, "; ")
			if c.want == "" && got != "" || !strings.Contains(got, c.want) {
				t.Errorf("%s, %s: changes %q, want one saying %q", c.name, way.name, got, c.want)
			}
		}
	}
	// Kept by the schema's row while the table's own went and came back.
	bySchema := with(func(c *Catalog) { c.Tables[0].Membership = Membership{Rel: 100, Schema: 200} })
	back := with(func(c *Catalog) { c.Tables[0].Membership = Membership{Rel: 101, Schema: 200} })
	if ch := bySchema.Changes(&back, cfg); len(ch) != 0 {
		t.Errorf("a table kept in by its schema reported as %q", ch)
	}
	altered := with(func(c *Catalog) { c.PublicationXmin = 501 })
	if w := altered.Altered(start.PublicationXmin, "the session started", cfg); !strings.Contains(w, `publication "pgoutbox" was altered since the session started`) {
		t.Errorf("Altered = %q", w)
	}
	if w := start.Altered(start.PublicationXmin, "x", cfg); w != "" {
		t.Errorf("Altered of the same row = %q", w)
	}
	if w := altered.Altered(0, "x", cfg); w != "" {
		t.Errorf("Altered with nothing recorded = %q", w)
	}
	// FOR ALL TABLES has no membership rows; nothing recorded tells nothing.
	all := Catalog{Publication: 1, Insert: true, AllTables: true, PublicationXmin: 500, Tables: []TableInfo{{Name: "public.outbox", OID: 10, Kind: 'r', Persistence: 'p', Published: true}}}
	if ch := all.Changes(&all, cfg); len(ch) != 0 {
		t.Errorf("FOR ALL TABLES reported as %q", ch)
	}
	old := State{PublicationOID: 1, TableOIDs: map[string]uint32{"public.outbox": 10}}
	if ch := old.ChangesSince(&cases[1].now, cfg); len(ch) != 0 {
		t.Errorf("a state row without membership reported %q", ch)
	}
}

// TestCatalogProblemsNameAPartitionsOwnFilter: without
// publish_via_partition_root, pgoutput applies a partition's own row filter
// or column list; through the root it does not.
func TestCatalogProblemsNameAPartitionsOwnFilter(t *testing.T) {
	cfg := DefaultConfig()
	cat := Catalog{Publication: 1, Insert: true, Tables: []TableInfo{{Name: "public.outbox", OID: 10, Kind: 'p', Persistence: 'p', Published: true,
		Partitions: []PartitionInfo{{OID: 11, Name: "public.outbox_1", Kind: 'r', Persistence: 'p', RowFilter: true, ColumnList: true}}}}}
	got := strings.Join(cat.Problems(cfg), "; ")
	for _, want := range []string{"row filter (WHERE) on partition public.outbox_1", "only some columns of partition public.outbox_1"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems %q lack %q", got, want)
		}
	}
	cat.ViaRoot = true
	if p := cat.Problems(cfg); len(p) != 0 {
		t.Errorf("through the root: problems %q", p)
	}
	p, err := parsePartition("11:r:p:rco:0/0/0:public.outbox_1")
	if err != nil || !p.RowFilter || !p.ColumnList || !p.Own || p.Name != "public.outbox_1" || p.OID != 11 {
		t.Errorf("parsePartition: %+v, %v", p, err)
	}
	if p, err := parsePartition("12:r:p::4000000000/7/4000000000:s.a:b"); err != nil || p.RowFilter || p.ColumnList || p.Own || p.Name != "s.a:b" || p.Joined != 4000000000 || p.JoinedCmd != 7 || !p.CreatedJoining() {
		t.Errorf("parsePartition of a name with a colon: %+v, %v", p, err)
	}
}

// TestTimelineEndReadsAHistoryFile: a timeline history file lists where
// each earlier timeline ended; a timeline not in it is not found.
func TestTimelineEndReadsAHistoryFile(t *testing.T) {
	content := []byte("1\t0/3000000\tno recovery target specified\n\n2\t0/5A00B28\tbefore 2026-12-03 10:00:00+00\n")
	for _, c := range []struct {
		tli   int32
		want  LSN
		found bool
	}{{1, 0x3000000, true}, {2, 0x5A00B28, true}, {3, 0, false}} {
		got, ok, err := timelineEnd(content, c.tli)
		if err != nil || ok != c.found || got != c.want {
			t.Errorf("timeline %d: %s, %v, %v; want %s, %v", c.tli, got, ok, err, c.want, c.found)
		}
	}
	if _, _, err := timelineEnd([]byte("x\t0/1\tbad\n"), 1); err == nil {
		t.Error("a bad line accepted")
	}
}

func TestRouterTypesResolveDomainsAndTellUnknownTypes(t *testing.T) {
	cat := Catalog{UserTypes: map[uint32]UserType{
		16400: {Base: 1082, BaseMod: -1},      // a domain over date
		16401: {Base: 1700, BaseMod: 1310734}, // a domain over numeric(20,10)
		16402: {BaseMod: -1},                  // an enum
	}}
	types, mods := []uint32{25, 16400, 16401, 16402}, []int32{-1, -1, -1, -1}
	rt, rm, known := cat.RouterTypes(types, mods)
	if !known || !slices.Equal(rt, []uint32{25, 1082, 1700, 25}) || !slices.Equal(rm, []int32{-1, -1, 1310734, -1}) {
		t.Fatalf("got %v %v %v", rt, rm, known)
	}
	if types[1] != 16400 || mods[2] != -1 {
		t.Fatal("the relation's own slices were changed")
	}
	if rt, rm, known := cat.RouterTypes([]uint32{25, 23, 1700}, []int32{-1, -1, 5}); !known || rt != nil || rm != nil {
		t.Fatal("built-in types are known, and leave the row's own types as they are")
	}
	// A type the catalog does not have: not known, and refused should the
	// caller take it as the last word; never the user type's own OID, which
	// the router would read as text (or, at the largest OID, as refused).
	rt, _, known = cat.RouterTypes([]uint32{25, 16500, router.NotReproducedType}, []int32{-1, -1, -1})
	if known || !slices.Equal(rt, []uint32{25, router.NotReproducedType, router.NotReproducedType}) {
		t.Fatalf("types the catalog does not have: got %v %v", rt, known)
	}
	// Made by initdb (information_schema's domains): resolved when the
	// catalog has them, not known when it does not.
	cat.UserTypes[13010] = UserType{Base: 23, BaseMod: -1}
	if rt, _, known := cat.RouterTypes([]uint32{13010}, []int32{-1}); !known || !slices.Equal(rt, []uint32{23}) {
		t.Fatalf("an information_schema domain: got %v %v", rt, known)
	}
	if rt, _, known := cat.RouterTypes([]uint32{13020}, []int32{-1}); known || rt != nil {
		t.Fatalf("an initdb type the catalog does not have: got %v %v", rt, known)
	}
	cat.UserTypes[16403] = UserType{BaseMod: -1, NotReproduced: true}              // an array of the enum
	cat.UserTypes[16404] = UserType{Base: 16403, BaseMod: -1, NotReproduced: true} // a domain over it
	cat.UserTypes[16405] = UserType{Base: 16402, BaseMod: -1}                      // a domain over the enum
	rt, rm, known = cat.RouterTypes([]uint32{16403, 16402, 16404, 16405}, []int32{-1, -1, -1, -1})
	if !known || !slices.Equal(rt, []uint32{router.NotReproducedType, 25, router.NotReproducedType, 25}) || !slices.Equal(rm, []int32{-1, -1, -1, -1}) {
		t.Fatalf("types Debezium converts in its own way: got %v %v %v", rt, rm, known)
	}
}

func TestParseUserTypesTellsWhatIsReproduced(t *testing.T) {
	m := map[uint32]UserType{}
	if err := parseUserTypes([]string{"16400:1082:-1:r", "16402:16402:-1:r", "16403:16403:-1:n", "16404:16403:-1:n"}, m); err != nil {
		t.Fatal(err)
	}
	want := map[uint32]UserType{16400: {Base: 1082, BaseMod: -1}, 16402: {BaseMod: -1}, 16403: {BaseMod: -1, NotReproduced: true}, 16404: {Base: 16403, BaseMod: -1, NotReproduced: true}}
	if !maps.Equal(m, want) {
		t.Fatalf("got %v, want %v", m, want)
	}
	for _, bad := range []string{"16400:1082:-1", "16400:1082:-1:x", "x"} {
		if err := parseUserTypes([]string{bad}, m); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
