package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// The poll source's parts of migrate, status and validate
// (relay.source: poll): the outbox table itself is what they look at,
// not a slot and a publication.

func isPoll(cfg fileConfig) bool { return cfg.Relay.Source == relay.SourcePoll }

// pollParams are the poll migration's parameters for cfg.
func pollParams(cfg fileConfig) (migrations.PollParams, error) {
	if err := cfg.Poll.Validate(); err != nil {
		return migrations.PollParams{}, err
	}
	t, err := cfg.PollTable()
	if err != nil {
		return migrations.PollParams{}, err
	}
	return migrations.PollParams{Table: t.Name, Notify: cfg.Poll.Notify, Channel: cfg.Poll.Channel(t.Name)}, nil
}

// renderPoll is the SQL of migratePoll, for migrate --print.
func renderPoll(cfg fileConfig) ([]string, error) {
	p, err := pollParams(cfg)
	if err != nil {
		return nil, err
	}
	return migrations.RenderPoll(p)
}

// pollMigrateFlags are migrate's flags for the poll source.
type pollMigrateFlags struct {
	lockTimeout  time.Duration
	acceptRelays bool // --accept-running-poll-relays
}

// migratePoll creates or completes the poll table, its indexes and (with
// poll.notify) its trigger, on cmdMigrate's connection. It refuses to
// install the keep trigger under running relays that delete on publish
// (keepTriggerAbsentUnderRelays).
func migratePoll(ctx context.Context, conn *pgx.Conn, cfg fileConfig, flags pollMigrateFlags, stdout, stderr io.Writer) int {
	p, err := pollParams(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	p.LockTimeout = flags.lockTimeout
	plan, err := migrations.PlanPoll(ctx, conn, p)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: migrate: %v\n", err)
		return exitRuntime
	}
	// Whatever this configuration's poll.on.publish: the running relays'
	// own may be delete (an upgrade that also switches to mark).
	if plan.TableExists && plan.KeepTrigger {
		members, err := keepTriggerAbsentUnderRelays(ctx, conn, p.Table)
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: migrate: %v\n", err)
			return exitRuntime
		}
		if len(members) > 0 {
			msg := fmt.Sprintf("%d poll relay session(s) run on %s now (%s), and the table has no trigger %s yet: relays of an earlier version that delete rows on publish (poll.on.publish=delete, whatever this configuration says) would have those deletes skipped by the trigger (each row stays unpublished and is resent forever)",
				len(members), p.Table, describeMembers(members), migrations.KeepTrigger)
			if !flags.acceptRelays {
				fmt.Fprintf(stderr, "pgoutbox: migrate: %s. Stop them, run migrate, then start this version; or run migrate --accept-running-poll-relays to go on anyway\n", msg)
				return exitRuntime
			}
			fmt.Fprintf(stderr, "pgoutbox: migrate: %s; going on (--accept-running-poll-relays)\n", msg)
		}
	}
	err = migrations.ApplyPoll(ctx, conn, p, migrations.OnLockWait(func(attempt int, le *migrations.LockError) {
		fmt.Fprintf(stderr, "pgoutbox: migrate: attempt %d of %d got no lock on %s within %s; trying again: %s\n",
			attempt, migrations.DefaultLockAttempts, p.Table, le.Timeout, lockHoldersLine(le.Holders))
	}))
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: migrate: %v\n", err)
		return exitRuntime
	}
	trigger := fmt.Sprintf("notification trigger %s on channel %q", migrations.NotifyTrigger, p.Channel)
	if !p.Notify {
		trigger = "no notification trigger (poll.notify is false): rows are claimed every poll.interval"
	}
	changed := "nothing was missing, and no lock was taken on the table"
	switch c := plan.Changes(); {
	case !plan.TableExists:
		changed = "table created"
	case len(c) > 0:
		changed = "added " + strings.Join(c, ", ")
	}
	fmt.Fprintf(stdout, "migrated %s for the poll source: columns, indexes, %s (%s)\n", p.Table, trigger, changed)
	return exitOK
}

// keepTriggerAbsentUnderRelays returns the poll relays on table when its
// keep trigger is missing or disabled (migrate would put it in force
// under them), nil otherwise.
func keepTriggerAbsentUnderRelays(ctx context.Context, conn *pgx.Conn, table string) ([]poll.Member, error) {
	quoted, err := migrations.Ident(table)
	if err != nil {
		return nil, err
	}
	missing, err := poll.MissingKeepTriggers(ctx, conn, quoted)
	if err != nil || !slices.Contains(missing, migrations.KeepTrigger) {
		return nil, err
	}
	return poll.Members(ctx, conn, table)
}

// describeMembers names poll relay sessions for people.
func describeMembers(ms []poll.Member) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		addr := m.ClientAddr
		if addr == "" {
			addr = "local socket"
		}
		out[i] = fmt.Sprintf("PID %d, application_name %q, client %s", m.PID, m.ApplicationName, addr)
	}
	return strings.Join(out, "; ")
}

func lockHoldersLine(hs []migrations.LockHolder) string {
	if len(hs) == 0 {
		return "no session holds a lock on it now"
	}
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.String()
	}
	return "held by " + strings.Join(out, "; ")
}

// pollStatus is the output of "pgoutbox status" with the poll source.
type pollStatus struct {
	Source  string       `json:"source"`
	Server  serverStatus `json:"server"`
	Table   pollTableSt  `json:"table"`
	Backlog *pollBacklog `json:"backlog"` // null when the table cannot be read
	// Instances are the relays on the table now (from pg_locks).
	Instances []poll.Member `json:"instances"`
	Problems  []string      `json:"problems"`
}

type pollTableSt struct {
	Name    string   `json:"name"`
	Exists  bool     `json:"exists"`
	Missing []string `json:"missing_columns"`
	// Trigger says whether the notification trigger exists (and is
	// enabled), Channel is the channel this configuration listens on.
	Trigger bool   `json:"notify_trigger"`
	Channel string `json:"notify_channel"`
	Buckets int    `json:"buckets"`
	// MissingKeep are the triggers that keep unpublished rows (from
	// deletes, from TRUNCATE) that the table lacks or has disabled.
	MissingKeep []string `json:"missing_keep_triggers"`
	// NotAlwaysKeep are the keep triggers that fire in origin mode only
	// (poll.KeepTriggersNotAlways): a warning, not a problem.
	NotAlwaysKeep []string `json:"keep_triggers_not_always"`
	// Recorded is the table the relays checked last under the name, as
	// recorded (null: none, or the record cannot be read).
	Recorded *pollRecorded `json:"recorded"`
}

// pollRecorded is the record of the table checked last (poll.Recorded).
type pollRecorded struct {
	OID       uint32    `json:"oid"`
	CheckedAt time.Time `json:"checked_at"`
	// Elsewhere: recorded in another cluster or database, not used.
	Elsewhere bool `json:"elsewhere"`
	// Now says what became of it when the name names another table ("":
	// the name names it).
	Now string `json:"now"`
}

type pollBacklog struct {
	Unpublished int64 `json:"unpublished_rows"`
	Failed      int64 `json:"failed_rows"`
	// OldestAgeSeconds is null when the table has no created_at column.
	OldestAgeSeconds *float64 `json:"oldest_unpublished_age_s"`
}

// statusPoll is "pgoutbox status" for the poll source, on cmdStatus's
// connection.
func statusPoll(ctx context.Context, conn *pgx.Conn, target pgTarget, cfg fileConfig, format string, stdout, stderr io.Writer) int {
	t, err := cfg.PollTable()
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	st, err := readPollStatus(ctx, conn, target, cfg, t)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: read status: %s\n", oneLine(err))
		return exitRuntime
	}
	if !writeStatus(stdout, stderr, format, st, func(w io.Writer) { writePollStatus(w, st) }) {
		return exitRuntime
	}
	if len(st.Problems) > 0 {
		fmt.Fprintf(stderr, "pgoutbox: %d problem(s) keep the poll source from relaying every event; see \"problems\" above\n", len(st.Problems))
		return exitRuntime
	}
	return exitOK
}

func readPollStatus(ctx context.Context, conn *pgx.Conn, target pgTarget, cfg fileConfig, t *poll.Table) (pollStatus, error) {
	st := pollStatus{Source: relay.SourcePoll, Server: serverStatus{Address: target.Address, User: target.User},
		Table: pollTableSt{Name: t.Name, Missing: []string{}, MissingKeep: []string{}, NotAlwaysKeep: []string{}, Channel: cfg.Poll.Channel(t.Name), Buckets: cfg.Poll.Buckets}, Instances: []poll.Member{}, Problems: []string{}}
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num')::int, current_database(), current_user, pg_is_in_recovery()`).Scan(
		&st.Server.Version, &st.Server.VersionNum, &st.Server.Database, &st.Server.User, &st.Server.InRecovery)
	if err != nil {
		return st, fmt.Errorf("server version: %w", err)
	}
	// Before Check, which takes the table the name names.
	if err := readPollRecorded(ctx, conn, t, &st); err != nil {
		return st, err
	}
	cols, err := poll.Columns(ctx, conn, t.Name)
	if err != nil {
		return st, err
	}
	st.Table.Exists = len(cols) > 0
	for _, c := range poll.RequiredColumns {
		if !slices.Contains(cols, c) {
			st.Table.Missing = append(st.Table.Missing, c)
		}
	}
	switch {
	case !st.Table.Exists:
		st.Problems = append(st.Problems, fmt.Sprintf("table %s does not exist: create it with pgoutbox migrate (relay.source=poll)", t.Name))
		return st, nil
	case len(st.Table.Missing) > 0:
		st.Problems = append(st.Problems, fmt.Sprintf("table %s lacks the poll columns %s: add them with pgoutbox migrate (relay.source=poll)", t.Name, strings.Join(st.Table.Missing, ", ")))
		return st, nil
	}
	if st.Table.Trigger, err = hasNotifyTrigger(ctx, conn, t.Quoted()); err != nil {
		return st, err
	}
	if cfg.Poll.Notify && !st.Table.Trigger {
		st.Problems = append(st.Problems, fmt.Sprintf("table %s has no notification trigger although poll.notify is true: claims wait for poll.interval; create it with pgoutbox migrate", t.Name))
	}
	missingKeep, err := poll.MissingKeepTriggers(ctx, conn, t.Quoted())
	if err != nil {
		return st, err
	}
	if len(missingKeep) > 0 {
		st.Table.MissingKeep = missingKeep
		// The relay refuses the table (Check below would say so as an
		// error): say it as a problem, with the rest of the status.
		st.Problems = append(st.Problems, keepTriggersProblem(t.Name, st.Table.MissingKeep))
		return st, nil
	}
	if err := t.Check(ctx, conn); err != nil {
		return st, err
	}
	if names := t.KeepTriggersNotAlways(); len(names) > 0 {
		st.Table.NotAlwaysKeep = names
	}
	b, err := poll.ReadBacklog(ctx, conn, t)
	if err != nil {
		return st, err
	}
	st.Backlog = &pollBacklog{Unpublished: b.Unpublished, Failed: b.Attempted}
	if b.OldestKnown {
		age := b.OldestAge.Seconds()
		st.Backlog.OldestAgeSeconds = &age
	}
	if st.Instances, err = poll.Members(ctx, conn, t.Name); err != nil {
		return st, err
	}
	if st.Instances == nil {
		st.Instances = []poll.Member{}
	}
	return st, nil
}

// readPollRecorded reads the record of the table checked last under t's
// name into st, and what became of that table: one renamed away with
// unpublished rows is a problem (the relay refuses to start). A record
// this role may not read is left out.
func readPollRecorded(ctx context.Context, conn *pgx.Conn, t *poll.Table, st *pollStatus) error {
	rec, err := t.LoadRecord(ctx, conn)
	if errors.Is(err, poll.ErrUnrecorded) || (err == nil && !rec.Found) {
		return nil
	}
	if err != nil {
		return err
	}
	st.Table.Recorded = &pollRecorded{OID: rec.OID, CheckedAt: rec.CheckedAt, Elsewhere: rec.Elsewhere}
	re, err := t.Replaced(ctx, conn)
	if err != nil || re == nil {
		return err
	}
	st.Table.Recorded.Now = re.Error()
	if re.Unpublished != 0 && !re.Within {
		st.Problems = append(st.Problems, re.Error())
	}
	return nil
}

// keepTriggersNote is what migrate --print for the WAL source says of the
// poll source's keep triggers it drops.
func keepTriggersNote(tables []string) string {
	return fmt.Sprintf("-- NOTE: this drops the poll source's triggers %s and %s from %s where they exist: a row deleted before the poll source published it is deleted then (the delete-after-insert mode needs that), so a poll relay started on the table again would lose the events of such rows; pgoutbox migrate with relay.source=poll puts them back, and the poll relay refuses to start without them.",
		migrations.KeepTrigger, migrations.KeepTruncateTrigger, strings.NewReplacer("\r", " ", "\n", " ").Replace(strings.Join(tables, ", ")))
}

// dropsKeepTriggers is run before migrate for the WAL source, which drops
// the poll source's keep triggers from its tables: it refuses while a poll
// relay runs on one of them (the triggers are what keeps that relay's
// events from a writer's delete), and otherwise returns the tables that
// have them, which migrate then names.
// pollRowsLeft refuses migrate with the WAL source (and validate judges
// the start) as relay.PollRowsRefusal does run's creation of the slot:
// while the poll source's tables hold rows it has not published, no poll
// relay runs on them, and the slot, which migrate or run would make, does
// not exist. In migrate, before it drops the keep triggers, which tell
// that the poll source relays a table. With snapshot.mode: initial,
// pgoutbox run publishes those rows before it makes the slot.
func pollRowsLeft(ctx context.Context, conn *pgx.Conn, cfg fileConfig) error {
	if !cfg.Postgres.CreateSlot || cfg.Snapshot.Mode == relay.SnapshotInitial {
		return nil
	}
	if _, err := replication.ReadSlot(ctx, conn, cfg.Postgres.Slot); !errors.Is(err, replication.ErrSlotMissing) {
		return nil // there (or unreadable: Prepare says so)
	}
	return relay.PollRowsRefusal(ctx, conn, cfg.Postgres.Slot, cfg.Postgres.QualifiedTables())
}

func dropsKeepTriggers(ctx context.Context, conn *pgx.Conn, tables []string) ([]string, error) {
	var having []string
	for _, table := range tables {
		quoted, err := migrations.Ident(table)
		if err != nil {
			return nil, err
		}
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", quoted).Scan(&exists); err != nil {
			return nil, fmt.Errorf("look up %s: %w", table, err)
		}
		if !exists {
			continue
		}
		missing, err := poll.MissingKeepTriggers(ctx, conn, quoted)
		if err != nil {
			return nil, err
		}
		if len(missing) == 2 {
			continue
		}
		members, err := poll.Members(ctx, conn, table)
		if err != nil {
			return nil, err
		}
		if len(members) > 0 {
			pids := make([]string, len(members))
			for i, m := range members {
				pids[i] = fmt.Sprint(m.PID)
			}
			return nil, fmt.Errorf("%d poll relay session(s) run on %s (PID %s): migrate for the WAL source would drop the triggers %s and %s that keep its rows not published yet, and a writer deleting its row in its own transaction would then lose its event; stop the poll relays first (see the README's \"Moving between the sources\"), or run migrate with relay.source=poll",
				len(members), table, strings.Join(pids, ", "), migrations.KeepTrigger, migrations.KeepTruncateTrigger)
		}
		having = append(having, table)
	}
	return having, nil
}

// keepTriggersProblem says what the missing keep triggers cost, and the fix.
func keepTriggersProblem(table string, missing []string) string {
	return fmt.Sprintf("table %s lacks the poll source's keep triggers %s (missing, disabled, or firing in replica mode only), which keep rows not published yet: the poll relay refuses to start on it, and a writer deleting its row in its own transaction would lose its event; create it with pgoutbox migrate run with the poll configuration (relay.source=poll)",
		table, strings.Join(missing, " and "))
}

// hasNotifyTrigger says whether the table's notification trigger exists
// and is enabled.
func hasNotifyTrigger(ctx context.Context, conn *pgx.Conn, quotedTable string) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2 AND tgenabled <> 'D')",
		quotedTable, migrations.NotifyTrigger).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("read the triggers of %s: %w", quotedTable, err)
	}
	return ok, nil
}

func writePollStatus(w io.Writer, st pollStatus) {
	// Headings alone on their line, and "key  value" rows under them.
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	section := func(name string, rows ...string) {
		fmt.Fprintln(tw, name)
		for i := 0; i+1 < len(rows); i += 2 {
			fmt.Fprintf(tw, "\t%s\t%s\n", rows[i], rows[i+1])
		}
	}
	section("server", "address", st.Server.Address, "database", st.Server.Database, "user", st.Server.User, "version", st.Server.Version)
	table := []string{"source", st.Source, "name", st.Table.Name, "exists", fmt.Sprint(st.Table.Exists)}
	if len(st.Table.Missing) > 0 {
		table = append(table, "missing_columns", strings.Join(st.Table.Missing, ", "))
	}
	table = append(table, "notify_trigger", fmt.Sprintf("%v (channel %s)", st.Table.Trigger, st.Table.Channel))
	if st.Table.Exists && len(st.Table.Missing) == 0 {
		keep := "present"
		switch {
		case len(st.Table.MissingKeep) > 0:
			keep = "MISSING " + strings.Join(st.Table.MissingKeep, ", ")
		case len(st.Table.NotAlwaysKeep) > 0:
			keep = "present; WARNING: " + poll.NotAlwaysWarning(st.Table.Name, st.Table.NotAlwaysKeep)
		}
		table = append(table, "keep_triggers", keep)
	}
	table = append(table, "buckets", fmt.Sprint(st.Table.Buckets))
	if r := st.Table.Recorded; r != nil {
		checked := fmt.Sprintf("table OID %d, checked %s", r.OID, r.CheckedAt.Format(time.RFC3339))
		switch {
		case r.Elsewhere:
			checked += " in another cluster or database (not used)"
		case r.Now != "":
			checked += ": the name names another table now (see problems, or the relay's log)"
		}
		table = append(table, "checked_last", checked)
	}
	section("table", table...)
	if b := st.Backlog; b != nil {
		oldest := "-"
		if b.OldestAgeSeconds != nil {
			oldest = human(time.Duration(*b.OldestAgeSeconds * float64(time.Second)))
		}
		section("backlog", "unpublished_rows", fmt.Sprint(b.Unpublished), "failed_rows", fmt.Sprint(b.Failed), "oldest_unpublished_age", oldest)
	}
	inst := []string{"count", fmt.Sprint(len(st.Instances))}
	for _, m := range st.Instances {
		who := m.ApplicationName
		if m.ClientAddr != "" {
			who += " from " + m.ClientAddr
		}
		inst = append(inst, fmt.Sprintf("pid %d", m.PID), fmt.Sprintf("owns %d of %d buckets (%s)", m.Owned, m.Buckets, who))
	}
	section("instances", inst...)
	problems := []string{"-", "none"}
	if len(st.Problems) > 0 {
		problems = nil
		for _, p := range st.Problems {
			problems = append(problems, "-", p)
		}
	}
	section("problems", problems...)
	_ = tw.Flush()
}

// human rounds a duration for people.
func human(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// validatePollSource is validate's PostgreSQL part for the poll source,
// after the server and the table were checked: the poll source's columns,
// the index and trigger, and the role's privileges on the table. Nothing
// about replication: the poll source needs none.
func validatePollSource(ctx context.Context, v *validation, conn *pgx.Conn, f pgFacts, cfg fileConfig) {
	t, err := cfg.PollTable()
	if err != nil {
		v.report(fail("poll table", err.Error(), "name exactly one outbox table in postgres.table.include.list"))
		return
	}
	if len(f.tables) == 0 || !f.tables[0].exists {
		return
	}
	var missing []string
	for _, c := range poll.RequiredColumns {
		if !slices.Contains(f.tables[0].columns, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		v.report(fail("poll columns", fmt.Sprintf("%s lacks %s", t.Name, strings.Join(missing, ", ")), "run pgoutbox migrate with relay.source=poll: it adds them (existing rows count as unpublished)"))
		return
	}
	v.report(pass("poll columns", strings.Join(poll.RequiredColumns, ", ")))
	var indexed bool
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = $1::regclass AND a.attname = $2 AND i.indpred IS NOT NULL
		AND pg_get_expr(i.indpred, i.indrelid) ILIKE '%' || $3 || ' IS NULL%')`, t.Quoted(), poll.ColumnSeq, poll.ColumnPublishedAt).Scan(&indexed)
	switch {
	case err != nil:
		v.report(fail("poll index", oneLine(err), "check the role's access to the catalog"))
	case indexed:
		v.report(pass("poll index", fmt.Sprintf("%s has a partial index on %s WHERE %s IS NULL", t.Name, poll.ColumnSeq, poll.ColumnPublishedAt)))
	default:
		v.report(warn("poll index", fmt.Sprintf("%s has no partial index on %s WHERE %s IS NULL: every claim reads the published rows too", t.Name, poll.ColumnSeq, poll.ColumnPublishedAt),
			"run pgoutbox migrate with relay.source=poll"))
	}
	missing, err = poll.MissingKeepTriggers(ctx, conn, t.Quoted())
	var notAlways []string
	if err == nil && len(missing) == 0 {
		notAlways, err = poll.KeepTriggersNotAlways(ctx, conn, t.Quoted())
	}
	switch {
	case err != nil:
		v.report(fail("poll keep triggers", oneLine(err), "check the role's access to the catalog"))
	case len(missing) > 0:
		v.report(fail("poll keep triggers", fmt.Sprintf("%s lacks %s (missing, disabled, or firing in replica mode only): the poll relay refuses to start, and a writer deleting its row in its own transaction would lose its event", t.Name, strings.Join(missing, " and ")),
			"run pgoutbox migrate with relay.source=poll (pgoutbox migrate with the WAL source drops them)"))
	case len(notAlways) > 0:
		v.report(warn("poll keep triggers", poll.NotAlwaysWarning(t.Name, notAlways), "run pgoutbox migrate with relay.source=poll"))
	default:
		v.report(pass("poll keep triggers", fmt.Sprintf("%s and %s keep the rows not published yet, in every session (ENABLE ALWAYS)", migrations.KeepTrigger, migrations.KeepTruncateTrigger)))
	}
	if cfg.Poll.Notify {
		switch ok, err := hasNotifyTrigger(ctx, conn, t.Quoted()); {
		case err != nil:
			v.report(fail("poll trigger", oneLine(err), "check the role's access to the catalog"))
		case ok:
			v.report(pass("poll trigger", fmt.Sprintf("%s notifies channel %q; the relay listens on %q", migrations.NotifyTrigger, cfg.Poll.Channel(t.Name), cfg.Poll.Channel(t.Name))))
		default:
			v.report(warn("poll trigger", "no notification trigger: claims wait up to poll.interval ("+cfg.Poll.Interval.String()+") after each commit",
				"run pgoutbox migrate with relay.source=poll, or set poll.notify=false"))
		}
	}
	need := []string{"SELECT", "UPDATE"}
	if cfg.Poll.OnPublish == poll.OnPublishDelete || cfg.Poll.Retention > 0 {
		need = append(need, "DELETE")
	}
	var lacking []string
	for _, p := range need {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT has_table_privilege($1::regclass, $2)", t.Quoted(), p).Scan(&ok); err != nil {
			v.report(fail("poll privileges", oneLine(err), "check the role's access to the table"))
			return
		}
		if !ok {
			lacking = append(lacking, p)
		}
	}
	if len(lacking) > 0 {
		v.report(fail("poll privileges", fmt.Sprintf("%q may not %s on %s", f.user, strings.Join(lacking, ", "), t.Name),
			fmt.Sprintf("GRANT %s ON %s TO %s;", strings.Join(lacking, ", "), t.Quoted(), pgx.Identifier{f.user}.Sanitize())))
	} else {
		v.report(pass("poll privileges", fmt.Sprintf("%q may %s on %s", f.user, strings.Join(need, ", "), t.Name)))
	}
	if ms, err := poll.Members(ctx, conn, t.Name); err == nil {
		v.report(pass("poll instances", fmt.Sprintf("%d relay(s) on %s now", len(ms), t.Name)))
	}
	validatePollRecord(ctx, v, conn, f, t)
}

// validatePollRecord judges the record of the table checked last: whether
// the role may keep it (without it a table renamed away while the relay
// is stopped goes unnoticed) and whether the name still names it.
func validatePollRecord(ctx context.Context, v *validation, conn *pgx.Conn, f pgFacts, t *poll.Table) {
	quoted, _, err := migrations.PollState(t.Name)
	if err != nil {
		v.report(fail("poll record", err.Error(), "name exactly one outbox table in postgres.table.include.list"))
		return
	}
	var exists, may bool
	err = conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, CASE WHEN to_regclass($1) IS NULL
		THEN has_schema_privilege(split_part($2, '.', 1), 'CREATE')
		ELSE has_table_privilege(to_regclass($1), 'SELECT') AND has_table_privilege(to_regclass($1), 'INSERT') AND has_table_privilege(to_regclass($1), 'UPDATE') END`,
		quoted, t.Name).Scan(&exists, &may)
	switch {
	case err != nil:
		v.report(fail("poll record", oneLine(err), "check the role's access to the catalog"))
		return
	case !may:
		what := fmt.Sprintf("%q may not SELECT, INSERT and UPDATE %s", f.user, quoted)
		if !exists {
			what = fmt.Sprintf("%s does not exist and %q may not make it", quoted, f.user)
		}
		v.report(warn("poll record", what+": the relay records there the table it checked, and without it a table renamed away with unpublished rows while the relay is stopped (or before a restart) goes unnoticed",
			fmt.Sprintf("run pgoutbox migrate with relay.source=poll as the table's owner, then GRANT SELECT, INSERT, UPDATE ON %s TO %s;", quoted, pgx.Identifier{f.user}.Sanitize())))
		return
	}
	rec, err := t.LoadRecord(ctx, conn)
	var re *poll.ReplacedError
	if err == nil {
		re, err = t.Replaced(ctx, conn)
	}
	switch {
	case err != nil:
		v.report(fail("poll record", oneLine(err), "check the role's access to "+quoted))
	case re != nil && re.Unpublished != 0 && !re.Within:
		v.report(fail("poll record", re.Error(), "publish the old table's rows as the message says; the relay refuses to start until then"))
	case !rec.Found:
		v.report(pass("poll record", "no table recorded yet: the relay records the one it checks at its first start"))
	case rec.Elsewhere:
		v.report(warn("poll record", fmt.Sprintf("the table checked last was recorded in another cluster or database (table OID %d, %s): the relay does not use the record, and records the table the name names", rec.OID, rec.CheckedAt.Format(time.RFC3339)), "none needed after a restore or pg_upgrade"))
	case re != nil:
		v.report(pass("poll record", "the table checked last is not the one the name names now, and holds no unpublished rows left behind: "+re.Error()))
	default:
		v.report(pass("poll record", fmt.Sprintf("%s is the table checked last (table OID %d, %s)", t.Name, rec.OID, rec.CheckedAt.Format(time.RFC3339))))
	}
}
