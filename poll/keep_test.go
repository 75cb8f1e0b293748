package poll_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/poll"
)

// Without its keep triggers the poll table loses the event of every writer
// that deletes its row in its own transaction (the WAL source's
// delete-after-insert mode): the relay refuses to start on it, and a
// running relay's periodic look refuses it once they are dropped (as
// pgoutbox migrate with the WAL source does) or disabled.
func TestCheckRefusesATableWithoutItsKeepTriggers(t *testing.T) {
	ctx := context.Background()
	conn := newDatabase(t)
	poll1 := migrations.PollParams{Table: "public.outbox"}
	if err := migrations.ApplyPoll(ctx, conn, poll1); err != nil {
		t.Fatal(err)
	}
	tb, err := poll.NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatalf("Check of the table poll migrate made: %v", err)
	}
	wantRefused := func(what string, err error, trigger string) {
		t.Helper()
		if !errors.Is(err, poll.ErrLayout) || !strings.Contains(err.Error(), trigger) || !strings.Contains(err.Error(), "pgoutbox migrate run with the poll configuration") {
			t.Fatalf("%s: %v, want a layout error naming %s and the fix", what, err, trigger)
		}
	}
	// The WAL source's migrate drops both triggers.
	if err := migrations.Apply(ctx, conn, migrations.Params{Tables: []string{"public.outbox"}, Publication: "outbox_pub"}); err != nil {
		t.Fatal(err)
	}
	wantRefused("Recheck after the WAL migrate", tb.Recheck(ctx, conn), migrations.KeepTrigger)
	wantRefused("Check after the WAL migrate", tb.Check(ctx, conn), migrations.KeepTruncateTrigger)

	if err := migrations.ApplyPoll(ctx, conn, poll1); err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatalf("Check after poll migrate ran again: %v", err)
	}
	if err := tb.Recheck(ctx, conn); err != nil {
		t.Fatalf("Recheck after poll migrate ran again: %v", err)
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE public.outbox DISABLE TRIGGER "+migrations.KeepTrigger); err != nil {
		t.Fatal(err)
	}
	wantRefused("Recheck with the trigger disabled", tb.Recheck(ctx, conn), migrations.KeepTrigger)
	if _, err := conn.Exec(ctx, "ALTER TABLE public.outbox ENABLE TRIGGER "+migrations.KeepTrigger+"; DROP TRIGGER "+migrations.KeepTruncateTrigger+" ON public.outbox"); err != nil {
		t.Fatal(err)
	}
	wantRefused("Check without the TRUNCATE trigger", tb.Check(ctx, conn), migrations.KeepTruncateTrigger)
}

// TestCheckRefusesInsteadRulesAndNamesBeforeInsertTriggers: a rule ON
// INSERT DO INSTEAD on the poll table (or a partition) sends the writers'
// rows elsewhere; pkg/outbox's Write returned their ids, and the poll
// relay started, read the empty table and published nothing, without a
// word (found by a review; the WAL source refused such rules already).
// Check now refuses it, naming the rule. A BEFORE INSERT row trigger may
// set published_at (the row born published) or return NULL: Check names
// it for the relay's warning, and so does it name where
// pgoutbox.delete_unpublished is on for every session (ALTER DATABASE or
// ROLE ... SET), which lets every delete past the keep trigger.
func TestCheckRefusesInsteadRulesAndNamesBeforeInsertTriggers(t *testing.T) {
	ctx := context.Background()
	conn := newDatabase(t)
	if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: "public.outbox"}); err != nil {
		t.Fatal(err)
	}
	tb, err := poll.NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil || len(tb.BeforeInsertTriggers()) != 0 {
		t.Fatalf("Check of the table poll migrate made: %v, BEFORE INSERT triggers %v", err, tb.BeforeInsertTriggers())
	}
	for _, sql := range []string{
		`CREATE TABLE public.outbox_archive (LIKE public.outbox)`,
		`CREATE RULE to_archive AS ON INSERT TO public.outbox DO INSTEAD INSERT INTO public.outbox_archive SELECT NEW.*`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	err = tb.Check(ctx, conn)
	if !errors.Is(err, poll.ErrLayout) || !strings.Contains(err.Error(), "public.outbox: to_archive") || !strings.Contains(err.Error(), "DROP RULE") {
		t.Fatalf("Check with a rule ON INSERT DO INSTEAD: %v, want a layout error naming the rule", err)
	}
	for _, sql := range []string{
		`DROP RULE to_archive ON public.outbox`,
		`CREATE FUNCTION born_published() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.published_at := now(); RETURN NEW; END$$`,
		`CREATE TRIGGER born_published BEFORE INSERT ON public.outbox FOR EACH ROW EXECUTE FUNCTION born_published()`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatalf("Check with a BEFORE INSERT trigger: %v", err)
	}
	if got := tb.BeforeInsertTriggers(); len(got) != 1 || got[0] != "public.outbox: born_published" {
		t.Fatalf("BEFORE INSERT triggers %v, want [public.outbox: born_published]", got)
	}
	if w := poll.BeforeInsertWarning(tb.Name, tb.BeforeInsertTriggers()); !strings.Contains(w, "born_published") || !strings.Contains(w, "published_at") {
		t.Fatalf("warning %q", w)
	}

	// pgoutbox.delete_unpublished on for every session of the database
	// lets every writer's delete past the keep trigger.
	if got := tb.DeleteUnpublishedSettings(); len(got) != 0 {
		t.Fatalf("delete_unpublished found on for %v before it was set", got)
	}
	if _, err := conn.Exec(ctx, `DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET pgoutbox.delete_unpublished = on', current_database()); END$$`); err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := tb.DeleteUnpublishedSettings(); len(got) != 1 || got[0] != "every role in this database" {
		t.Fatalf("delete_unpublished on for %v, want [every role in this database]", got)
	}
	if w := poll.DeleteUnpublishedWarning(tb.Name, tb.DeleteUnpublishedSettings()); !strings.Contains(w, "every role in this database") || !strings.Contains(w, "RESET") {
		t.Fatalf("warning %q", w)
	}
}
