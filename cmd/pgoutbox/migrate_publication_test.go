package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestMigrateCreatesTheAllTablesPublicationRunWould: with
// publication.autocreate.mode all_tables, run creates the publication FOR
// ALL TABLES; migrate created it FOR TABLE the outbox tables, so the same
// configuration gave a different publication depending on which command
// came first.
func TestMigrateCreatesTheAllTablesPublicationRunWould(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.environ(f.dsn, "PGOUTBOX_POSTGRES_PUBLICATION_AUTOCREATE_MODE=all_tables")
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("migrate:\n%s", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var all bool
	if err := f.conn.QueryRow(ctx, "SELECT puballtables FROM pg_publication WHERE pubname = $1", f.publication).Scan(&all); err != nil {
		t.Fatalf("read publication %s: %v", f.publication, err)
	}
	if !all {
		t.Fatalf("publication %s: puballtables false after migrate in all_tables mode, want true (FOR ALL TABLES, as run creates it)", f.publication)
	}
	// migrate --print shows the same statement.
	r := invoke(cmdMigrate, []string{"--print"}, env)
	if r.code != exitOK || !strings.Contains(r.stdout, `CREATE PUBLICATION "`+f.publication+`" FOR ALL TABLES WITH (publish = 'insert', publish_via_partition_root = true);`) {
		t.Fatalf("migrate --print does not create the publication FOR ALL TABLES:\n%s", r)
	}
}
