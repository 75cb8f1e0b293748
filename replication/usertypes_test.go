package replication_test

import (
	"context"
	"maps"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestUserTypesAreReadAsTheServerDefinesThem reads, on a real server, the
// user types of an outbox table's columns both ways the relay does: from
// the catalog (the stream's RELATION names each column's own type) and by
// the OIDs of a query's row description (where a domain is its base type
// already). A domain at any depth resolves to its base type with the last
// domain's modifier; an enum, citext and ltree are reproduced (the conformance
// suite holds each against the real Debezium); an array of an enum, a
// domain over one, an hstore, a composite and a range of a user type are
// not; int4range is built in (the router decides). information_schema's
// domains (OIDs below 16384) resolve like the user's.
func TestUserTypesAreReadAsTheServerDefinesThem(t *testing.T) {
	env := testenv.Require(t)
	conn := connectStats(t, env.NewDatabase(t))
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS citext; CREATE EXTENSION IF NOT EXISTS hstore; CREATE EXTENSION IF NOT EXISTS ltree;
		CREATE DOMAIN amount_d AS numeric(12,2); CREATE DOMAIN amount_dd AS amount_d;
		CREATE TYPE mood_t AS ENUM ('a', 'b'); CREATE DOMAIN moods_d AS mood_t[]; CREATE DOMAIN ymood_d AS mood_t;
		CREATE TYPE pair_t AS (x int, y int); CREATE TYPE frange_t AS RANGE (subtype = float8);
		CREATE PUBLICATION types_pub FOR ALL TABLES;
		CREATE TABLE outbox (id uuid, n int4, r int4range, amt amount_dd, mood mood_t, email citext,
			moods mood_t[], dmoods moods_d, tags hstore, pair pair_t, fr frange_t, path ltree,
			card information_schema.cardinal_number, ymood ymood_d)`); err != nil {
		t.Fatal(err)
	}
	oid := func(name string) uint32 {
		var o uint32
		if err := conn.QueryRow(ctx, "SELECT $1::regtype::oid", name).Scan(&o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	want := map[uint32]replication.UserType{
		oid("amount_dd"): {Base: 1700, BaseMod: 12<<16 | 2 + 4},
		oid("mood_t"):    {BaseMod: -1},
		oid("citext"):    {BaseMod: -1},
		oid("ltree"):     {BaseMod: -1},
		oid("mood_t[]"):  {BaseMod: -1, NotReproduced: true},
		oid("moods_d"):   {Base: oid("mood_t[]"), BaseMod: -1, NotReproduced: true},
		oid("hstore"):    {BaseMod: -1, NotReproduced: true},
		oid("pair_t"):    {BaseMod: -1, NotReproduced: true},
		oid("frange_t"):  {BaseMod: -1, NotReproduced: true},
		// information_schema's domain, whose OID is below 16384 (initdb
		// makes it), and a domain over an enum.
		oid("information_schema.cardinal_number"): {Base: 23, BaseMod: -1},
		oid("ymood_d"): {Base: oid("mood_t"), BaseMod: -1},
	}
	cfg := replication.DefaultConfig()
	cfg.Publication, cfg.Tables = "types_pub", []string{"public.outbox"}
	cat, err := replication.ReadCatalog(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(cat.UserTypes, want) {
		t.Fatalf("catalog user types %v, want %v", cat.UserTypes, want)
	}
	// A row description: the domains are their base types already.
	rows, err := conn.Query(ctx, "SELECT * FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	var types []uint32
	for _, f := range rows.FieldDescriptions() {
		types = append(types, f.DataTypeOID)
	}
	rows.Close()
	got, err := replication.ReadUserTypes(ctx, conn, types, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantQuery := maps.Clone(want)
	delete(wantQuery, oid("amount_dd"))
	delete(wantQuery, oid("moods_d"))
	delete(wantQuery, oid("information_schema.cardinal_number"))
	delete(wantQuery, oid("ymood_d"))
	if !maps.Equal(got, wantQuery) {
		t.Fatalf("row description user types %v, want %v", got, wantQuery)
	}
	rt, _, known := replication.RouterTypes(got, types, nil)
	if !known || rt[3] != 1700 || rt[4] != 25 || rt[5] != 25 || rt[7] != rt[6] || rt[6] == oid("mood_t[]") || rt[13] != 25 {
		t.Fatalf("router types %v (known %v)", rt, known)
	}
}
