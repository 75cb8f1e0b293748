package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestPollStatusAndValidateTellTheTableCheckedLast: the poll source
// records the table it checked under its name. Once that table is renamed
// away with an unpublished row and another made under the name, status
// and validate say so, as the relay's refusal to start does, until the
// row is copied into the new table and the old one dropped.
func TestPollStatusAndValidateTellTheTableCheckedLast(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.environ(withPassword(t, f.dsn, ""), "PGOUTBOX_RELAY_SOURCE=poll")
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("migrate: %s", r)
	}
	r := invoke(cmdValidate, []string{"--topics", f.topicName}, env)
	wantLine(t, r, `^PASS poll record: no table recorded yet`)
	// A relay's session start.
	ctx := context.Background()
	conn := testenv.ConnectPG(t, f.dsn)
	tb, err := poll.NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := tb.Record(ctx, conn); err != nil {
		t.Fatal(err)
	}
	status := func() pollStatus {
		t.Helper()
		r := invoke(cmdStatus, []string{"--format", "json"}, env)
		var st pollStatus
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("status JSON: %v\n%s", err, r)
		}
		return st
	}
	if st := status(); st.Table.Recorded == nil || st.Table.Recorded.Now != "" || len(st.Problems) != 0 {
		t.Fatalf("status after a relay recorded the table: %+v", st)
	}
	r = invoke(cmdValidate, []string{"--topics", f.topicName}, env)
	wantLine(t, r, `^PASS poll record: public.outbox is the table checked last`)

	f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'a', 'created', '{}')`)
	f.exec(t, "ALTER TABLE public.outbox RENAME TO outbox_old")
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("migrate: %s", r)
	}
	st := status()
	if st.Table.Recorded == nil || !strings.Contains(st.Table.Recorded.Now, "public.outbox_old") || len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "1 unpublished row") {
		t.Fatalf("status after the table was renamed away with an unpublished row: %+v", st)
	}
	r = invoke(cmdStatus, nil, env)
	if r.code != exitRuntime {
		t.Fatalf("status: want exit 1:\n%s", r)
	}
	wantLine(t, r, `^  checked_last +table OID \d+, checked .*: the name names another table now`)
	r = invoke(cmdValidate, []string{"--topics", f.topicName}, env)
	if r.code != exitRuntime {
		t.Fatalf("validate: want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL poll record: .*public.outbox_old now and holds 1 unpublished row`)

	f.exec(t, "INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) SELECT id, aggregatetype, aggregateid, type, payload FROM public.outbox_old WHERE published_at IS NULL ORDER BY seq")
	f.exec(t, "DROP TABLE public.outbox_old")
	if st := status(); len(st.Problems) != 0 {
		t.Fatalf("status after the row was copied and the old table dropped: %+v", st)
	}
	r = invoke(cmdValidate, []string{"--topics", f.topicName}, env)
	wantLine(t, r, `^PASS poll record: the table checked last is not the one the name names now`)
}
