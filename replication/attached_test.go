package replication_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestAttachedWithOlderRowsTellsWhichPartitionsHoldRowsFromBefore builds,
// on a real server, partitions that came to an outbox table every way
// PostgreSQL allows, each with a row written before or after it became a
// partition (which is what the scenario makes true, not what the check
// says), and asks the check which hold rows from before: a table written
// into and attached later; the same in one transaction; the same with a
// rename in the attaching transaction (which rewrites the row type's
// catalog row); a partitioned table whose partition was written into
// before it was attached; an empty table attached and written into
// afterwards; CREATE TABLE ... PARTITION OF written into in its own
// transaction and after, and by a transaction older than it; a partition
// whose owner changed. Known partitions
// (with the same attaching transaction) are not looked at again.
func TestAttachedWithOlderRowsTellsWhichPartitionsHoldRowsFromBefore(t *testing.T) {
	ctx, dsn, conn := connectNew(t)
	role := strings.ToLower(testenv.UniqueName(t, "owner"))
	row := func(table string, n int) string {
		return "INSERT INTO " + table + " (id, n) VALUES (gen_random_uuid(), " + strconv.Itoa(n) + ")"
	}
	for _, sql := range []string{
		"CREATE ROLE " + role,
		"CREATE TABLE outbox (id uuid, n int NOT NULL) PARTITION BY RANGE (n)",
		"CREATE PUBLICATION attached_pub FOR TABLE outbox WITH (publish_via_partition_root = true)",
		// Before, in separate transactions.
		"CREATE TABLE p_before (LIKE outbox)", row("p_before", 5),
		"ALTER TABLE outbox ATTACH PARTITION p_before FOR VALUES FROM (0) TO (10)",
		// Before, in the attaching transaction.
		"BEGIN; CREATE TABLE p_one_txn (LIKE outbox); " + row("p_one_txn", 15) + "; ALTER TABLE outbox ATTACH PARTITION p_one_txn FOR VALUES FROM (10) TO (20); COMMIT",
		// Before, renamed in the attaching transaction.
		"CREATE TABLE staging (LIKE outbox)", row("staging", 25),
		"BEGIN; ALTER TABLE staging RENAME TO p_renamed; ALTER TABLE outbox ATTACH PARTITION p_renamed FOR VALUES FROM (20) TO (30); COMMIT",
		// Before, one level down.
		"CREATE TABLE p_mid (LIKE outbox) PARTITION BY RANGE (n)",
		"CREATE TABLE p_leaf PARTITION OF p_mid FOR VALUES FROM (30) TO (40)", row("p_mid", 35),
		"ALTER TABLE outbox ATTACH PARTITION p_mid FOR VALUES FROM (30) TO (40)",
		// After: attached empty, written into afterwards, in its
		// transaction and later.
		"BEGIN; CREATE TABLE p_empty (LIKE outbox); ALTER TABLE outbox ATTACH PARTITION p_empty FOR VALUES FROM (40) TO (50); " + row("outbox", 45) + "; COMMIT",
		row("outbox", 46),
		// After: created as a partition, written into in its transaction
		// and later; its owner changed since.
		"BEGIN; CREATE TABLE p_created PARTITION OF outbox FOR VALUES FROM (50) TO (60); " + row("outbox", 55) + "; COMMIT",
		row("outbox", 56),
		"ALTER TABLE p_created OWNER TO " + role,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP TABLE IF EXISTS outbox CASCADE; DROP TABLE IF EXISTS p_before CASCADE; DROP ROLE IF EXISTS "+role)
	})
	// After: created as a partition while an older transaction was open,
	// which then wrote into it. Its transaction is older than the
	// partition, but no transaction could see the partition before it
	// was committed: the row is the outbox's.
	older, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close(context.Background())
	for _, step := range []struct {
		c   *pgx.Conn
		sql string
	}{
		{older, "BEGIN"}, {older, "SELECT pg_current_xact_id()"},
		{conn, "CREATE TABLE p_concurrent PARTITION OF outbox FOR VALUES FROM (60) TO (70)"},
		{older, row("outbox", 65)}, {older, "COMMIT"},
	} {
		if _, err := step.c.Exec(ctx, step.sql); err != nil {
			t.Fatalf("%s: %v", step.sql, err)
		}
	}
	cfg := replication.Config{Publication: "attached_pub", Tables: []string{"public.outbox"}}
	cat, err := replication.ReadCatalog(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	problems, unknown, checked, err := replication.AttachedWithOlderRows(ctx, conn, &cat, map[uint32]uint32{}, time.Minute)
	if err != nil || len(unknown) != 0 {
		t.Fatalf("check: %v, unknown %v", err, unknown)
	}
	var named []string
	for _, p := range problems {
		name, _, _ := strings.Cut(strings.TrimPrefix(p, "partition "), " ")
		named = append(named, name)
	}
	slices.Sort(named)
	if want := []string{"public.p_before", "public.p_leaf", "public.p_one_txn", "public.p_renamed"}; !slices.Equal(named, want) {
		t.Fatalf("partitions named as holding rows from before their attach: %v, want %v\n%s", named, want, strings.Join(problems, "\n"))
	}
	if len(checked) != 3 {
		t.Fatalf("partitions that passed: %v, want p_empty, p_created and p_concurrent", checked)
	}
	// Nothing recorded (a state row from before partitions were): those
	// created by their attaching transaction are taken as they are.
	if problems, _, _, err := replication.AttachedWithOlderRows(ctx, conn, &cat, nil, time.Minute); err != nil || len(problems) != 3 || strings.Contains(strings.Join(problems, " "), "p_one_txn") {
		t.Fatalf("with nothing recorded: %v, %v; want p_before, p_renamed and p_leaf", problems, err)
	}
	// Known with the same attaching transaction: not looked at again.
	known := map[uint32]uint32{}
	for _, tb := range cat.Tables {
		for _, p := range tb.Partitions {
			known[p.OID] = p.Joined
		}
	}
	if problems, _, checked, err := replication.AttachedWithOlderRows(ctx, conn, &cat, known, time.Minute); err != nil || len(problems) != 0 || len(checked) != 0 {
		t.Fatalf("known partitions looked at again: %v %v %v", problems, checked, err)
	}
}

// TestRowsFromBeforeAJoinAreNotHiddenByARewrite: the checks for rows an
// outbox table or partition held before it joined (never in the stream)
// compare each row's transaction with the joining one. An ALTER TABLE that
// rewrites the table (a column added with a volatile default, a type
// changed) writes every row again with its own, newer transaction, and
// the rows from before then passed as newer. A table or partition
// rewritten after it joined is now named as one that could not be told
// (its caller holds cleanup), never passed, also after later DDL of other
// kinds. On a real server: a partition written into, attached, then
// rewritten with its table; a table written into, added to the
// publication, then rewritten.
func TestRowsFromBeforeAJoinAreNotHiddenByARewrite(t *testing.T) {
	ctx, _, conn := connectNew(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE TABLE outbox (id uuid, n int NOT NULL) PARTITION BY RANGE (n)")
	exec("CREATE TABLE outbox2 (id uuid, n int NOT NULL)")
	exec("CREATE PUBLICATION rewrite_pub FOR TABLE outbox WITH (publish_via_partition_root = true)")
	exec("CREATE TABLE p_before (LIKE outbox)")
	exec("INSERT INTO p_before VALUES (gen_random_uuid(), 5)")
	exec("ALTER TABLE outbox ATTACH PARTITION p_before FOR VALUES FROM (0) TO (10)")
	exec("INSERT INTO outbox2 VALUES (gen_random_uuid(), 1)")
	exec("ALTER PUBLICATION rewrite_pub ADD TABLE outbox2")
	cfg := replication.Config{Publication: "rewrite_pub", Tables: []string{"public.outbox", "public.outbox2"}}
	check := func() (partition, table string) {
		t.Helper()
		cat, err := replication.ReadCatalog(ctx, conn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		problems, unknown, checked, err := replication.AttachedWithOlderRows(ctx, conn, &cat, map[uint32]uint32{}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case len(problems) == 1 && strings.Contains(problems[0], "p_before"):
			partition = "rows from before"
		case len(unknown) == 1 && strings.Contains(unknown[0].Why, "rewritten"):
			partition = "rewritten"
		case len(checked) == 1:
			partition = "passed"
		}
		var outbox, outbox2 uint32
		for _, tb := range cat.Tables {
			switch tb.Name {
			case "public.outbox":
				outbox = tb.OID
			case "public.outbox2":
				outbox2 = tb.OID
			}
		}
		// The last session relayed outbox alone: outbox2 is new to it.
		st := replication.State{PublicationOID: cat.Publication, TableOIDs: map[string]uint32{"public.outbox": outbox}}
		problems, unknownTables, err := replication.JoinedWithOlderRows(ctx, conn, cfg, &st, &cat)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case outbox2 == 0:
		case len(problems) == 1 && strings.Contains(problems[0], "outbox2"):
			table = "rows from before"
		case len(unknownTables) == 1 && strings.Contains(unknownTables[0], "rewritten"):
			table = "rewritten"
		case len(problems) == 0 && len(unknownTables) == 0:
			table = "passed"
		}
		return partition, table
	}
	if p, tb := check(); p != "rows from before" || tb != "rows from before" {
		t.Fatalf("before the rewrite: partition %q, table %q; want both holding rows from before", p, tb)
	}
	exec("ALTER TABLE outbox ADD COLUMN r float8 DEFAULT random()")
	exec("ALTER TABLE outbox2 ADD COLUMN r float8 DEFAULT random()")
	if p, tb := check(); p != "rewritten" || tb != "rewritten" {
		t.Fatalf("after the rewrite: partition %q, table %q; want both named as rewritten, not passed", p, tb)
	}
	// Later DDL of other kinds writes the tables' pg_class rows again,
	// not the rewritten columns' rows.
	exec("ALTER TABLE outbox ADD COLUMN z int")
	exec("ALTER TABLE outbox2 ADD COLUMN z int")
	exec("GRANT SELECT ON outbox, outbox2, p_before TO PUBLIC")
	if p, tb := check(); p != "rewritten" || tb != "rewritten" {
		t.Fatalf("after the rewrite and other DDL: partition %q, table %q; want both named as rewritten, not passed", p, tb)
	}
}

// connectNew connects, for at most a minute, to a database of its own on
// the test server.
func connectNew(t *testing.T) (context.Context, string, *pgx.Conn) {
	t.Helper()
	dsn := testenv.Require(t).NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return ctx, dsn, conn
}
