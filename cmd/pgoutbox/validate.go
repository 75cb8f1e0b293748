package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

const validateHelp = `Usage: pgoutbox validate [--topics a,b] [flags]

Checks everything pgoutbox run needs: the settings, PostgreSQL (reachable,
wal_level, replication privilege, free slots and walsenders, outbox tables,
the types of the columns written through a Kafka Connect converter,
publication, slot) and Kafka (reachable, topics), and audits durability:
for each topic checked (the dead-letter topic too), its replication factor,
min.insync.replicas and unclean leader election; on PostgreSQL,
max_slot_wal_keep_size and wal_sender_timeout against
postgres.status.update.interval. Prints one line per check,
"PASS|WARN|FAIL <check>: <detail>", and under each FAIL (and most WARNs) a
"fix:" line saying what to do; a durability line says what can be lost.
Nothing is created or changed.

Topics are computed from each row, so only the topics named with --topics
and the fixed topics are checked: router.route.topic, each routes entry's
route.topic, and a route.topic.replacement without group references.

Exit status 0 when nothing failed (with --strict: nothing failed and nothing
warned), 1 when a check failed (or, with --strict, warned), 2 for bad flags
or an unreadable config file, 3 when PostgreSQL or Kafka cannot be reached or
refuses the connection.
`

// Check outcomes.
const (
	checkPass = "PASS"
	checkWarn = "WARN"
	checkFail = "FAIL"
)

// checkResult is one line of "pgoutbox validate" and its fix.
type checkResult struct {
	Status string // PASS, WARN or FAIL
	Name   string
	Detail string
	Fix    string // what to do; empty for PASS
}

func pass(name, detail string) checkResult {
	return checkResult{Status: checkPass, Name: name, Detail: detail}
}

func warn(name, detail, fix string) checkResult {
	return checkResult{Status: checkWarn, Name: name, Detail: detail, Fix: fix}
}

func fail(name, detail, fix string) checkResult {
	return checkResult{Status: checkFail, Name: name, Detail: detail, Fix: fix}
}

// validation collects and prints results as they come.
type validation struct {
	out         io.Writer
	failed      bool
	warned      bool
	unreachable bool
}

func (v *validation) report(rs ...checkResult) {
	for _, r := range rs {
		fmt.Fprintf(v.out, "%s %s: %s\n", r.Status, r.Name, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(v.out, "  fix: %s\n", r.Fix)
		}
		switch r.Status {
		case checkFail:
			v.failed = true
		case checkWarn:
			v.warned = true
		}
	}
}

// cmdValidate implements "pgoutbox validate".
func cmdValidate(args, environ []string, stdout, stderr io.Writer) int {
	c := newFlags("validate", stderr, validateHelp)
	topicsFlag := c.fs.String("topics", "", "comma-separated Kafka topics the outbox routes to, to check that each exists")
	strict := c.fs.Bool("strict", false, "count every WARN as a failure (exit 1), the durability findings among them")
	configOnly := c.fs.Bool("config-only", false, "only load the settings as run does (file, environment, flags, --connector) and check them; connect to nothing; exit 0 when valid, 2 when not")
	cfg, code, ok := c.loadOrExit(args, environ, &stdout, &stderr)
	if !ok {
		return code
	}
	if *configOnly {
		return validateConfigOnly(cfg, stdout, stderr)
	}
	v := &validation{out: stdout}

	// Configuration. Go on after a failure: the other checks that have
	// what they need still tell the whole story at once.
	if err := cfg.Config.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			v.report(fail("config", line, "correct the setting named above in the config file, its PGOUTBOX_* environment variable or its flag (pgoutbox validate --help lists them)"))
		}
	} else {
		v.report(pass("config", "valid"))
	}
	if len(c.ignored) > 0 {
		v.report(warn("connector", "settings pgoutbox ignores: "+strings.Join(describeIgnored(c.ignored), ", "), ""))
	}
	if r, ok := checkStateTable(cfg.Config); ok {
		v.report(r)
	}

	if strings.TrimSpace(cfg.Postgres.DSN) != "" {
		validatePostgres(v, cfg)
	}
	// An invalid Kafka section is already a FAIL above; asking the brokers
	// with it would only blame them.
	if len(cfg.Kafka.Brokers) > 0 && cfg.Kafka.Validate() == nil {
		validateKafka(v, cfg, splitList(*topicsFlag))
	}

	switch {
	case v.unreachable:
		return exitStartup
	case v.failed, *strict && v.warned:
		return exitRuntime
	}
	return exitOK
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// pgFacts is what validate reads from PostgreSQL before judging it.
type pgFacts struct {
	target                 pgTarget
	version                string
	versionNum             int
	walLevel               string
	database, user         string
	superuser, replication bool
	canCreate              bool // CREATE on the database (for CREATE PUBLICATION)
	maxSlots, usedSlots    int
	maxSenders, usedSender int
	tables                 []tableFacts
	pub                    publicationStatus
	catalog                replication.Catalog
	slot                   slotStatus
	// slotHolder describes the client of the slot's active walsender,
	// when known ("application_name pgoutbox from 10.0.0.7").
	slotHolder string
}

// tableFacts describes one configured outbox table.
type tableFacts struct {
	name    string // schema.table
	exists  bool
	relkind string
	owned   bool // the role owns it (or is a member of its owner)
	columns []string
}

func validatePostgres(v *validation, cfg fileConfig) {
	rc := cfg.Postgres
	if rc.ConnectTimeout <= 0 { // invalid, and reported as such above
		rc.ConnectTimeout = replication.DefaultConfig().ConnectTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), rc.ConnectTimeout+statusQueryTimeout)
	defer cancel()
	conn, target, err := connectPG(ctx, rc)
	if err != nil {
		v.report(connectResult(err))
		var ce *replication.ConnectError
		if errors.As(err, &ce) {
			v.unreachable = true
		}
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	f, err := readPGFacts(ctx, conn, target, rc)
	if err != nil {
		v.report(fail("postgres", "connected to "+target.String()+", but reading its state failed: "+oneLine(err),
			"run pgoutbox validate again; if it persists, check the server's log"))
		return
	}
	v.report(checkServer(f))
	if isPoll(cfg) { // the table instead of replication: poll.go
		v.report(checkTables(f, cfg)...)
		v.report(checkConnectTypes(ctx, conn, cfg)...)
		validatePollSource(ctx, v, conn, f, cfg)
		return
	}
	v.report(checkWALLevel(f.walLevel))
	v.report(checkRole(f))
	anchor, anchorErr := replication.ReadSlot(ctx, conn, replication.AnchorSlot(rc.Slot))
	v.report(checkSlotCapacity(f, rc, cfg.Snapshot.Mode == relay.SnapshotInitial, anchorErr == nil))
	v.report(checkWALSenders(f))
	v.report(checkTables(f, cfg)...)
	v.report(checkConnectTypes(ctx, conn, cfg)...)
	// A name the configuration check refused is not checked again here:
	// a fix quoting it would only repeat the mistake.
	if err := replication.ValidatePublicationName(rc.Publication); err != nil {
		v.report(warn("publication", "not checked: publication.name is invalid (see the config line above)", ""))
	} else {
		if shared := replication.SharedPublication(ctx, conn, rc, &f.catalog, f.catalog.Problems(rc)); shared != "" {
			// First: the fixes of the lines below would stop the other
			// relay, or send its events to this one's topics.
			what, fix, _ := strings.Cut(shared, ": ")
			v.report(fail("publication", what, fix))
		}
		v.report(checkPublication(f, rc)...)
	}
	if err := replication.ValidateSlotName(rc.Slot); err != nil {
		v.report(warn("slot", "not checked: slot.name is invalid (see the config line above)", ""))
	} else {
		v.report(checkSlot(f, rc)...)
		v.report(checkSnapshotAnchor(rc, anchor, anchorErr)...)
		validateStart(ctx, v, conn, f, cfg)
	}
	if r, ok := checkUnseenUpdates(ctx, conn, cfg); ok {
		v.report(r)
	}
	validateFailover(ctx, v, rc)
	validatePGDurability(v, ctx, conn, rc)
	if r, ok := checkSharedPrefix(ctx, conn, cfg.Config); ok {
		v.report(r)
	}
	if r, ok := checkGuard(ctx, conn, rc); ok {
		v.report(r)
	}
}

// checkGuard says what the guard of migrate --guard protects, when the
// database has one: it is one per database, and protects only what the
// state tables it was installed for record. Without one there is nothing
// to say (it is optional).
func checkGuard(ctx context.Context, conn *pgx.Conn, rc replication.Config) (checkResult, bool) {
	ctx, cancel := context.WithTimeout(ctx, statusQueryTimeout)
	defer cancel()
	g, err := replication.ReadGuard(ctx, conn)
	switch {
	case err != nil:
		return warn("guard", "reading the event triggers of migrate --guard failed: "+oneLine(err), "run pgoutbox validate again"), true
	case !g.Installed:
		return checkResult{}, false
	case rc.StateTable == "":
		return warn("guard", g.String()+"; this configuration has no postgres.state.table, so nothing protects its publication and tables", "set postgres.state.table, then run pgoutbox migrate --guard with this configuration"), true
	case !g.Protects(rc.StateTable) && len(g.Disabled) == 0:
		return warn("guard", g.String()+", not postgres.state.table "+rc.StateTable+": DDL that keeps this relay's events from the stream is not refused",
			"run pgoutbox migrate --guard with this configuration (as a superuser): the guard then protects what every state table it was installed for records"), true
	case !g.Protects(rc.StateTable):
		return warn("guard", g.String(), "as a superuser: ALTER EVENT TRIGGER pgoutbox_guard ENABLE ALWAYS; ALTER EVENT TRIGGER pgoutbox_guard_ddl ENABLE ALWAYS;"), true
	case len(g.OriginOnly) > 0: // as earlier versions installed it
		return warn("guard", g.String(), "run pgoutbox migrate --guard with this configuration (as a superuser)"), true
	}
	return pass("guard", g.String()), true
}

// connectResult turns a failed connection into its FAIL line.
func connectResult(err error) checkResult {
	if errors.Is(err, errBadDSN) {
		return fail("postgres", err.Error(), "correct postgres.dsn: a libpq key=value string or a postgres:// URL")
	}
	var ce *replication.ConnectError
	if !errors.As(err, &ce) { // postgres.password.file unreadable or empty
		return fail("postgres", oneLine(err), "make postgres.password.file name a readable file that holds the password")
	}
	what := "unreachable"
	if ce.Refused() {
		what = "refused"
	}
	return fail("postgres", fmt.Sprintf("%s: connect to PostgreSQL at %s: %s", what, ce.Target, ce.Reason()), ce.Hint())
}

// readPGFacts reads everything the PostgreSQL checks judge.
func readPGFacts(ctx context.Context, conn *pgx.Conn, target pgTarget, rc replication.Config) (pgFacts, error) {
	ctx, cancel := context.WithTimeout(ctx, statusQueryTimeout)
	defer cancel()
	f := pgFacts{target: target}
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num')::int,
		current_setting('wal_level'),
		current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots)::int,
		current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication)::int,
		current_database(), current_user,
		coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false),
		coalesce((SELECT rolreplication FROM pg_roles WHERE rolname = current_user), false),
		has_database_privilege(current_database(), 'CREATE')`).Scan(
		&f.version, &f.versionNum, &f.walLevel,
		&f.maxSlots, &f.usedSlots, &f.maxSenders, &f.usedSender,
		&f.database, &f.user, &f.superuser, &f.replication, &f.canCreate)
	if err != nil {
		return f, fmt.Errorf("server settings: %w", err)
	}
	for _, t := range rc.QualifiedTables() {
		schema, name, _ := strings.Cut(t, ".")
		tf := tableFacts{name: t}
		err := conn.QueryRow(ctx, `SELECT c.relkind::text, pg_has_role(c.relowner, 'USAGE'),
			array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = $2`, schema, name).Scan(&tf.relkind, &tf.owned, &tf.columns)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return f, fmt.Errorf("table %s: %w", t, err)
		default:
			tf.exists = true
		}
		f.tables = append(f.tables, tf)
	}
	if f.pub, err = readPublicationStatus(ctx, conn, rc.Publication); err != nil {
		return f, err
	}
	if f.catalog, err = replication.ReadCatalog(ctx, conn, rc); err != nil {
		return f, err
	}
	if f.slot, err = readSlotStatus(ctx, conn, rc.Slot); err != nil {
		return f, err
	}
	if f.slot.ActivePID != nil {
		var app, addr *string
		err := conn.QueryRow(ctx, "SELECT application_name, host(client_addr) FROM pg_stat_replication WHERE pid = $1", *f.slot.ActivePID).Scan(&app, &addr)
		if err == nil {
			var parts []string
			if app != nil && *app != "" {
				parts = append(parts, "application_name "+*app)
			}
			if addr != nil && *addr != "" {
				parts = append(parts, "from "+*addr)
			}
			f.slotHolder = strings.Join(parts, " ")
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return f, fmt.Errorf("walsender of slot %q: %w", rc.Slot, err)
		}
	}
	return f, nil
}

// minServerVersion is PostgreSQL 14: pgoutbox always asks pgoutput for
// logical decoding messages (the table-less outbox), an option PostgreSQL
// 14 introduced.
const minServerVersion = 140000

func checkServer(f pgFacts) checkResult {
	if f.versionNum < minServerVersion {
		return fail("postgres", fmt.Sprintf("connected to %s, but PostgreSQL %s is too old: pgoutbox needs 14 or newer (pgoutput's messages option)", f.target, f.version),
			"upgrade PostgreSQL to 14 or newer")
	}
	version := f.version
	if fs := strings.Fields(version); len(fs) > 0 {
		version = fs[0] // "15.18", not "15.18 (Debian 15.18-1.pgdg120+1)"
	}
	return pass("postgres", fmt.Sprintf("connected to %s (PostgreSQL %s)", f.target, version))
}

// checkWALLevel judges the wal_level setting.
func checkWALLevel(level string) checkResult {
	if level == "logical" {
		return pass("wal_level", "logical")
	}
	return fail("wal_level", fmt.Sprintf("is %q; logical decoding needs \"logical\"", level),
		"run ALTER SYSTEM SET wal_level = logical; as a superuser (or set wal_level = logical in postgresql.conf), then restart PostgreSQL")
}

func checkRole(f pgFacts) checkResult {
	switch {
	case f.superuser:
		return pass("role", fmt.Sprintf("%q is a superuser", f.user))
	case f.replication:
		return pass("role", fmt.Sprintf("%q has the REPLICATION attribute", f.user))
	}
	return fail("role", fmt.Sprintf("%q has neither REPLICATION nor SUPERUSER, so it can neither create nor stream from a replication slot", f.user),
		fmt.Sprintf("as a superuser: ALTER ROLE %s WITH REPLICATION;", pgx.Identifier{f.user}.Sanitize()))
}

// checkSlotCapacity: a missing slot needs a free slot, and two with the
// initial snapshot (its temporary slot and the anchor while the rows are
// published, then the anchor and the slot), one if the anchor of an
// earlier attempt is there (counted among those in use).
func checkSlotCapacity(f pgFacts, rc replication.Config, snapshot, anchored bool) checkResult {
	detail := fmt.Sprintf("%d of %d slots in use", f.usedSlots, f.maxSlots)
	need, why := 1, ""
	if snapshot && !anchored {
		need, why = 2, " (snapshot.mode initial takes two while it runs)"
	}
	if snapshot && anchored {
		why = fmt.Sprintf(" (and keeps its anchor %q: do not drop that one)", replication.AnchorSlot(rc.Slot))
	}
	if f.slot.Exists || f.usedSlots+need <= f.maxSlots {
		return pass("max_replication_slots", detail)
	}
	// The slot is missing and there is no room for it: creating it fails
	// for certain, so this is a failure, not a warning.
	return fail("max_replication_slots", detail+fmt.Sprintf(", %d free for slot %q, which needs %d%s", max(f.maxSlots-f.usedSlots, 0), rc.Slot, need, why),
		"drop a slot nobody uses (SELECT pg_drop_replication_slot('name');) or raise max_replication_slots (ALTER SYSTEM SET max_replication_slots = ...; then restart PostgreSQL)")
}

// checkSnapshotAnchor warns of the anchor slot of an initial snapshot that
// did not finish (anchor, as ReadSlot gave it with err): it holds WAL back
// until a start with snapshot.mode initial makes the slot from it.
func checkSnapshotAnchor(rc replication.Config, anchor replication.SlotState, err error) []checkResult {
	name := replication.AnchorSlot(rc.Slot)
	if errors.Is(err, replication.ErrSlotMissing) {
		return nil
	}
	if err != nil {
		return []checkResult{warn("snapshot anchor", "not checked: "+oneLine(err), "")}
	}
	return []checkResult{warn("snapshot anchor", fmt.Sprintf("slot %q keeps %s, where an initial snapshot of slot %q that did not finish started, and holds the WAL since", name, anchor.ConfirmedFlushLSN, rc.Slot),
		fmt.Sprintf("start pgoutbox with snapshot.mode initial to finish it (the slot is made from the anchor, which is then dropped; dropping the anchor instead loses what only WAL held since, rows deleted by their own transaction and table-less messages); if the snapshot was given up, drop it: SELECT pg_drop_replication_slot('%s');", name))}
}

func checkWALSenders(f pgFacts) checkResult {
	detail := fmt.Sprintf("%d of %d walsenders in use", f.usedSender, f.maxSenders)
	if f.usedSender < f.maxSenders {
		return pass("max_wal_senders", detail)
	}
	return warn("max_wal_senders", detail+": pgoutbox's replication connection is refused until one ends",
		"stop a replication client nobody needs, or raise max_wal_senders (ALTER SYSTEM SET max_wal_senders = ...; then restart PostgreSQL)")
}

// checkTables checks each configured outbox table and the columns the
// router needs from it.
func checkTables(f pgFacts, cfg fileConfig) []checkResult {
	ro := cfg.Router
	need := []struct{ col, option string }{
		{ro.EventIDField, "table.field.event.id"},
		{ro.EventPayloadField, "table.field.event.payload"},
		{ro.RouteByField, "route.by.field"},
		{ro.EventTimestampField, "table.field.event.timestamp"},
	}
	var out []checkResult
	for _, t := range f.tables {
		name := "table " + t.name
		switch {
		case !t.exists:
			out = append(out, fail(name, "does not exist",
				fmt.Sprintf("create it: pgoutbox migrate --tables %s creates the default outbox table; or correct postgres.table.include.list", t.name)))
			continue
		case t.relkind != "r" && t.relkind != "p":
			out = append(out, fail(name, fmt.Sprintf("is not a table (relkind %q): only tables can be published", t.relkind),
				"point postgres.table.include.list at the outbox table itself"))
			continue
		}
		var missing, fixes []string
		for _, n := range need {
			if n.col != "" && !slices.Contains(t.columns, n.col) {
				missing = append(missing, n.col)
				fixes = append(fixes, fmt.Sprintf("router.%s=%s", n.option, n.col))
			}
		}
		if len(missing) > 0 {
			out = append(out, fail(name, fmt.Sprintf("lacks column(s) %s that the router needs (it has %s)", strings.Join(missing, ", "), strings.Join(t.columns, ", ")),
				fmt.Sprintf("add the column(s) to %s, or set %s to the right column names", t.name, strings.Join(fixes, ", "))))
			continue
		}
		out = append(out, pass(name, "exists with the columns the router needs"))
	}
	return out
}

func quotedTables(tables []string) string {
	q := make([]string, len(tables))
	for i, t := range tables {
		q[i] = pgx.Identifier(strings.SplitN(t, ".", 2)).Sanitize()
	}
	return strings.Join(q, ", ")
}

// checkPublication checks the publication: it exists (or will be created),
// publishes inserts and contains every configured table.
func checkPublication(f pgFacts, rc replication.Config) []checkResult {
	pubSQL := pgx.Identifier{rc.Publication}.Sanitize()
	createSQL := replication.CreatePublicationSQL(replication.Config{Publication: rc.Publication, Tables: rc.Tables}) + ";"
	p := f.pub
	if !p.Exists {
		switch rc.PublicationAutocreate {
		case replication.PublicationDisabled:
			return []checkResult{fail("publication", fmt.Sprintf("%q does not exist and publication.autocreate.mode is disabled", rc.Publication),
				"run "+createSQL+" or set publication.autocreate.mode=filtered")}
		case replication.PublicationAllTables:
			if !f.superuser {
				return []checkResult{fail("publication", fmt.Sprintf("%q does not exist; pgoutbox would create it FOR ALL TABLES, which needs a superuser, and %q is not one", rc.Publication, f.user),
					"as a superuser: CREATE PUBLICATION "+pubSQL+" FOR ALL TABLES WITH (publish = 'insert'); or set publication.autocreate.mode=filtered")}
			}
			return []checkResult{warn("publication", fmt.Sprintf("%q does not exist; pgoutbox will create it FOR ALL TABLES (publication.autocreate.mode=all_tables), so every table's inserts are decoded and sent to pgoutbox", rc.Publication),
				"set publication.autocreate.mode=filtered to publish only the outbox tables")}
		}
		var notOwned []string
		for _, t := range f.tables {
			if t.exists && !t.owned {
				notOwned = append(notOwned, t.name)
			}
		}
		switch {
		case f.superuser:
		case !f.canCreate:
			return []checkResult{fail("publication", fmt.Sprintf("%q does not exist and %q may not create it: it lacks CREATE on database %q", rc.Publication, f.user, f.database),
				fmt.Sprintf("as the database owner: GRANT CREATE ON DATABASE %s TO %s; or create the publication yourself: %s",
					pgx.Identifier{f.database}.Sanitize(), pgx.Identifier{f.user}.Sanitize(), createSQL))}
		case len(notOwned) > 0:
			return []checkResult{fail("publication", fmt.Sprintf("%q does not exist and %q may not create it: it does not own %s", rc.Publication, f.user, strings.Join(notOwned, ", ")),
				"create it as the tables' owner: "+createSQL)}
		}
		return []checkResult{pass("publication", fmt.Sprintf("%q does not exist yet; pgoutbox will create it (publication.autocreate.mode=filtered): %s", rc.Publication, createSQL))}
	}

	if !p.PublishesInsert {
		return []checkResult{fail("publication", fmt.Sprintf("%q does not publish inserts", rc.Publication),
			"run ALTER PUBLICATION "+pubSQL+" SET (publish = 'insert');")}
	}
	out := []checkResult{pass("publication", fmt.Sprintf("%q publishes inserts of %d table(s)", rc.Publication, len(p.Tables)))}
	if p.AllTables {
		out = []checkResult{pass("publication", fmt.Sprintf("%q publishes inserts of all tables", rc.Publication))}
	}
	problems := f.catalog.Problems(rc)
	for _, t := range f.catalog.Tables {
		name := "publication table " + t.Name
		var mine []string
		for _, pr := range problems {
			if strings.Contains(pr, " "+t.Name) {
				mine = append(mine, pr)
			}
		}
		switch {
		case t.OID == 0:
			continue // the tables check reported it
		case len(mine) > 0:
			for _, pr := range mine {
				what, fix, _ := strings.Cut(pr, ": ")
				out = append(out, fail(name, what, fix))
			}
		case t.Kind == 'p' && f.catalog.ViaRoot:
			out = append(out, pass(name, fmt.Sprintf("published; partitioned (%d partitions), and publish_via_partition_root is on: changes are reported under %s", len(t.Partitions), t.Name)))
		case t.Kind == 'p':
			out = append(out, warn(name, fmt.Sprintf("published; partitioned (%d partitions), with publish_via_partition_root off: changes are reported under each partition's name, which pgoutbox maps to %s while the partition exists; one created and dropped while pgoutbox is stopped cannot be mapped", len(t.Partitions), t.Name),
				fmt.Sprintf("while pgoutbox is stopped and caught up: ALTER PUBLICATION %s SET (publish_via_partition_root = true);", pubSQL)))
		default:
			out = append(out, pass(name, "published"))
		}
	}
	return out
}

func checkSlot(f pgFacts, rc replication.Config) []checkResult {
	s := f.slot
	lit := "'" + strings.ReplaceAll(rc.Slot, "'", "''") + "'"
	if !s.Exists {
		if rc.CreateSlot && !f.superuser && !f.replication {
			return []checkResult{fail("slot", fmt.Sprintf("%q does not exist, and %q may not create it (no REPLICATION attribute)", rc.Slot, f.user),
				fmt.Sprintf("as a superuser: ALTER ROLE %s WITH REPLICATION; or create the slot yourself: SELECT pg_create_logical_replication_slot(%s, 'pgoutput');",
					pgx.Identifier{f.user}.Sanitize(), lit))}
		}
		if rc.CreateSlot {
			return []checkResult{pass("slot", fmt.Sprintf("%q does not exist yet; pgoutbox will create it with plugin pgoutput (postgres.slot.create=true)", rc.Slot))}
		}
		return []checkResult{fail("slot", fmt.Sprintf("%q does not exist and postgres.slot.create is false", rc.Slot),
			fmt.Sprintf("run SELECT pg_create_logical_replication_slot(%s, 'pgoutput'); or set postgres.slot.create=true", lit))}
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	detail := fmt.Sprintf("%q exists, confirmed_flush_lsn %s", rc.Slot, str(s.ConfirmedFlushLSN))
	if s.LagBytes != nil {
		detail += ", lag_bytes " + byteCount(s.LagBytes)
	}
	out := []checkResult{pass("slot", detail)}

	drop := fmt.Sprintf("if nothing else uses it, drop it (SELECT pg_drop_replication_slot(%s);) and let pgoutbox create it, or choose another postgres.slot.name", lit)
	switch {
	case str(s.SlotType) != "logical":
		out = append(out, fail("slot plugin", fmt.Sprintf("%q is a %s slot; pgoutbox needs a logical slot with plugin pgoutput", rc.Slot, str(s.SlotType)), drop))
	case str(s.Plugin) != "pgoutput":
		out = append(out, fail("slot plugin", fmt.Sprintf("%q uses plugin %q; pgoutbox needs pgoutput", rc.Slot, str(s.Plugin)), drop))
	default:
		out = append(out, pass("slot plugin", "pgoutput"))
	}
	if db := str(s.Database); db != "" && db != f.database {
		out = append(out, fail("slot database", fmt.Sprintf("%q belongs to database %q, not %q", rc.Slot, db, f.database),
			fmt.Sprintf("point postgres.dsn at database %q, or choose another postgres.slot.name", db)))
	} else if db != "" {
		out = append(out, pass("slot database", db))
	}
	out = append(out, checkSlotWALStatus(rc.Slot, str(s.WALStatus), s.SafeWALSize))
	out = append(out, checkSlotActive(s, f.slotHolder))
	return out
}

func checkSlotWALStatus(slot, status string, safe *int64) checkResult {
	lit := "'" + strings.ReplaceAll(slot, "'", "''") + "'"
	switch status {
	case "lost":
		return fail("slot wal_status", fmt.Sprintf("%q is lost: WAL it needed was removed, so events written meanwhile were never relayed", slot),
			fmt.Sprintf("find out which events are missing (max_slot_wal_keep_size was exceeded), then drop the slot deliberately (SELECT pg_drop_replication_slot(%s);) and let pgoutbox create a new one; raise max_slot_wal_keep_size to avoid a repeat", lit))
	case "unreserved":
		return warn("slot wal_status", fmt.Sprintf("%q is unreserved: WAL it needs is past max_slot_wal_keep_size and will be removed at the next checkpoint unless pgoutbox catches up", slot),
			"start pgoutbox now, or raise max_slot_wal_keep_size (ALTER SYSTEM SET max_slot_wal_keep_size = ...; SELECT pg_reload_conf();)")
	}
	d := status
	if safe != nil {
		d += ", safe_wal_size " + byteCount(safe)
	} else {
		d += ", safe_wal_size unlimited"
	}
	return pass("slot wal_status", d)
}

func checkSlotActive(s slotStatus, holder string) checkResult {
	if !s.Active {
		return pass("slot active", "no other connection streams from it")
	}
	pid := "an unknown PID"
	if s.ActivePID != nil {
		pid = "PID " + strconv.Itoa(int(*s.ActivePID))
	}
	if holder != "" {
		pid += " (" + holder + ")"
	}
	return warn("slot active", fmt.Sprintf("in use by %s — a running pgoutbox? this instance would wait as standby", pid),
		"")
}

// validateKafka checks the brokers and the topics.
func validateKafka(v *validation, cfg fileConfig, topics []string) {
	kc := cfg.Kafka
	ctx, cancel := context.WithTimeout(context.Background(), 2*(kc.DialTimeout+kc.ReadTimeout))
	defer cancel()
	if err := kafka.Ping(ctx, kc); err != nil {
		var ae *kafka.AuthError
		if errors.As(err, &ae) {
			v.report(fail("kafka", "refused: "+oneLine(err),
				"check kafka.sasl.username and kafka.sasl.password (PGOUTBOX_KAFKA_SASL_PASSWORD, or kafka.sasl.password.file) and kafka.sasl.mechanism against the broker's users"))
			v.unreachable = true
			return
		}
		v.report(fail("kafka", "unreachable: "+oneLine(err),
			"check kafka.brokers (--brokers, PGOUTBOX_KAFKA_BROKERS) and that the brokers listen there and advertise addresses this host can reach"))
		v.unreachable = true
		return
	}
	v.report(pass("kafka", "reachable at "+strings.Join(kc.Brokers, ",")))
	if kc.ExactlyOnce {
		if err := kafka.EnsureOffsetsTopic(ctx, kc); err != nil {
			v.report(fail("offsets topic "+kc.OffsetsTopic, oneLine(err),
				"create it (one partition, cleanup.policy=compact), or let pgoutbox create it: grant CREATE on it"))
		} else {
			v.report(pass("offsets topic "+kc.OffsetsTopic, "exists, compacted (kafka.exactly.once keeps the slot's position there)"))
		}
	}

	if kc.AutoCreateTopics && cfg.UsesEventTimestamp() {
		v.report(warn("topic retention", "with kafka.auto.create.topics pgoutbox reads no topic's settings, so records stamped with table.field.event.timestamp are not checked against their topic's retention: on a topic created with the broker's defaults (CreateTime, 7 days) an event older than that is deleted soon after it is relayed",
			"create the topics yourself and set kafka.auto.create.topics=false, or give the broker log.message.timestamp.type=LogAppendTime, or leave table.field.event.timestamp unset"))
	}
	// The topics known before any row is routed (router.route.topic, a
	// table's route.topic, a replacement without group references) are
	// checked like those named with --topics: the same list run audits at
	// start (startTopics), so a fixed topic that does not exist fails here
	// rather than at the first event. The dead-letter topic comes below.
	start := startTopics(cfg.Config)
	for _, t := range slices.Sorted(maps.Keys(start)) {
		if start[t] == "topic" && !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		v.report(warn("topics", fmt.Sprintf("none checked: each row's %s column picks its topic through route.topic.replacement %q, so the topics are not known in advance",
			cfg.Router.RouteByField, cfg.Router.RouteTopicReplacement),
			"pass --topics a,b with the topics you expect the outbox to write to"))
		return
	}
	dlq := cfg.Relay.PoisonPolicy == "dead-letter"
	if dlq && !slices.Contains(topics, cfg.Relay.DeadLetterTopic) {
		topics = append(topics, cfg.Relay.DeadLetterTopic)
	}
	states, err := kafka.CheckTopics(ctx, kc, topics)
	if err != nil {
		v.report(fail("topics", oneLine(err), "check that the brokers are healthy and run pgoutbox validate again"))
		v.unreachable = true
		return
	}
	for _, s := range states {
		r := checkTopic(s, kc)
		label := "topic"
		if dlq && s.Topic == cfg.Relay.DeadLetterTopic {
			label = "dead-letter topic"
			r.Name = "dead-letter topic " + s.Topic
			if r.Status == checkFail {
				r.Detail += " (relay.poison.policy=dead-letter sends poison records there; pgoutbox run refuses to start without it)"
			}
		}
		v.report(r)
		v.report(checkTopicDurability(s, label, kc.Brokers)...)
		if !dlq || s.Topic != cfg.Relay.DeadLetterTopic { // dead-letter records carry the time they are sent
			v.report(checkTopicRetention(s, cfg, kc.Brokers)...)
		}
	}
}

// checkTopicRetention warns of a topic that deletes records by the
// timestamps they carry (CreateTime, a finite retention.ms) when records
// carry the timestamp column's value (table.field.event.timestamp): an
// event older than the retention would be deleted at once, so the relay
// refuses it as poison (kafka.RecordTooOldError).
func checkTopicRetention(s kafka.TopicState, cfg fileConfig, brokers []string) []checkResult {
	retention, deletes, _ := s.TimestampRetention()
	if s.Err != nil || !deletes || !cfg.UsesEventTimestamp() {
		return nil // unknown settings: the durability check says so
	}
	alter := fmt.Sprintf("kafka-configs.sh --bootstrap-server %s --alter --entity-type topics --entity-name %s --add-config ", strings.Join(brokers, ","), s.Topic)
	return []checkResult{warn("topic "+s.Topic+" retention",
		fmt.Sprintf("records carry the table.field.event.timestamp column's value as their timestamp, and the topic (message.timestamp.type=CreateTime) deletes records by it after retention.ms=%d (%s): an event older than that, less a margin (a backlog after a longer outage, snapshot.mode=initial or the poll source over old rows), would be deleted by the topic as soon as it is relayed, so pgoutbox refuses it as poison (relay.poison.policy)",
			retention.Milliseconds(), retention),
		"if events may wait that long, set "+alter+"message.timestamp.type=LogAppendTime, or raise its retention.ms, or leave table.field.event.timestamp unset")}
}

func checkTopic(s kafka.TopicState, kc kafka.Config) checkResult {
	name := "topic " + s.Topic
	switch {
	case s.Err == nil:
		return pass(name, fmt.Sprintf("exists, %d partition(s)", s.Partitions))
	case errors.Is(s.Err, kafka.ErrTopicMissing):
		create := fmt.Sprintf("kafka-topics.sh --bootstrap-server %s --create --topic %s --partitions N --replication-factor R", strings.Join(kc.Brokers, ","), s.Topic)
		if kc.AutoCreateTopics {
			return warn(name, "does not exist; the broker creates it on the first record only if its auto.create.topics.enable is true, with the broker's default partitions",
				"create it yourself with the partitions you want: "+create)
		}
		return fail(name, "does not exist (kafka.auto.create.topics is false)", "create it: "+create)
	}
	return fail(name, oneLine(s.Err), "check the topic and this client's ACLs on it")
}

// fixedTopic returns the topic of a route.topic.replacement that refers to
// no capture group (Java's replacement syntax: no unescaped $), with its
// backslash escapes resolved. Rows whose routing value matches
// route.topic.regex all go to that topic.
func fixedTopic(replacement string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(replacement); i++ {
		switch c := replacement[i]; c {
		case '$':
			return "", false
		case '\\':
			if i+1 < len(replacement) {
				i++
				b.WriteByte(replacement[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	if b.Len() == 0 {
		return "", false
	}
	return b.String(), true
}

// validateConfigOnly checks the settings as run does before it connects:
// the relay's, the metrics' and the logger's.
func validateConfigOnly(cfg fileConfig, stdout, stderr io.Writer) int {
	_, logErr := newLogger(cfg.Log, io.Discard)
	if err := errors.Join(cfg.Config.Validate(), cfg.Metrics.Validate(), logErr); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	fmt.Fprintln(stdout, "PASS config: valid")
	return exitOK
}
