package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// ErrCatalogUnusable is wrapped by Prepare's error when the publication or an
// outbox table is set up so that inserts would not reach the stream (or not
// all of them): streaming from it would lose events silently.
var ErrCatalogUnusable = errors.New("replication: the publication or an outbox table would keep events out of the stream")

// CatalogError lists what is wrong with the publication or the outbox
// tables, each with its fix. It wraps ErrCatalogUnusable at start-up and
// ErrCatalogChanged while streaming.
type CatalogError struct {
	Publication string
	Problems    []string
	Err         error
}

func (e *CatalogError) Error() string {
	verb := "cannot stream from"
	if errors.Is(e.Err, ErrCatalogChanged) {
		verb = "stopped streaming from"
	}
	return fmt.Sprintf("replication: %s publication %q: %s", verb, e.Publication, strings.Join(e.Problems, "; "))
}

func (e *CatalogError) Unwrap() error { return e.Err }

// Start is what a session starts from: the slot, the catalog as it was when
// the session started (the relay compares later reads against it), the
// server's identity, and the relay's history of the slot.
type Start struct {
	Slot     SlotState
	Catalog  Catalog
	Identity ServerIdentity
	// State is the history as read before this start; HadState is false
	// when there was none (a first start, or history turned off).
	State    State
	HadState bool
	// Created says that Prepare created the slot.
	Created bool
	// Fork is where the timeline the state table recorded (the last
	// session's) ended in the history of the server's timeline, when they
	// differ (TimelineChanged): past it, the WAL the last session read is
	// not this server's. ForkKnown is false when the recorded timeline is
	// not in that history at all.
	Fork      LSN
	ForkKnown bool
	// OtherPrefixes: the messages.prefix other slots of the database relay
	// with, by prefix their names (RelayedPrefixes; nil when not read).
	OtherPrefixes map[string]string
	// OtherSlots: the other slots of the database, still there, whose
	// last pgoutbox session relayed one of the outbox tables (OtherSlots;
	// nil without a state table).
	OtherSlots []OtherSlot
}

// TimelineChanged says the server is on another timeline than the one the
// state table recorded for the last session (a promotion or a restore).
func (s *Start) TimelineChanged() bool {
	return s.HadState && s.State.Timeline != 0 && s.Identity.Timeline != s.State.Timeline
}

// Prepare checks the server and makes sure the publication and slot exist,
// creating them when configured to, and reads the catalog the session will
// be held to. With a state table (postgres.state.table) it also keeps the
// slot's history: a slot that is missing although the history says pgoutbox
// used it is ErrSlotVanished, never silently replaced; a slot it creates or
// finds is recorded. It uses an ordinary (non-replication) connection that
// it closes before returning.
func Prepare(ctx context.Context, cfg Config, log *zap.Logger) (Start, error) {
	var st Start
	if err := cfg.Validate(); err != nil {
		return st, err
	}
	conn, err := connectSQL(ctx, cfg)
	if err != nil {
		return st, err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return st, fmt.Errorf("replication: read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return st, fmt.Errorf("replication: wal_level is %q, logical decoding needs 'logical': set wal_level = logical in postgresql.conf and restart PostgreSQL", walLevel)
	}
	if err := ensurePublication(ctx, conn, cfg, log); err != nil {
		return st, err
	}
	if st.Catalog, err = ReadCatalog(ctx, conn, cfg); err != nil {
		return st, err
	}
	p := st.Catalog.Problems(cfg)
	if shared := SharedPublication(ctx, conn, cfg, &st.Catalog, p); shared != "" {
		// First: the other fixes would stop the other relay, or send its
		// events to this one's topics.
		p = append([]string{shared}, p...)
	}
	if len(p) > 0 {
		if other := otherSpellings(ctx, conn, cfg.QualifiedTables()); other != "" {
			p = append(p, other)
		}
		return st, &CatalogError{Publication: cfg.Publication, Problems: p, Err: ErrCatalogUnusable}
	}
	for _, t := range st.Catalog.Tables {
		if len(t.BeforeInsert) > 0 {
			log.Warn("outbox table "+t.Name+" has BEFORE INSERT row triggers: one that returns NULL keeps the row out of the table and of the WAL, and pgoutbox cannot see such an event (pkg/outbox's writer fails a write that inserted fewer rows than it had events)",
				zap.String("table", t.Name), zap.Strings("triggers", t.BeforeInsert))
		}
	}
	if st.Catalog.Partitioned() && !st.Catalog.ViaRoot {
		log.Warn("the publication reports changes under each partition's name (publish_via_partition_root is off); pgoutbox maps them to their outbox table, but a partition created and dropped while pgoutbox is stopped cannot be mapped: turn it on while pgoutbox is stopped and caught up",
			zap.String("publication", cfg.Publication),
			zap.String("fix", fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", quoteIdent(cfg.Publication))))
	}
	if st.Identity, err = ReadServerIdentity(ctx, conn); err != nil {
		return st, err
	}
	if cfg.StateTable != "" {
		if err := EnsureStateTable(ctx, conn, cfg.StateTable); err != nil {
			return st, err
		}
		if st.State, st.HadState, err = ReadState(ctx, conn, cfg.StateTable, cfg.Slot); err != nil {
			return st, err
		}
		if st.OtherPrefixes, err = RelayedPrefixes(ctx, conn, cfg.StateTable, cfg.Slot); err != nil {
			// Only the log's wording depends on it (other messages).
			log.Debug("could not read which prefixes other slots relay", zap.Error(err))
			st.OtherPrefixes = nil
		}
		// What changed since the last session (StateChanges, StateRefusal:
		// pgoutbox validate judges the same through CheckStart).
		changes, unknown, err := StateChanges(ctx, conn, cfg, &st)
		if err != nil {
			return st, err
		}
		for _, u := range unknown {
			log.Warn(u+"; pgoutbox cleanup is held until someone has looked", zap.String("state_table", cfg.StateTable))
			// The session records the partition as looked at: only
			// once the hold is there.
			if _, err := SetCleanupHold(ctx, conn, cfg.StateTable, cfg.Slot, u); err != nil {
				return st, fmt.Errorf("replication: hold pgoutbox cleanup for what could not be looked at (%s): %w", u, err)
			}
		}
		if err := StateRefusal(&st, cfg, changes); err != nil {
			// A table no longer configured is refused before anything is
			// skipped: no hold. After a change, the slot has passed the
			// events of the gap: cleanup, which deletes by its position,
			// is held from now on, not only once someone runs migrate
			// --accept-catalog.
			if errors.Is(err, ErrCatalogChanged) {
				if _, err := SetCleanupHold(ctx, conn, cfg.StateTable, cfg.Slot, CatalogChangedHold); err != nil {
					log.Warn("cannot hold pgoutbox cleanup: hold it (and any job that deletes outbox rows) yourself until the events of the gap are relayed", zap.Error(err))
				}
			}
			return st, err
		}
		if st.TimelineChanged() {
			// Unknown when the history cannot be read: only exactly-once
			// depends on it, and refuses then.
			if st.Fork, st.ForkKnown, err = TimelineFork(ctx, cfg, st.State.Timeline, st.Identity.Timeline); err != nil {
				log.Warn("cannot read the server's timeline history; where the recorded timeline ended is unknown", zap.Error(err))
				st.Fork, st.ForkKnown = 0, false
			}
		}
	}
	st.Slot, st.Created, err = ensureSlot(ctx, conn, cfg, st, log)
	if err != nil {
		return st, err
	}
	if st.Identity.WALEnd, err = ReadWALEnd(ctx, conn); err != nil {
		return st, err
	}
	if end := st.Identity.WALEnd; end != 0 && st.Slot.ConfirmedFlushLSN > end && !st.Created && cfg.StateTable != "" && st.HadState {
		return st, slotPastWALEnd(ctx, conn, cfg, st, log)
	}
	if cfg.StateTable != "" && st.HadState && st.State.StoppedLSN != 0 {
		// The fence read again after the slot: a session still running
		// raises it before it confirms, so a fence read before the slot
		// could trail what that session confirmed in between.
		fence, confirmed, err := readFence(ctx, conn, cfg.StateTable, cfg.Slot)
		if err != nil {
			return st, err
		}
		st.State.StoppedLSN = fence
		if confirmed != 0 {
			st.State.ConfirmedLSN = confirmed
		}
	}
	if cfg.StateTable != "" && cfg.HoldOnFencePassed && !st.Created && !st.Slot.Active {
		// (An active slot is another instance's, which keeps the fence
		// ahead of what it confirms.)
		if c := st.CheckFence(); c != FenceKept {
			// Events committed between the fence and the slot may have
			// been skipped: cleanup, which deletes by the slot's
			// position, is held until someone has looked.
			who := "pg_replication_slot_advance, or another client"
			if c == FencePassedByShutdown || c == FencePassedAfterRestart {
				who += ", or a pgoutbox version that confirmed the end of WAL as PostgreSQL shut down (this one never confirms past the fence)"
			}
			past := st.State.StoppedLSN
			if c == FenceStale {
				// Judged against what the old version's session recorded.
				who += ", or the pgoutbox version from before the fence that ran last, past its last record"
				past = st.State.ConfirmedLSN
			}
			why := fmt.Sprintf("slot %s was found at %s, past %s, the furthest the last pgoutbox session on it may have confirmed: something else moved it (%s), and events committed in between may never have been relayed",
				cfg.Slot, st.Slot.ConfirmedFlushLSN, past, who)
			if _, err := SetCleanupHold(ctx, conn, cfg.StateTable, cfg.Slot, why); err != nil {
				log.Warn("cannot hold pgoutbox cleanup: hold it (and any job that deletes outbox rows) yourself until the events between the positions are checked", zap.Error(err))
			}
			if c == FencePassed && st.State.Note != fenceRefusedNote {
				// The start is refused: no server restart since the last
				// session began, which would leave it unclear whether an
				// older version's shutdown moved the slot. A restart
				// later must not make that unclear again: the refusal is
				// recorded, and every start stays refused until
				// stopped_lsn is cleared.
				if err := noteFenceRefused(ctx, conn, cfg.StateTable, cfg.Slot, ""); err != nil {
					log.Warn("cannot record in the state table that the slot was moved: after a PostgreSQL restart, a later start would only warn of it; do not start pgoutbox on this slot before you have looked", zap.Error(err))
				}
			}
		}
	}
	if cfg.StateTable != "" && st.HadState && st.State.Note == fenceRefusedNote && st.CheckFence() == FenceKept {
		// Cleared since (stopped_lsn): the note is history.
		st.State.Note = "the slot was found moved past the fence once; starts were refused until stopped_lsn was cleared"
		if err := noteFenceRefused(ctx, conn, cfg.StateTable, cfg.Slot, st.State.Note); err != nil {
			return st, err
		}
	}
	if cfg.StateTable != "" && (st.Created || !st.HadState) {
		s := State{Slot: cfg.Slot, SystemIdentifier: st.Identity.SystemIdentifier, Database: st.Identity.Database,
			Timeline: st.Identity.Timeline, ConfirmedLSN: st.Slot.ConfirmedFlushLSN, ConfirmedAt: time.Now(),
			Instance: "", SessionStartedAt: time.Now(), Note: "found the slot already there"}
		if st.Created {
			s.SlotCreatedAt, s.SlotCreatedLSN, s.Note = time.Now(), st.Slot.ConfirmedFlushLSN, "created by pgoutbox"
		}
		if !st.Slot.Active {
			// The fence from the first sight of the slot: no pgoutbox
			// session has confirmed anything on it yet, so a slot found
			// further on later (pg_replication_slot_advance, another
			// client, before the first session or between migrate and
			// run) was moved by someone else, and CheckFence, cleanup and
			// the poll handover refuse it. By the server's clock, as a
			// session's start (CheckFence compares it with the server's
			// start). A slot in use now is another client's, whose
			// confirmations are its own: no fence then.
			s.StoppedLSN = st.Slot.ConfirmedFlushLSN
			if err := conn.QueryRow(ctx, "SELECT now()").Scan(&s.SessionStartedAt); err != nil {
				return st, fmt.Errorf("replication: read the server's time: %w", err)
			}
		}
		s.SetCatalog(&st.Catalog)
		s.Publication = cfg.Publication
		write := WriteState // a slot made anew: its row is replaced
		if !st.HadState {
			write = WriteStateIfAbsent // another instance may have written it since
		}
		if err := write(ctx, conn, cfg.StateTable, s); err != nil {
			return st, err
		}
	}
	if err := readOtherSlots(ctx, conn, cfg, &st); err != nil {
		return st, err
	}
	if st.Created && cfg.StateTable != "" {
		// A slot made now starts at the present: an idle slot of another
		// relay of these tables (a Debezium connector's whose slot.name
		// this configuration does not name) keeps events it never sees.
		unknown, err := unknownIdleSlots(ctx, conn, cfg.StateTable, cfg.Slot, st.Slot.ConfirmedFlushLSN)
		if err != nil {
			log.Warn("could not read the other slots of the database", zap.Error(err))
		}
		for _, u := range unknown {
			log.Warn("another logical slot of this database, which pgoutbox does not know, is idle behind where the slot just made starts: if it is a relay's of these outbox tables (a Debezium connector's, say), the events it holds from its position on are not in the new slot; to move from it without losing them, stop here, drop the new slot and set postgres.slot.name to it (the connector JSON's slot.name): see the README's in-place migration from Debezium",
				zap.String("slot", cfg.Slot), zap.String("other_slot", u))
		}
	}
	return st, nil
}

// slotPastWALEnd handles a slot confirmed past the end of the server's WAL:
// a database put back to an earlier point (a disk snapshot, a
// crash-consistent copy, pg_rewind) with pg_replslot as it was. PostgreSQL
// would skip every transaction committed since, up to the slot's position.
// New WAL soon passes that position, and then nothing shows it any more:
// so the state row is made to refuse every later start too, through the
// fence (a fence below the slot, and the note that the fence was passed,
// which keeps the refusal strict whatever server restarts follow: its way
// on is to clear stopped_lsn once investigated), and cleanup is held.
func slotPastWALEnd(ctx context.Context, conn *pgx.Conn, cfg Config, st Start, log *zap.Logger) error {
	end := st.Identity.WALEnd
	why := fmt.Sprintf("slot %s was found confirmed up to %s, past %s, the end of the server's WAL: the database was put back to an earlier point (a restore, pg_rewind) with a slot from after it, and events committed since then up to the slot's position were skipped",
		cfg.Slot, st.Slot.ConfirmedFlushLSN, end)
	if _, err := SetCleanupHold(ctx, conn, cfg.StateTable, cfg.Slot, why); err != nil {
		log.Warn("cannot hold pgoutbox cleanup: hold it (and any job that deletes outbox rows) yourself until the events since the restore are relayed", zap.Error(err))
	}
	q, err := qualifiedIdent(cfg.StateTable)
	if err == nil {
		_, err = conn.Exec(ctx, `UPDATE `+q+` SET stopped_lsn = least(coalesce(stopped_lsn, $2::pg_lsn), $2::pg_lsn), session_started_at = now(), note = $3
			WHERE slot_name = $1`, cfg.Slot, end.String(), fenceRefusedNote)
	}
	if err != nil {
		log.Warn("cannot record in the state table that the slot's history is broken: a later start, once new WAL has passed the slot's position, will not see it; do not start pgoutbox on this slot before recreating it", zap.Error(err))
	}
	return fmt.Errorf("%w; the state table now refuses every start on this slot, and cleanup is held", SlotPastWALEndError(cfg.Slot, st.Slot.ConfirmedFlushLSN, end))
}

// fenceRefusedNote is the state row's note while starts are refused for a
// slot found past the fence (CheckFence says FencePassed, whatever
// restarts follow).
const fenceRefusedNote = "starts refused: the slot was found moved past the fence (or the database put back to an earlier point); clear stopped_lsn once investigated"

// noteFenceRefused sets the slot's note to fenceRefusedNote, or to note
// once it no longer holds.
func noteFenceRefused(ctx context.Context, conn *pgx.Conn, table, slot, note string) error {
	q, err := qualifiedIdent(table)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `UPDATE `+q+` SET note = $2 WHERE slot_name = $1`, slot, cmp.Or(note, fenceRefusedNote))
	return err
}

// SlotPastWALEndError is the error of slot found confirmed at at, past end,
// the end of the server's WAL (it wraps ErrSlotAdvanced).
func SlotPastWALEndError(slot string, at, end LSN) error {
	return fmt.Errorf("%w: slot %q is confirmed up to %s, past %s, the end of this server's WAL: the database was put back to an earlier point (a restore, pg_rewind) with a slot from after it, and PostgreSQL would skip the transactions committed since up to the slot's position, which were never relayed; check what was written since the restore, then recreate the slot deliberately (pgoutbox migrate --recreate-slot) and relay the missing rows from the outbox table",
		ErrSlotAdvanced, slot, at, end)
}

// shutdownCheckpointMax bounds the length of a shutdown checkpoint's WAL
// record (about 120 bytes, with a page header when it crosses a page).
const shutdownCheckpointMax = 512

// FenceCheck is what the slot's position says against the recorded fence
// (State.StoppedLSN).
type FenceCheck int

const (
	// FenceKept: the slot is not past the fence, or there is no fence.
	FenceKept FenceCheck = iota
	// FencePassedByShutdown: past it by exactly PostgreSQL's shutdown
	// checkpoint, as earlier pgoutbox versions left a slot when they
	// confirmed the end of WAL as the server stopped (the connection the
	// fence is raised on was refused then). This version never confirms
	// past the fence, so that may also be someone who advanced the slot to
	// the end of WAL after the restart.
	FencePassedByShutdown
	// FencePassedAfterRestart: past it, and the server restarted since the
	// last session began, but its latest checkpoint no longer tells
	// whether that shutdown (with an earlier version) or someone else
	// moved the slot.
	FencePassedAfterRestart
	// FencePassed: moved by someone else while pgoutbox was stopped.
	FencePassed
	// FenceStale: past it, but the state row records a session that
	// confirmed past it too (its confirmed_lsn is above the fence): a
	// pgoutbox version from before the fence ran on the slot after the
	// session that wrote it (a rollback), which this version's sessions
	// never do (they raise the fence before they confirm past it). That
	// version confirmed past its own record every few seconds, so a slot
	// past the record may be its doing or someone else's: warned of, not
	// refused. Before, every start after such a rollback was refused, and
	// so every later one (an outage with nothing lost).
	FenceStale
)

// CheckFence compares the slot with the fence of the last session: the
// slot moves only when a client confirms, and a session records the
// furthest its process may confirm before it confirms it.
func (s Start) CheckFence() FenceCheck {
	fence, at := s.State.StoppedLSN, s.Slot.ConfirmedFlushLSN
	if !s.HadState || !s.State.FencePassedBy(at) {
		return FenceKept
	}
	if s.State.FenceStale() {
		if at <= s.State.ConfirmedLSN {
			return FenceKept // where that session recorded it
		}
		return FenceStale
	}
	if !s.Identity.StartedAt.After(s.State.SessionStartedAt) || s.State.Note == fenceRefusedNote {
		return FencePassed
	}
	// PostgreSQL 17 and later have the slot confirmed up to the shutdown
	// checkpoint before they write it, and save it there; earlier
	// versions save it only now and then, so it may end after the
	// checkpoint record, or anywhere before it.
	if ckpt := s.Identity.CheckpointLSN; ckpt >= fence && at >= ckpt && at-ckpt <= shutdownCheckpointMax {
		return FencePassedByShutdown
	}
	return FencePassedAfterRestart
}

func connectSQL(ctx context.Context, cfg Config) (*pgx.Conn, error) {
	return ConnectSQL(ctx, cfg, "", cfg.ConnectTimeout)
}

// CreatePublicationSQL is the statement that creates the publication for
// cfg: FOR TABLE the outbox tables (or FOR ALL TABLES), inserts only, and
// changes of partitions reported under their partitioned table's name.
func CreatePublicationSQL(cfg Config) string {
	sql := "CREATE PUBLICATION " + quoteIdent(cfg.Publication)
	if cfg.PublicationAutocreate == PublicationAllTables {
		sql += " FOR ALL TABLES"
	} else {
		quoted := make([]string, 0, len(cfg.Tables))
		for _, t := range cfg.QualifiedTables() {
			quoted = append(quoted, quoteTable(t))
		}
		if len(quoted) > 0 { // none: a table-less outbox needs only messages
			sql += " FOR TABLE " + strings.Join(quoted, ", ")
		}
	}
	return sql + " WITH (publish = 'insert', publish_via_partition_root = true)"
}

// ensurePublication creates cfg's publication unless it exists (what it
// holds is judged afterwards, by the catalog's checks, as for one that
// existed).
func ensurePublication(ctx context.Context, conn *pgx.Conn, cfg Config, log *zap.Logger) error {
	for raced := false; ; raced = true {
		err := createPublication(ctx, conn, cfg, log)
		if raced || !CreatedConcurrently(err) {
			return err
		}
		// Another instance starting at the same moment made it (a
		// concurrent CREATE PUBLICATION fails with 23505 or 42710):
		// look again, and go on as with one that existed.
	}
}

func createPublication(ctx context.Context, conn *pgx.Conn, cfg Config, log *zap.Logger) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", cfg.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("replication: read publication %q: %w", cfg.Publication, err)
	}
	if exists {
		return nil
	}
	if cfg.PublicationAutocreate == PublicationDisabled {
		return fmt.Errorf("%w: %q; create it with %s, or set publication.autocreate.mode=filtered",
			ErrPublicationMissing, cfg.Publication, CreatePublicationSQL(Config{Publication: cfg.Publication, Tables: cfg.Tables}))
	}
	if err := PublicationAfterSlot(ctx, conn, cfg); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, CreatePublicationSQL(cfg)); err != nil {
		var pe *pgconn.PgError
		switch {
		case errors.As(err, &pe) && pe.Code == "42P01": // undefined_table
			if other := otherSpellings(ctx, conn, cfg.QualifiedTables()); other != "" {
				return fmt.Errorf("replication: create publication %q: %w; %s", cfg.Publication, err, other)
			}
			return fmt.Errorf("replication: create publication %q: %w; create the outbox table (pgoutbox migrate) or correct postgres.table.include.list", cfg.Publication, err)
		case errors.As(err, &pe) && pe.Code == "42501": // insufficient_privilege
			return fmt.Errorf("replication: create publication %q: %w; create the publication as the tables' owner (pgoutbox migrate), or give this role CREATE on the database and ownership of the tables", cfg.Publication, err)
		}
		return fmt.Errorf("replication: create publication %q: %w", cfg.Publication, err)
	}
	log.Info("created publication", zap.String("publication", cfg.Publication), zap.Strings("tables", cfg.QualifiedTables()), zap.String("mode", cfg.PublicationAutocreate))
	return nil
}

// PublicationAfterSlot refuses to make cfg's publication (missing) when its
// slot exists already: a slot made before its publication cannot decode
// what was written between the two with it (PostgreSQL 15-17 fail on those
// changes; 18 skips them with a warning in the server's log only), so
// making the publication now would hide that window. pgoutbox run and
// pgoutbox migrate ask it before they make the publication. (A lost slot is
// left to the start's own refusal of it.)
func PublicationAfterSlot(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	var slotAt *string
	err := conn.QueryRow(ctx, `SELECT s.confirmed_flush_lsn::text FROM pg_replication_slots s
		WHERE s.slot_name = $1 AND s.database = current_database() AND s.wal_status IS DISTINCT FROM 'lost'
		AND NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2)`, cfg.Slot, cfg.Publication).Scan(&slotAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replication: read slot %q: %w", cfg.Slot, err)
	}
	return fmt.Errorf("%w: %q, and slot %q exists already (confirmed at %s): a publication made now is not seen by the changes written between the slot's position and it (PostgreSQL 18 skips them with a warning in its log only; 15-17 fail on them), so outbox events written there would never be relayed, and pgoutbox does not make it; find the rows written since the slot was made in the outbox tables, then either drop the slot and let pgoutbox make the publication and then the slot (relaying those rows yourself), or create the publication yourself (%s) and, if none of those rows is left to relay, move the slot past it (SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn()); a slot pgoutbox streamed from is refused at the next start until its state row is cleared as that start says)",
		ErrPublicationMissing, cfg.Publication, cfg.Slot, deref(slotAt), CreatePublicationSQL(cfg), quoteLiteral(cfg.Slot))
}

// ReadSlot reads the slot's row from pg_replication_slots.
func ReadSlot(ctx context.Context, conn *pgx.Conn, slot string) (SlotState, error) {
	r, err := ReadSlotReport(ctx, conn, slot)
	return r.State(), err
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// VanishedError is ErrSlotVanished with what the history says.
type VanishedError struct {
	Slot  string
	State State
}

func (e *VanishedError) Error() string {
	s := e.State
	return fmt.Sprintf("%v: slot %q does not exist, but pgoutbox used it on this database (last recorded confirmed position %s at %s, by %s); "+
		"events committed after that position may be lost (the slot was dropped by someone, expired, or lost in a database failover). "+
		"pgoutbox will not create a new slot by itself: find out what happened, then run `pgoutbox migrate --recreate-slot`, which records the gap and creates a new slot "+
		"(with snapshot.mode: initial it leaves the slot to the next start, whose snapshot publishes the rows the outbox tables hold), "+
		"and then relay what is still missing from before the new slot (rows still in the outbox table can be read from it)",
		ErrSlotVanished, e.Slot, s.ConfirmedLSN, s.ConfirmedAt.UTC().Format(time.RFC3339), instanceName(s.Instance))
}

func (e *VanishedError) Unwrap() error { return ErrSlotVanished }

func instanceName(s string) string {
	if s == "" {
		return "pgoutbox migrate"
	}
	return "instance " + s
}

func ensureSlot(ctx context.Context, conn *pgx.Conn, cfg Config, st Start, log *zap.Logger) (SlotState, bool, error) {
	created := false
	s, err := ReadSlot(ctx, conn, cfg.Slot)
	if errors.Is(err, ErrSlotMissing) {
		switch {
		case st.HadState && !cfg.RecreateVanishedSlot:
			return s, false, &VanishedError{Slot: cfg.Slot, State: st.State}
		case !cfg.CreateSlot:
			return s, false, fmt.Errorf("%w: %q; create it with SELECT pg_create_logical_replication_slot('%s', 'pgoutput'), or set slot.create=true", ErrSlotMissing, cfg.Slot, cfg.Slot)
		}
		if cfg.BeforeCreate != nil && !cfg.RecreateVanishedSlot {
			if err := cfg.BeforeCreate(ctx, conn); err != nil {
				return s, false, err
			}
		}
		create := "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
		if cfg.SlotFailover {
			if err := failoverSupported(st.Identity); err != nil {
				return s, false, err
			}
			create = "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
		}
		log.Info("creating the replication slot; PostgreSQL waits for the transactions open now to end first", zap.String("slot", cfg.Slot))
		if _, err := conn.Exec(ctx, create, cfg.Slot); err != nil {
			var pe *pgconn.PgError
			// 42710: another instance created it at the same moment; use it.
			switch {
			case errors.As(err, &pe) && pe.Code == "42710":
			case errors.As(err, &pe) && pe.Code == "42501":
				return s, false, fmt.Errorf("replication: create slot %q on %s: %w; give the role the REPLICATION attribute (ALTER ROLE %s REPLICATION), or use a role that has it",
					cfg.Slot, target(&conn.Config().Config), err, quoteIdent(conn.Config().User))
			default:
				return s, false, fmt.Errorf("replication: create slot %q on %s: %w", cfg.Slot, target(&conn.Config().Config), err)
			}
		} else {
			created = true
			log.Info("created replication slot", zap.String("slot", cfg.Slot), zap.String("plugin", "pgoutput"))
		}
		s, err = ReadSlot(ctx, conn, cfg.Slot)
	}
	if err != nil {
		return s, false, err
	}
	switch {
	case s.SlotType != "logical":
		return s, false, fmt.Errorf("replication: slot %q is a %s slot; pgoutbox needs a logical slot with plugin pgoutput", cfg.Slot, s.SlotType)
	case s.Plugin != "pgoutput":
		return s, false, fmt.Errorf("replication: slot %q uses plugin %q; pgoutbox needs pgoutput: drop it or choose another slot.name", cfg.Slot, s.Plugin)
	case s.TwoPhase:
		// pgoutput keeps a slot's two_phase for every client: it would
		// send BEGIN PREPARE, PREPARE and COMMIT PREPARED, which protocol
		// version 1 does not have and pgoutbox does not read.
		return s, false, fmt.Errorf("%w: slot %q was created with two_phase on: PostgreSQL then decodes each prepared transaction (PREPARE TRANSACTION) at its PREPARE, in messages pgoutbox does not read; use a slot made without it: choose another slot.name (pgoutbox creates its own without two_phase), and drop this one once nothing is left to relay from it", ErrSlotUnusable, cfg.Slot)
	case s.Database != st.Identity.Database && st.Identity.Database != "":
		return s, false, fmt.Errorf("replication: slot %q belongs to database %q, not %q", cfg.Slot, s.Database, st.Identity.Database)
	case s.WALStatus == "lost" || s.InvalidationReason != "":
		why := "the WAL it needed was removed"
		if s.InvalidationReason != "" {
			why = "PostgreSQL invalidated it (invalidation_reason " + s.InvalidationReason + ")"
		}
		return s, false, fmt.Errorf("%w: slot %q: %s and events may be gone; investigate, then drop and recreate the slot deliberately", ErrSlotLost, cfg.Slot, why)
	}
	if cfg.SlotFailover && !s.Failover {
		if err := failoverSupported(st.Identity); err != nil {
			return s, false, err
		}
		if err := alterSlotFailover(ctx, cfg); err != nil {
			return s, false, err
		}
		log.Info("made the slot a failover slot", zap.String("slot", cfg.Slot))
		s.Failover = true
	}
	return s, created, nil
}

// failoverSupported says whether the server can keep failover slots.
func failoverSupported(id ServerIdentity) error {
	if id.VersionNum != 0 && id.VersionNum < 170000 {
		return fmt.Errorf("replication: postgres.slot.failover needs PostgreSQL 17 or later, and this server is %d.%d: before 17 no standby keeps a copy of a logical slot, so a promotion loses it (pgoutbox then stops: see the README's Database failover section); upgrade, or turn slot.failover off",
			id.VersionNum/10000, id.VersionNum%10000)
	}
	return nil
}

// alterSlotFailover turns an existing slot into a failover slot; only the
// replication protocol has the command.
func alterSlotFailover(ctx context.Context, cfg Config) error {
	conn, err := connectReplication(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The slot name is checked to be lower-case letters, digits and
	// underscores, so it needs no quoting.
	if _, err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+cfg.Slot+" ( FAILOVER true )").ReadAll(); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55006" {
			return fmt.Errorf("%w: slot %q: %s (it cannot be made a failover slot while in use)", ErrSlotInUse, cfg.Slot, pe.Message)
		}
		return fmt.Errorf("replication: make slot %q a failover slot: %w", cfg.Slot, err)
	}
	return nil
}

// otherSpellings names the tables whose schema and name differ only in
// case from a configured outbox table that does not exist ("" when there
// are none, or they cannot be read): Debezium matches table.include.list
// in either case, so a connector JSON that names public.Outbox worked
// there for public.outbox, and pgoutbox's "does not exist, create it"
// alone sent its user to make a second table.
func otherSpellings(ctx context.Context, conn *pgx.Conn, names []string) string {
	var found []string
	for _, name := range names {
		schema, table, err := splitTable(name)
		if err != nil {
			continue
		}
		rows, err := conn.Query(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE lower(n.nspname) = lower($1) AND lower(c.relname) = lower($2) AND c.relkind IN ('r', 'p')
			AND NOT (n.nspname = $1 AND c.relname = $2) AND NOT EXISTS (SELECT 1 FROM pg_class c2 JOIN pg_namespace n2 ON n2.oid = c2.relnamespace WHERE n2.nspname = $1 AND c2.relname = $2)
			ORDER BY 1`, schema, table)
		if err != nil {
			return ""
		}
		others, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return ""
		}
		for _, o := range others {
			found = append(found, fmt.Sprintf("%s names no table, and %s is spelt otherwise", name, o))
		}
	}
	if len(found) == 0 {
		return ""
	}
	return strings.Join(found, "; ") + ": PostgreSQL tells names apart by case (Debezium matches table.include.list in either case); list each outbox table as it is spelt"
}
