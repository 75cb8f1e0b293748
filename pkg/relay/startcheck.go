package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// StartRefusal is the refusal of pgoutbox run's first session for what the
// slot's history says, judged on start as replication.Prepare (or
// replication.CheckStart, which reads the same and changes nothing) read
// it: a slot past the end of the server's WAL or past the fork of its
// timeline, table-less messages with another prefix than the one last
// relayed, a slot moved past the fence while no pgoutbox session held it
// (checkHistory at a first start). Nil when the start would go on. A slot
// another connection holds is not judged (the instance waits as standby).
func StartRefusal(start replication.Start, cfg Config) error {
	if start.Slot.Active {
		return nil
	}
	if err := historyRefusal(start, cfg); err != nil {
		return err
	}
	return fenceRefusal(start, cfg.Postgres)
}

// historyRefusal is checkHistory's refusal of a slot whose position or
// messages prefix does not fit this server's history (whatever the
// process remembers).
func historyRefusal(start replication.Start, cfg Config) error {
	slot, pcfg, prefix := start.Slot, cfg.Postgres, cfg.Messages.Prefix
	if err := leftBehindRefusal(start, cfg); err != nil {
		return err
	}
	if end := start.Identity.WALEnd; end != 0 && slot.ConfirmedFlushLSN > end {
		return &FatalError{Err: replication.SlotPastWALEndError(pcfg.Slot, slot.ConfirmedFlushLSN, end)}
	}
	if start.TimelineChanged() && start.ForkKnown && !start.Created && slot.ConfirmedFlushLSN > start.Fork {
		return &FatalError{Err: fmt.Errorf("%w: slot %q is confirmed up to %s, past %s, where this server left timeline %d for %d (a promotion or a restore): its position comes from the old timeline's WAL, and PostgreSQL would skip the transactions this timeline committed in between, which were never relayed; recreate the slot deliberately (pgoutbox migrate --recreate-slot) and relay the rows written on this timeline before its position from the outbox table",
			replication.ErrSlotAdvanced, pcfg.Slot, slot.ConfirmedFlushLSN, start.Fork, start.State.Timeline, start.Identity.Timeline)}
	}
	if was, now := start.State.MessagesPrefix, prefix; start.HadState && start.State.MessagesRecorded && was != "" && was != now &&
		!start.Created && start.State.AwaitingSnapshot == "" {
		// Messages belong to no table: nothing else records that some were
		// relayed, and a prefix no longer read skips them unseen.
		return &FatalError{Err: fmt.Errorf("relay: the last pgoutbox session on slot %q relayed table-less messages with prefix %q, and messages.prefix is now %q: messages written with %q since would be skipped, and the slot confirmed past them; set messages.prefix back, or, once no writer uses %q any more and its messages up to now are relayed, run `pgoutbox migrate --accept-catalog` with this configuration",
			pcfg.Slot, was, now, was, was)}
	}
	return nil
}

// leftBehindRefusal refuses a start while another slot, whose state row
// says it relayed one of this relay's outbox tables to the same Kafka
// cluster (or does not say where), is idle and confirmed below where this relay's
// slot started (replication.Start.StartedAt): the changes committed in
// between are in that slot only, and this one never sees them. That is a
// configuration moved to a new slot (postgres.slot.name changed, a Helm
// stream renamed) before the old slot's relay had caught up: a prober
// lost 50 of 150 events so, without a word, and pgoutbox cleanup then
// deleted their rows as relayed. A slot of another Kafka cluster (a
// region's) is another deployment's; one still streaming, or confirmed
// past this slot's start, keeps nothing from it.
func leftBehindRefusal(start replication.Start, cfg Config) error {
	o, ok := leftBehind(start, cfg)
	if !ok {
		return nil
	}
	at, pcfg := start.StartedAt(), cfg.Postgres
	what := o.What(cfg.Messages.Prefix)
	if o.Lost {
		return &FatalError{Err: fmt.Errorf("%w: slot %q, which state table %s records relaying %s, was invalidated by PostgreSQL (its WAL removed) at %s, before %s where slot %q started: the events committed in between were in it only, and are gone with it; relay the rows of %s committed in between from the table (table-less messages and rows deleted by their own transaction cannot be), then drop it: SELECT pg_drop_replication_slot(%s)",
			replication.ErrSlotLeftBehind, o.Slot, pcfg.StateTable, what, o.Confirmed, at, pcfg.Slot, strings.Join(o.Tables, ", "), quoteLiteral(o.Slot))}
	}
	return &FatalError{Err: fmt.Errorf("%w: slot %q, which state table %s records relaying %s, is idle at %s, before %s where slot %q started: the events committed in between are in slot %q only, and this relay would never send them (a configuration moved to a new slot, by postgres.slot.name or a renamed Helm stream, before the old relay had caught up). Run a relay on slot %q (postgres.slot.name: %s, and its publication and tables) until it has confirmed past %s (slot %q keeps what is written meanwhile), then stop it and start this one; if you stay on %q, drop slot %q, which keeps WAL. If every event slot %q holds reached Kafka another way or is not wanted (of every table it relays, not only these), drop it instead: SELECT pg_drop_replication_slot(%s)",
		replication.ErrSlotLeftBehind, o.Slot, pcfg.StateTable, what, o.Confirmed, at, pcfg.Slot, o.Slot,
		o.Slot, o.Slot, at, pcfg.Slot, o.Slot, pcfg.Slot, o.Slot, quoteLiteral(o.Slot))}
}

// LeftBehindSlot is the first slot leftBehindRefusal refuses a start
// for: pgoutbox cleanup refuses to delete by the slot's position while it
// is there (the rows of the gap were relayed by neither slot).
func LeftBehindSlot(start replication.Start, cfg Config) (replication.OtherSlot, bool) {
	return leftBehind(start, cfg)
}

// leftBehind returns the first slot leftBehindRefusal refuses a start for.
func leftBehind(start replication.Start, cfg Config) (replication.OtherSlot, bool) {
	at := start.StartedAt()
	if at == 0 || start.Slot.Name == "" && cfg.Snapshot.Mode == SnapshotInitial {
		// (validate, before an initial snapshot: its slot starts where
		// the snapshot ends, not known yet.)
		return replication.OtherSlot{}, false
	}
	kafka := cfg.walDestination().Kafka
	for _, o := range start.OtherSlots {
		if !o.Shares() || !o.Behind(at) {
			continue
		}
		if d, ok := parseDestination(o.Destination); ok && d.Kafka != kafka {
			continue
		}
		return o, true
	}
	return replication.OtherSlot{}, false
}

// FenceRefusal is the error pgoutbox run stops with for start's slot
// found past the recorded fence while no pgoutbox session held it; nil
// when run would go on (pgoutbox status lists it as a problem).
func FenceRefusal(start replication.Start, pcfg replication.Config) error {
	return fenceRefusal(start, pcfg)
}

// fenceRefusal is checkHistory's refusal of a slot found past the recorded
// fence while no pgoutbox session held it (replication.FencePassed); nil
// otherwise (the restart cases only warn).
func fenceRefusal(start replication.Start, pcfg replication.Config) error {
	if start.CheckFence() != replication.FencePassed {
		return nil
	}
	where := fmt.Sprintf("where the last pgoutbox session on it stopped (instance %s, started %s)", start.State.Instance, start.State.SessionStartedAt.UTC().Format(time.RFC3339))
	if start.State.Instance == "" {
		where = fmt.Sprintf("where pgoutbox first recorded it (%s), before any session streamed from it", start.State.SessionStartedAt.UTC().Format(time.RFC3339))
	}
	return &FatalError{Err: fmt.Errorf("%w: slot %q is at %s, past %s %s: it was advanced while no pgoutbox session held it (pg_replication_slot_advance, or another client streamed from it; or the database was put back to an earlier point with a later slot), and the events committed in between were skipped (pgoutbox cleanup is held); investigate, and if it was deliberate, clear the record and start again: UPDATE %s SET stopped_lsn = NULL WHERE slot_name = %s",
		replication.ErrSlotAdvanced, pcfg.Slot, start.Slot.ConfirmedFlushLSN, start.State.StoppedLSN, where, pcfg.StateTable, quoteLiteral(pcfg.Slot))}
}

// NotOutboxTableProblem is why the relay stops on a change of table (OID
// oid), which publication carries but which is not an outbox table
// (session.classify, for a publication that is not FOR ALL TABLES).
func NotOutboxTableProblem(table string, oid uint32, publication string) string {
	return fmt.Sprintf("table %s (OID %d) is in publication %q but is not an outbox table in postgres.table.include.list (nor a partition of one): add it there, or remove it from the publication (ALTER PUBLICATION ... DROP TABLE)",
		table, oid, publication)
}

// PollRowsRefusal refuses to make a WAL slot while a table of tables that
// the poll source relays (its keep trigger is on it and enabled:
// poll.MissingKeepTriggers) holds rows it has not published
// (published_at NULL) and no poll relay runs on it: a move from the poll
// source without snapshot.mode: initial, whose slot would start after
// those rows (a prober lost 20 of 50 events so). With poll relays
// running, a WAL relay beside them is another deployment's (publishing
// elsewhere), not a move. It is replication.Config.BeforeCreate for the
// relay, and pgoutbox migrate and validate judge with it.
func PollRowsRefusal(ctx context.Context, conn *pgx.Conn, slot string, tables []string) error {
	var left []string
	for _, t := range tables {
		n, err := unpublishedPollRows(ctx, conn, t)
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		members, err := poll.Members(ctx, conn, t)
		if err != nil {
			return err
		}
		if len(members) > 0 {
			continue
		}
		count := fmt.Sprintf("%d rows", n)
		if n >= maxCountedPollRows {
			count = "at least " + count
		}
		left = append(left, fmt.Sprintf("%s (%s)", t, count))
	}
	if len(left) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s, whose keep trigger %s says the poll source relays it, holds rows with published_at NULL, no poll relay runs on it, and slot %q does not exist: a slot made now starts after those rows, so the WAL source would never relay them. Move from the poll source as the README's \"Moving between the sources\" says: start the WAL source with snapshot.mode: initial and snapshot.rows: unpublished, which publishes them and then makes the slot (or let the poll relays publish them first). A WAL relay meant to run beside the poll source (publishing elsewhere) starts while the poll relays run",
		replication.ErrPollRowsUnpublished, strings.Join(left, ", "), migrations.KeepTrigger, slot)
}

// maxCountedPollRows bounds the count of unpublished rows a refusal gives.
const maxCountedPollRows = 10000

// unpublishedPollRows counts, up to maxCountedPollRows, the rows of table
// (schema-qualified) with published_at NULL when the poll source relays
// it; 0 when it does not.
func unpublishedPollRows(ctx context.Context, conn *pgx.Conn, table string) (int, error) {
	quoted, err := migrations.Ident(table)
	if err != nil {
		return 0, err
	}
	missing, err := poll.MissingKeepTriggers(ctx, conn, quoted)
	if err != nil || slices.Contains(missing, migrations.KeepTrigger) {
		return 0, err
	}
	var n int
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT FROM %s WHERE %s IS NULL LIMIT %d) u`, quoted, poll.ColumnPublishedAt, maxCountedPollRows)).Scan(&n)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42703" { // undefined_column: a trigger of that name, but no poll table
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("relay: count the rows of %s the poll source has not published: %w", table, err)
	}
	return n, nil
}
