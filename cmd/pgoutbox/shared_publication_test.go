package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestSharedPublicationNameSaysToUseOneOfYourOwn: two teams leave
// postgres.publication.name at one value, with their own slots and outbox
// tables. The second team's start, migrate and validate name the first
// team's slot and say to give each relay a publication of its own, first
// among the fixes: adding the table to the shared publication (what the
// start said before, and what migrate did) stops both relays on each
// other's rows, and listing the other table sends its events to the wrong
// topics. Once the table is in the shared publication anyway, the start
// says the same.
func TestSharedPublicationNameSaysToUseOneOfYourOwn(t *testing.T) {
	t.Parallel()
	a := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if r := invoke(cmdMigrate, nil, a.environ(a.dsn)); r.code != exitOK {
		t.Fatalf("migrate of the first team:\n%s", r)
	}
	// The first team's relay starts once (its state row records its table).
	ca := replication.DefaultConfig()
	ca.DSN, ca.Slot, ca.Publication, ca.Tables = a.dsn, a.slot, a.publication, []string{a.outboxTable}
	if _, err := replication.Prepare(ctx, ca, zap.NewNop()); err != nil {
		t.Fatalf("start of the first team's relay: %v", err)
	}

	b := *a
	b.slot, b.outboxTable = testenv.UniqueName(t, "slotb"), "public.outbox_b"
	a.exec(t, "CREATE TABLE public.outbox_b (LIKE public.outbox INCLUDING ALL)")
	cb := ca
	cb.Slot, cb.Tables = b.slot, []string{b.outboxTable}
	shared := func(what, msg string) {
		t.Helper()
		i := strings.Index(msg, `is used by another pgoutbox relay of this database, slot "`+a.slot+`" (outbox tables public.outbox)`)
		j := strings.Index(msg, "each relay needs a publication of its own: set postgres.publication.name")
		if i < 0 || j < i {
			t.Fatalf("%s does not name slot %s and say to use a publication of its own:\n%s", what, a.slot, msg)
		}
		if k := strings.Index(msg, "ADD TABLE"); k >= 0 && k < j {
			t.Fatalf("%s says ADD TABLE before a publication of its own:\n%s", what, msg)
		}
	}

	_, err := replication.Prepare(ctx, cb, zap.NewNop())
	if !errors.Is(err, replication.ErrCatalogUnusable) {
		t.Fatalf("start of the second team's relay: %v, want a refusal", err)
	}
	shared("the start's refusal", err.Error())

	r := invoke(cmdMigrate, nil, b.environ(b.dsn))
	if r.code == exitOK {
		t.Fatalf("migrate of the second team added its table to the first team's publication:\n%s", r)
	}
	shared("migrate's refusal", r.stderr)
	var published bool
	if err := a.conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'outbox_b')", a.publication).Scan(&published); err != nil || published {
		t.Fatalf("outbox_b in the shared publication after a refused migrate: %v (%v)", published, err)
	}

	r = invoke(cmdValidate, nil, b.environ(b.dsn))
	shared("validate", r.stdout)
	wantLine(t, r, `^FAIL publication: publication "`+a.publication+`" is used by another pgoutbox relay`)

	// Added anyway (as migrate did): nothing else is wrong with the
	// catalog, but the first team's rows would stop this relay.
	a.exec(t, "ALTER PUBLICATION "+a.publication+" ADD TABLE public.outbox_b")
	_, err = replication.Prepare(ctx, cb, zap.NewNop())
	if !errors.Is(err, replication.ErrCatalogUnusable) {
		t.Fatalf("start of the second team's relay with its table in the shared publication: %v, want a refusal", err)
	}
	shared("the start's refusal", err.Error())

	// A relay of the same tables (another region) shares the publication.
	cc := ca
	cc.Slot = testenv.UniqueName(t, "slotc")
	if _, err := replication.Prepare(ctx, cc, zap.NewNop()); err != nil && strings.Contains(err.Error(), "another pgoutbox relay") {
		t.Fatalf("start of a relay of the same table: %v", err)
	}
}
