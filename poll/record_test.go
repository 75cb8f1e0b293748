package poll_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/poll"
)

// The record of the table checked last is what a new process compares
// the table its name names with. It is trusted only where its OIDs mean
// the same table: a relation that has the recorded OID but another row
// type is another table, given the OID of a dropped one again (after the
// OID counter wrapped), and neither stops the relay nor passes for the
// old table; a record of another cluster or database (a restored copy) is
// not used. A rename between the comparison and the check records
// nothing.
func TestTheRecordOfTheTableCheckedLastIsComparedWhereItsOIDsMeanTheSameTable(t *testing.T) {
	ctx := context.Background()
	conn := newDatabase(t)
	params := migrations.PollParams{Table: "public.outbox"}
	if err := migrations.ApplyPoll(ctx, conn, params); err != nil {
		t.Fatal(err)
	}
	exec := func(qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	// start is a new process's session start up to the record.
	start := func() (*poll.Table, poll.Recorded, *poll.ReplacedError) {
		t.Helper()
		tb, err := poll.NewTable("public.outbox", "aggregateid", "id")
		if err != nil {
			t.Fatal(err)
		}
		rec, err := tb.LoadRecord(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		re, err := tb.Replaced(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		return tb, rec, re
	}
	tb, rec, re := start()
	if rec.Found || re != nil {
		t.Fatalf("first start: record %+v, replaced %v; want none", rec, re)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := tb.Record(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var oid uint32
	if err := conn.QueryRow(ctx, "SELECT 'public.outbox'::regclass::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	if _, rec, re = start(); !rec.Found || rec.Elsewhere || rec.OID != oid || re != nil {
		t.Fatalf("after a record: %+v, replaced %v; want table OID %d, the same table", rec, re, oid)
	}

	// Renamed away with an unpublished row, another made under its name.
	create, err := migrations.RenderPoll(params)
	if err != nil {
		t.Fatal(err)
	}
	exec("INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES (gen_random_uuid(), 'A', 'k', 'T')", "ALTER TABLE outbox RENAME TO outbox_old")
	exec(create...)
	if _, _, re = start(); re == nil || re.Old != "public.outbox_old" || re.Unpublished != 1 {
		t.Fatalf("renamed away: replaced %v; want the old table with its unpublished row", re)
	}
	// The recorded OID with another row type: another table.
	exec("UPDATE pgoutbox_poll_state SET row_type_oid = 1")
	if _, _, re = start(); re == nil || re.Old != "" || re.Unpublished != 0 {
		t.Fatalf("the recorded OID with another row type: replaced %v; want the old table gone", re)
	}
	exec("UPDATE pgoutbox_poll_state SET row_type_oid = (SELECT reltype FROM pg_class WHERE oid = table_oid)")

	// A record of another cluster is not used.
	exec("UPDATE pgoutbox_poll_state SET system_identifier = '1'")
	if _, rec, re = start(); !rec.Found || !rec.Elsewhere || re != nil {
		t.Fatalf("a record of another cluster: %+v, replaced %v; want it found, elsewhere, and not compared", rec, re)
	}
	exec("UPDATE pgoutbox_poll_state SET system_identifier = s.system_identifier::text FROM pg_control_system() s")

	// The operator copies the row and drops the old table: a new start
	// goes on, and records the new table.
	exec("INSERT INTO outbox (id, aggregatetype, aggregateid, type) SELECT id, aggregatetype, aggregateid, type FROM outbox_old WHERE published_at IS NULL ORDER BY seq",
		"DROP TABLE outbox_old")
	tb, _, re = start()
	if re == nil || re.Old != "" || !strings.Contains(re.Error(), "was dropped") {
		t.Fatalf("after the old table was dropped: replaced %v; want it said dropped", re)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := tb.Record(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, _, re = start(); re != nil {
		t.Fatalf("after the new table was recorded: replaced %v", re)
	}

	// The name names a table of the recorded OID with another row type:
	// the recorded one was dropped, and this one given its OID.
	exec("UPDATE pgoutbox_poll_state SET row_type_oid = 1")
	if _, _, re = start(); re == nil || re.Old != "" || re.OID != re.OldOID || !strings.Contains(re.Error(), "given the same OID") {
		t.Fatalf("the name's table has the recorded OID and another row type: replaced %v; want the recorded one gone", re)
	}
	exec("UPDATE pgoutbox_poll_state SET row_type_oid = (SELECT reltype FROM pg_class WHERE oid = table_oid)")

	// Renamed between the comparison and the check: nothing is recorded,
	// and the next start compares again.
	tb, _, re = start()
	if re != nil {
		t.Fatal(re)
	}
	exec("ALTER TABLE outbox RENAME TO outbox_old")
	exec(create...)
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := tb.Record(ctx, conn); !errors.Is(err, poll.ErrChangedWhileChecked) {
		t.Fatalf("Record after a rename since Replaced: %v, want ErrChangedWhileChecked", err)
	}
	if _, _, re = start(); re == nil || re.Old != "public.outbox_old" {
		t.Fatalf("after a rename between the comparison and the check: replaced %v; want the old table named", re)
	}
}
