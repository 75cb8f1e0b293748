package poll

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestMarkFetchesRowsByCTID: on a table of a few thousand pages, a batch
// of 1,000 ctids makes the planner scan the whole table for the mark
// (custom and generic plans alike), comparing every row with the batch;
// that grew to 3.5 s a batch in a benchmark run, and the poll relay fell
// behind for good. Within markSetting the mark is a TID scan. The oracle
// is PostgreSQL's planner, asked for both plans of the statement Finish
// runs, with and without the setting.
func TestMarkFetchesRowsByCTID(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	conn := testenv.ConnectPG(t, env.NewDatabase(t))
	for _, sql := range []string{
		`CREATE TABLE outbox (id uuid PRIMARY KEY, aggregateid text, payload jsonb, seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz)`,
		`CREATE INDEX ON outbox (seq) WHERE published_at IS NULL`,
		`INSERT INTO outbox (id, aggregateid, payload) SELECT gen_random_uuid(), (i % 100)::text, '{"a": 1}' FROM generate_series(1, 30000) i`,
		`ANALYZE outbox`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var ctids []string
	rows, err := conn.Query(ctx, "SELECT ctid::text FROM outbox ORDER BY seq DESC LIMIT 1000")
	if err != nil {
		t.Fatal(err)
	}
	if ctids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	n := 0
	plan := func(setting bool, mode, onPublish string) string {
		t.Helper()
		n++
		name := "mark_" + strconv.Itoa(n) // prepared statements outlive the transaction
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		stmts := []string{"SET LOCAL plan_cache_mode = " + mode}
		if setting {
			stmts = append(stmts, markSetting)
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, "PREPARE "+name+"(text[]) AS "+markSQL("outbox", onPublish)); err != nil {
			t.Fatal(err)
		}
		var out []string
		// EXPLAIN takes no parameters: the ctids as a literal ("(p,i)").
		r, err := tx.Query(ctx, `EXPLAIN EXECUTE `+name+`('{"`+strings.Join(ctids, `","`)+`"}')`)
		if err != nil {
			t.Fatal(err)
		}
		if out, err = pgx.CollectRows(r, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		return strings.Join(out, "\n")
	}
	if p := plan(false, "force_custom_plan", OnPublishMark); !strings.Contains(p, "Seq Scan") {
		t.Logf("without the setting the planner fetched by ctid here, so the case below proves less:\n%s", p)
	}
	for _, onPublish := range []string{OnPublishMark, OnPublishDelete} {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			if p := plan(true, mode, onPublish); !strings.Contains(p, "Tid Scan") || strings.Contains(p, "Seq Scan") {
				t.Errorf("%s, %s: the mark does not fetch its rows by ctid:\n%s", onPublish, mode, p)
			}
		}
	}
}
