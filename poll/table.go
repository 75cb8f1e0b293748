package poll

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/replication"
)

// The poll table's own columns, beside Debezium's outbox columns.
const (
	ColumnSeq         = "seq"          // bigint identity: the order rows are claimed in
	ColumnPublishedAt = "published_at" // timestamptz, NULL until Kafka acknowledged the row
	ColumnAttempts    = "attempts"     // integer: failed attempts to publish it
	ColumnLastError   = "last_error"   // text: why the last attempt failed
	ColumnCreatedAt   = "created_at"   // timestamptz: the backlog's age is measured from it (optional)
)

// RequiredColumns are the columns the poll source needs in its table.
var RequiredColumns = []string{ColumnSeq, ColumnPublishedAt, ColumnAttempts, ColumnLastError}

// ErrLayout is wrapped by the error of a table that lacks the poll columns
// or the triggers that keep its unpublished rows.
var ErrLayout = errors.New("poll: the table lacks the poll source's columns or triggers")

// ErrTableReplaced is wrapped by Recheck's error (a *ReplacedError) when
// the table's name names another table than the one Check looked at, or
// none.
var ErrTableReplaced = errors.New("poll: the table is not the one the session checked")

// ReplacedError is Recheck's error when the table's name no longer names
// the table the session checked: that table was dropped, or renamed or
// moved to another schema (and another table may have taken its name).
// The relay follows the name, so rows the old table still holds unpublished
// would never be relayed: Unpublished counts them.
type ReplacedError struct {
	// Name is the table's configured name; OID the table it names now (0:
	// none); OldOID the table the session checked.
	Name        string
	OID, OldOID uint32
	// Old is the checked table's name now (schema.table, quoted as
	// needed), "" if it was dropped.
	Old string
	// Unpublished counts Old's rows not published yet; -1 if counting
	// them failed (CountErr).
	Unpublished int64
	CountErr    error
	// Within: Old is a partition or child of the table the name names
	// now (an outbox turned into a partitioned table), whose claims read
	// its rows: none is left behind.
	Within bool
}

func (e *ReplacedError) Error() string {
	now := fmt.Sprintf("%s is table OID %d now", e.Name, e.OID)
	switch e.OID {
	case 0:
		now = e.Name + " no longer exists"
	case e.OldOID:
		now = fmt.Sprintf("%s is another table now, given the same OID %d again", e.Name, e.OID)
	}
	switch {
	case e.Within:
		return fmt.Sprintf("%v: %s (table OID %d) is %s now, a partition or child of %s, whose claims read its rows; %s; a new session checks the table the name then names", ErrTableReplaced, e.Name, e.OldOID, e.Old, e.Name, now)
	case e.Old == "":
		return fmt.Sprintf("%v: %s (table OID %d) was dropped, and any unpublished rows it held are gone with it (the relay cannot count them); %s; a new session checks the table the name then names", ErrTableReplaced, e.Name, e.OldOID, now)
	case e.Unpublished == 0:
		return fmt.Sprintf("%v: %s (table OID %d) was renamed or moved to another schema: it is %s now, with no unpublished rows; %s; a new session checks the table the name then names", ErrTableReplaced, e.Name, e.OldOID, e.Old, now)
	}
	rows := fmt.Sprintf("%d unpublished row(s)", e.Unpublished)
	if e.Unpublished < 0 {
		rows = fmt.Sprintf("unpublished rows, maybe (counting them failed: %v)", e.CountErr)
	}
	return fmt.Sprintf("%v: %s (table OID %d) was renamed or moved to another schema: it is %s now and holds %s, which the relay, following the name %s, would never publish (%s); "+
		"publish them: copy them into %s in %s order (INSERT INTO %s (its columns but %s, %s, %s, %s) SELECT those columns FROM %s WHERE %s IS NULL ORDER BY %s; they come after the rows %s holds already), then drop %s; or point the relay at %s (postgres.tables) until they are published",
		ErrTableReplaced, e.Name, e.OldOID, e.Old, rows, e.Name, now,
		e.Name, ColumnSeq, e.Name, ColumnSeq, ColumnPublishedAt, ColumnAttempts, ColumnLastError, e.Old, ColumnPublishedAt, ColumnSeq, e.Name, e.Old, e.Old)
}

func (e *ReplacedError) Unwrap() error { return ErrTableReplaced }

// Table is an outbox table the poll source reads.
type Table struct {
	// Name is schema.table.
	Name string
	// KeyColumn is the column whose value is the record key (the router's
	// table.field.event.key): rows of one key are published in sequence
	// order by one instance at a time. Empty or absent: every row has the
	// same (null) key.
	KeyColumn string
	// IDColumn is the event id column (table.field.event.id).
	IDColumn string

	quoted  string // the quoted name
	hasKey  bool   // the table has KeyColumn
	created bool   // the table has created_at
	// oid is the table Check looked at, or the one recorded (LoadRecord),
	// and rowType its row type: an OID given again to a later table (after
	// a drop, once the OID counter wrapped) comes with another row type
	// almost always. 0: none known.
	oid, rowType uint32
	// looked is the table the name named when Replaced looked (0: it
	// had nothing to compare): Record records only that one.
	looked uint32
	// errorChars is how many characters last_error holds (a varchar(n) or
	// char(n) made by hand); 0: any number.
	errorChars int
	// notAlways are the keep triggers Check found firing in origin mode
	// only (KeepTriggersNotAlways).
	notAlways []string
	// beforeInsert are the enabled BEFORE INSERT row triggers Check found
	// on the table and its partitions (BeforeInsertTriggers).
	beforeInsert []string
	// deleteUnpublished are where Check found pgoutbox.delete_unpublished
	// on for every session (DeleteUnpublishedSettings).
	deleteUnpublished []string
}

// NewTable returns the table name (schema.table, or table for public) with
// its key and id columns.
func NewTable(name, keyColumn, idColumn string) (*Table, error) {
	schema, rel, ok := strings.Cut(name, ".")
	if !ok {
		schema, rel = "public", name
	}
	if schema == "" || rel == "" || len(schema) > 63 || len(rel) > 63 {
		return nil, fmt.Errorf("poll: table %q: use schema.table, each part 1 to 63 bytes", name)
	}
	return &Table{Name: schema + "." + rel, KeyColumn: keyColumn, IDColumn: idColumn,
		quoted: pgx.Identifier{schema, rel}.Sanitize(), hasKey: keyColumn != ""}, nil
}

// Quoted is the table's name quoted for SQL.
func (t *Table) Quoted() string { return t.quoted }

// Columns reads the table's column names in order; a table that does not
// exist has none.
func Columns(ctx context.Context, conn *pgx.Conn, table string) ([]string, error) {
	schema, rel, _ := strings.Cut(table, ".")
	rows, err := conn.Query(ctx, `SELECT a.attname::text FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, schema, rel)
	if err != nil {
		return nil, fmt.Errorf("poll: read the columns of %s: %w", table, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("poll: read the columns of %s: %w", table, err)
	}
	return cols, nil
}

// Check reads the table's columns and triggers and fails, wrapping
// ErrLayout, when one the poll source needs is missing (or the table
// itself): its columns, and the keep triggers (MissingKeepTriggers).
func (t *Table) Check(ctx context.Context, conn *pgx.Conn) error {
	// First: a table put in its place after this is told by Recheck.
	var oid, rowType uint32
	if err := conn.QueryRow(ctx, "SELECT coalesce(c.oid, 0), coalesce(c.reltype, 0) FROM (SELECT to_regclass($1)::oid AS r) n LEFT JOIN pg_class c ON c.oid = n.r",
		t.quoted).Scan(&oid, &rowType); err != nil {
		return fmt.Errorf("poll: read the OID of %s: %w", t.Name, err)
	}
	cols, err := Columns(ctx, conn, t.Name)
	if err != nil {
		return err
	}
	if len(cols) == 0 {
		return fmt.Errorf("%w: %s does not exist; create it with pgoutbox migrate (relay.source=poll)", ErrLayout, t.Name)
	}
	has := map[string]bool{}
	for _, c := range cols {
		has[c] = true
	}
	var missing []string
	for _, c := range RequiredColumns {
		if !has[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s has no column %s; add them with pgoutbox migrate (relay.source=poll), which adds what is missing",
			ErrLayout, t.Name, strings.Join(missing, ", "))
	}
	if err := t.checkColumns(ctx, conn); err != nil {
		return err
	}
	var rules []string
	if err := conn.QueryRow(ctx, insertObjectsSQL, t.quoted).Scan(&rules, &t.beforeInsert); err != nil {
		return fmt.Errorf("poll: read the rules and triggers of %s: %w", t.Name, err)
	}
	if err := conn.QueryRow(ctx, deleteUnpublishedSQL, migrations.DeleteUnpublished, migrations.DeleteUnpublished+"=on").Scan(&t.deleteUnpublished); err != nil {
		return fmt.Errorf("poll: read where %s is set: %w", migrations.DeleteUnpublished, err)
	}
	if len(rules) > 0 {
		return fmt.Errorf("%w: rule(s) %s replace the inserts into %s (ON INSERT DO INSTEAD): the rows they keep out are never written there, and the poll source, which reads the table, would never see their events; drop the rules (DROP RULE), or configure the table they write into",
			ErrLayout, strings.Join(rules, ", "), t.Name)
	}
	missing, err = MissingKeepTriggers(ctx, conn, t.quoted)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s lacks the keep trigger(s) %s (missing, disabled, or firing in replica mode only): a writer that deletes its row in its own transaction (pkg/outbox's ModeTableDeleteAfterInsert, the WAL source's way of keeping the table empty) would leave the poll source nothing to read, and its event would be lost without a word; "+
			"create it with pgoutbox migrate run with the poll configuration (relay.source=poll), which adds what is missing (pgoutbox migrate with the WAL source drops it)",
			ErrLayout, t.Name, strings.Join(missing, " and "))
	}
	notAlways, err := KeepTriggersNotAlways(ctx, conn, t.quoted)
	if err != nil {
		return err
	}
	t.notAlways = notAlways
	t.hasKey = t.KeyColumn != "" && has[t.KeyColumn]
	t.created = has[ColumnCreatedAt]
	t.oid, t.rowType = oid, rowType
	return nil
}

// Recheck is a look, in one statement, at whether what Check found still
// holds, for a running relay between claims: the claims name the table,
// so a table dropped and created again (or another renamed into its
// place) would be claimed from unchecked, and a published_at that rows
// now get when written (a default added since) would make every new row
// look published, never relayed. The first fails with a *ReplacedError,
// which names the checked table if it is still there (renamed, or moved
// to another schema) and counts the rows it holds unpublished; the
// second runs Check again, which refuses it; so do keep triggers dropped
// or disabled since (pgoutbox migrate run with the WAL source's
// configuration drops them). Other changes to the same
// table (a sequence altered, a column's type) wait for the next session.
func (t *Table) Recheck(ctx context.Context, conn *pgx.Conn) error {
	var oid, rowType uint32
	var born, kept bool
	var was oldTable
	err := conn.QueryRow(ctx, `SELECT coalesce(c.oid, 0), coalesce((SELECT reltype FROM pg_class WHERE oid = c.oid), 0),
			coalesce(a.atthasdef OR a.attnotnull OR a.attgenerated <> '', false),
			(SELECT count(*) FROM pg_trigger g WHERE g.tgrelid = c.oid AND g.tgname = ANY($3) AND g.tgenabled IN ('O', 'A')) = cardinality($3),
			`+oldTableSQL("$4::oid", "$5::oid", "c.oid")+`
		FROM (SELECT to_regclass($1)::oid AS oid) c
		LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped`, t.quoted, ColumnPublishedAt, keepTriggers, t.oid, t.rowType).Scan(&oid, &rowType, &born, &kept, &was.name, &was.within)
	if err != nil {
		return fmt.Errorf("poll: look at %s again: %w", t.Name, err)
	}
	if !t.is(oid, rowType) {
		return t.replacedBy(ctx, conn, oid, was)
	}
	if born || !kept {
		return t.Check(ctx, conn)
	}
	return nil
}

// oldTable is what became of the table Check looked at, once its name
// names another: its name now (schema.table, quoted as needed; nil if it
// was dropped), and whether the table the name names reads it (a
// partition or child of it at any depth: an outbox turned into a
// partitioned table, renamed, a partitioned table made under its name,
// the old one attached), so that its rows are not left behind.
type oldTable struct {
	name   *string
	within bool
}

// is says whether the table of OID oid and row type rowType is the one
// Check looked at (or the one recorded): an OID of a dropped table given
// again to a later one comes with another row type (a row type of 0, of a
// record without one, is not compared).
func (t *Table) is(oid, rowType uint32) bool {
	return oid == t.oid && (t.rowType == 0 || rowType == t.rowType)
}

// oldTableSQL is the two columns of oldTable, for the checked table of
// OID old and row type oldType (0: not compared), and the table top its
// name names now. A relation of that OID with another row type is another
// table, given the OID of the checked one after it was dropped: the
// checked one is gone.
func oldTableSQL(old, oldType, top string) string {
	same := `(` + oldType + ` = 0 OR o.reltype = ` + oldType + `)`
	return `(SELECT format('%I.%I', n.nspname, o.relname) FROM pg_class o JOIN pg_namespace n ON n.oid = o.relnamespace
			WHERE o.oid = ` + old + ` AND o.oid IS DISTINCT FROM ` + top + ` AND o.relkind IN ('r', 'p') AND ` + same + `),
		EXISTS (WITH RECURSIVE d(oid) AS (SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = ` + top + `
			UNION SELECT i.inhrelid FROM pg_inherits i JOIN d ON i.inhparent = d.oid)
			SELECT 1 FROM d JOIN pg_class o ON o.oid = d.oid WHERE d.oid = ` + old + ` AND ` + same + `)`
}

// Replaced is, for a new session, what Recheck says between claims: nil
// if the table's name still names the table Check last looked at, or the
// one recorded (LoadRecord), or if there is none, else a *ReplacedError.
// A session that ended on something else (a claim that failed because
// the table was gone, a Kafka error), or a process that stopped (on this
// error, say), leaves the change to the next one, whose Check would
// otherwise take the table the name then names and forget the old one.
// Record then records only the table the name named here.
func (t *Table) Replaced(ctx context.Context, conn *pgx.Conn) (*ReplacedError, error) {
	t.looked = 0
	if t.oid == 0 {
		return nil, nil
	}
	var oid, rowType uint32
	var was oldTable
	err := conn.QueryRow(ctx, `SELECT coalesce(c.oid, 0), coalesce((SELECT reltype FROM pg_class WHERE oid = c.oid), 0), `+oldTableSQL("$1::oid", "$3::oid", "c.oid")+`
		FROM (SELECT to_regclass($2)::oid AS oid) c`, t.oid, t.quoted, t.rowType).Scan(&oid, &rowType, &was.name, &was.within)
	if err != nil {
		return nil, fmt.Errorf("poll: look whether %s is still the table OID %d: %w", t.Name, t.oid, err)
	}
	t.looked = oid
	if t.is(oid, rowType) {
		return nil, nil
	}
	return t.replacedBy(ctx, conn, oid, was), nil
}

// replacedBy is the error of the table's name naming the table oid (0:
// none) instead of the one Check looked at, which became was.
func (t *Table) replacedBy(ctx context.Context, conn *pgx.Conn, oid uint32, was oldTable) *ReplacedError {
	e := &ReplacedError{Name: t.Name, OID: oid, OldOID: t.oid, Within: was.within}
	if was.name == nil {
		return e
	}
	e.Old = *was.name
	if !was.within {
		// Its name is quoted as needed (format's %I).
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+e.Old+" WHERE "+ColumnPublishedAt+" IS NULL").Scan(&e.Unpublished); err != nil {
			e.Unpublished, e.CountErr = -1, err
		}
	}
	return e
}

// Unpublished returns those of seqs (the seq values of rows of the table)
// whose rows are still there and not published; a row published (or
// deleted once published) is not.
func (t *Table) Unpublished(ctx context.Context, conn *pgx.Conn, seqs []int64) ([]int64, error) {
	rows, err := conn.Query(ctx, "SELECT "+ColumnSeq+"::bigint FROM "+t.quoted+" WHERE "+ColumnPublishedAt+" IS NULL AND "+ColumnSeq+" = ANY($1::bigint[])", seqs)
	if err != nil {
		return nil, fmt.Errorf("poll: look for unpublished rows of %s by %s: %w", t.Name, ColumnSeq, err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("poll: look for unpublished rows of %s by %s: %w", t.Name, ColumnSeq, err)
	}
	return left, nil
}

// keepTriggers are the triggers that keep the rows not published yet
// (migrations/0002_poll.sql): one skips their deletes, one refuses a
// TRUNCATE while there are any.
var keepTriggers = []string{migrations.KeepTrigger, migrations.KeepTruncateTrigger}

// MissingKeepTriggers returns the poll source's keep triggers (see
// migrations.KeepTrigger) that the table quotedTable lacks, or has
// disabled (or set to fire in replica mode only, which is disabled for
// every ordinary session): without them a writer that deletes its row in
// its own transaction, or a TRUNCATE, discards events the poll source
// never read.
func MissingKeepTriggers(ctx context.Context, conn *pgx.Conn, quotedTable string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT k FROM unnest($2::text[]) k WHERE NOT EXISTS (SELECT 1 FROM pg_trigger
		WHERE tgrelid = to_regclass($1) AND tgname = k AND tgenabled IN ('O', 'A'))`, quotedTable, keepTriggers)
	if err != nil {
		return nil, fmt.Errorf("poll: read the triggers of %s: %w", quotedTable, err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("poll: read the triggers of %s: %w", quotedTable, err)
	}
	return missing, nil
}

// checkColumns refuses poll columns that were there before migrate (which
// adds only what is missing) with another meaning: a published_at that a
// row gets when it is written (a default, NOT NULL, a generated column)
// makes every row born published, never claimed; a seq that is not an
// integer cannot order the claims; an attempts that is not an integer, or
// a last_error that is not a string, or either generated, makes the
// statement that records a failed attempt fail, and with it the whole
// batch, Kafka's acknowledgements included, for ever. The shapes common in
// tables written by hand are taken as they are: an attempts that may be
// NULL (counted as 0), a last_error of limited length (errorChars: a
// reason is cut to it).
func (t *Table) checkColumns(ctx context.Context, conn *pgx.Conn) error {
	// The type without its modifier, a domain's base type; the modifier
	// (a domain's own, if it has one).
	rows, err := conn.Query(ctx, `SELECT a.attname::text, format_type(CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE a.atttypid END, NULL),
		a.attnotnull, a.atthasdef, a.attgenerated <> '', CASE WHEN ty.typtype = 'd' THEN ty.typtypmod ELSE a.atttypmod END
		FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
		WHERE a.attrelid = to_regclass($1) AND a.attname = ANY($2) AND NOT a.attisdropped`,
		t.quoted, []string{ColumnPublishedAt, ColumnSeq, ColumnAttempts, ColumnLastError})
	if err != nil {
		return fmt.Errorf("poll: read the columns of %s: %w", t.Name, err)
	}
	defer rows.Close()
	var problems []string
	t.errorChars = 0
	for rows.Next() {
		var name, typ string
		var notNull, hasDefault, generated bool
		var mod int32
		if err := rows.Scan(&name, &typ, &notNull, &hasDefault, &generated, &mod); err != nil {
			return fmt.Errorf("poll: read the columns of %s: %w", t.Name, err)
		}
		switch name {
		case ColumnAttempts:
			if typ != "bigint" && typ != "integer" && typ != "smallint" {
				problems = append(problems, fmt.Sprintf("%s is %s, not an integer: a failed attempt could not be counted, and the batch it was in, rows Kafka acknowledged included, would be sent again and again; ALTER TABLE %s ALTER COLUMN %s TYPE integer USING ..., or rename the column and run pgoutbox migrate again", name, typ, t.quoted, name))
			}
			if generated {
				problems = append(problems, fmt.Sprintf("%s is a generated column: pgoutbox counts the failed attempts in it; rename it and run pgoutbox migrate again", name))
			}
		case ColumnLastError:
			switch typ {
			case "text":
			case "character varying", "character":
				if mod >= 4 { // varchar(n), char(n): n + 4
					t.errorChars = int(mod - 4)
				}
			default:
				problems = append(problems, fmt.Sprintf("%s is %s, not text: the reason of a failed attempt could not be recorded, and the batch it was in, rows Kafka acknowledged included, would be sent again and again; ALTER TABLE %s ALTER COLUMN %s TYPE text, or rename the column and run pgoutbox migrate again", name, typ, t.quoted, name))
			}
			if generated {
				problems = append(problems, fmt.Sprintf("%s is a generated column: pgoutbox records why an attempt failed in it; rename it and run pgoutbox migrate again", name))
			}
		case ColumnPublishedAt:
			if typ != "timestamp with time zone" && typ != "timestamp without time zone" {
				problems = append(problems, fmt.Sprintf("%s is %s, not timestamptz", name, typ))
			}
			if notNull || hasDefault || generated {
				problems = append(problems, fmt.Sprintf("%s has a value when a row is written (NOT NULL %v, a default %v, generated %v): every row would be born published and never relayed; pgoutbox uses it to mark what it published (NULL: not yet), so rename the existing column and run pgoutbox migrate again", name, notNull, hasDefault, generated))
			}
		case ColumnSeq:
			if typ != "bigint" && typ != "integer" && typ != "smallint" {
				problems = append(problems, fmt.Sprintf("%s is %s, not an integer that orders the rows as they are written", name, typ))
			}
			if !notNull {
				problems = append(problems, fmt.Sprintf("%s may be NULL: a row without one cannot be ordered (and would stop every claim that reaches it); make it NOT NULL", name))
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("poll: read the columns of %s: %w", t.Name, err)
	}
	rows.Close()
	// The sequence that numbers the rows: the one the column owns (an
	// identity column, a serial), or else the one its default takes
	// numbers from (DEFAULT nextval('...') of a sequence made apart). With
	// a cache, each session hands out numbers from a block of its own, so
	// the numbers of two sessions' rows are not in the order they were
	// written; a sequence that cycles starts again below the rows not yet
	// published; one that counts down numbers later rows lower.
	var name string
	var cache, increment int64
	var cycle bool
	err = conn.QueryRow(ctx, `SELECT s.seqrelid::regclass::text, s.seqcache, s.seqincrement, s.seqcycle FROM pg_sequence s
		WHERE s.seqrelid = coalesce(pg_get_serial_sequence($1, $2)::regclass::oid,
			(SELECT d.refobjid FROM pg_attrdef ad
			JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
			JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid AND d.refclassid = 'pg_class'::regclass
			JOIN pg_class sc ON sc.oid = d.refobjid AND sc.relkind = 'S'
			WHERE ad.adrelid = to_regclass($1) AND a.attname = $2 LIMIT 1))`, t.quoted, ColumnSeq).Scan(&name, &cache, &increment, &cycle)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("poll: read the sequence of %s.%s: %w", t.Name, ColumnSeq, err)
	default:
		if cache > 1 {
			problems = append(problems, fmt.Sprintf("the sequence of %s (%s) has CACHE %d: each session numbers its rows from a block of its own, so rows of one key written by two sessions are not numbered in the order they were written, and would be published out of order; ALTER SEQUENCE %s CACHE 1", ColumnSeq, name, cache, name))
		}
		if cycle {
			problems = append(problems, fmt.Sprintf("the sequence of %s (%s) cycles: after its last value it numbers new rows below those not yet published; ALTER SEQUENCE %s NO CYCLE", ColumnSeq, name, name))
		}
		if increment < 0 {
			problems = append(problems, fmt.Sprintf("the sequence of %s (%s) counts down (INCREMENT %d): rows written later get lower numbers and would be published before earlier rows of their key; make it count up once no row is unpublished (ALTER SEQUENCE %s INCREMENT BY 1 NO MINVALUE NO MAXVALUE RESTART WITH a number above every row's)", ColumnSeq, name, increment, name))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s: %s", ErrLayout, t.Name, strings.Join(problems, "; "))
	}
	return nil
}

// keyText is the key as text in SQL (the empty string for NULL or no key
// column).
func (t *Table) keyText(alias string) string {
	if !t.hasKey {
		return "''"
	}
	return "coalesce(" + alias + "." + pgx.Identifier{t.KeyColumn}.Sanitize() + "::text, '')"
}

// keyOutput is the key's output text in SQL, as the claim reads it into
// Row.Key (a char(n) keeps its padding, which a cast to text drops); the
// empty string for NULL or no key column.
func (t *Table) keyOutput(alias string) string {
	if !t.hasKey {
		return "''"
	}
	return "coalesce(format('%s', " + alias + "." + pgx.Identifier{t.KeyColumn}.Sanitize() + "), '')"
}

// bucketExpr is the SQL of a row's bucket, in [0, buckets): the key's
// hashtext, made non-negative. Every instance computes it in the same
// server, so they agree.
func (t *Table) bucketExpr(alias string, buckets int) string {
	return "mod(hashtext(" + t.keyText(alias) + ")::bigint + 2147483648, " + strconv.Itoa(buckets) + ")"
}

// lockKeys are the first keys of the advisory locks on the table's
// buckets and of its members' locks: two int4 namespaces derived from the
// table's name, so that other tables' relays and other applications'
// advisory locks do not meet them.
func lockKeys(table string) (bucketNS, memberNS int32) {
	return lockKey("bucket", table), lockKey("member", table)
}

// lockKey is the first key of the table's advisory locks of one kind.
func lockKey(kind, table string) int32 {
	f := fnv.New32a()
	f.Write([]byte("pgoutbox.poll." + kind + "\x00" + table))
	return int32(f.Sum32() & 0x7fffffff)
}

// KeepTriggersNotAlways returns the poll source's keep triggers that the
// table quotedTable has enabled in origin mode only (tgenabled 'O', what
// CREATE TRIGGER makes and what pgoutbox migrate of earlier versions
// left): they fire in ordinary sessions, but not in one whose
// session_replication_role is replica (a superuser's, pg_restore
// --disable-triggers, a logical replication apply worker writing into the
// table, pglogical), where a DELETE or TRUNCATE of unpublished rows
// discards their events. pgoutbox migrate with the poll configuration
// makes them fire always.
func KeepTriggersNotAlways(ctx context.Context, conn *pgx.Conn, quotedTable string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT tgname::text FROM pg_trigger
		WHERE tgrelid = to_regclass($1) AND tgname = ANY($2) AND tgenabled = 'O' ORDER BY array_position($2, tgname::text)`, quotedTable, keepTriggers)
	if err != nil {
		return nil, fmt.Errorf("poll: read the triggers of %s: %w", quotedTable, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("poll: read the triggers of %s: %w", quotedTable, err)
	}
	return names, nil
}

// KeepTriggersNotAlways returns the keep triggers the last Check found
// firing in origin mode only (see the function of that name): the relay
// runs, and warns.
func (t *Table) KeepTriggersNotAlways() []string { return t.notAlways }

// insertObjectsSQL reads, for the table $1 and its partitions, the rules
// ON INSERT DO INSTEAD and the enabled BEFORE INSERT row triggers, as the
// WAL source's catalog check does.
var insertObjectsSQL = `SELECT ` + replication.InsertRulesAndTriggersSQL("to_regclass($1)")

// deleteUnpublishedSQL reads where pgoutbox.delete_unpublished ($1) is on
// for sessions that did not set it themselves: in this session (the
// server's configuration, or the relay's role or database), and in
// pg_db_role_setting for a role in this database, every role in it, or a
// role in every database ($2 is the setconfig entry).
const deleteUnpublishedSQL = `SELECT ARRAY(
	SELECT 'the server''s configuration or the relay''s own role or database' WHERE coalesce(current_setting($1, true), '') = 'on'
	UNION ALL
	SELECT CASE WHEN s.setrole = 0 THEN 'every role' ELSE 'role ' || coalesce(r.rolname, s.setrole::text) END
		|| CASE WHEN s.setdatabase = 0 THEN ' in every database' ELSE ' in this database' END
	FROM pg_db_role_setting s LEFT JOIN pg_roles r ON r.oid = s.setrole
	WHERE (s.setdatabase = 0 OR s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()))
		AND $2 = ANY(s.setconfig))`

// DeleteUnpublishedSettings returns where Check found
// pgoutbox.delete_unpublished on for every session.
func (t *Table) DeleteUnpublishedSettings() []string { return t.deleteUnpublished }

// DeleteUnpublishedWarning says, for people, what a lasting
// pgoutbox.delete_unpublished = on does.
func DeleteUnpublishedWarning(table string, where []string) string {
	return fmt.Sprintf("%s is on for %s (ALTER ROLE or ALTER DATABASE ... SET, or the server's configuration): the keep triggers of %s let every such session delete rows not yet published, so the events of a writer there that deletes its row in its own transaction are lost without a word; set it only in the session of a purge meant as one (SET), and RESET it where it is set (ALTER ROLE or ALTER DATABASE ... RESET %s)",
		migrations.DeleteUnpublished, strings.Join(where, "; "), table, migrations.DeleteUnpublished)
}

// BeforeInsertTriggers returns the enabled BEFORE INSERT row triggers of
// the table and its partitions that Check found.
func (t *Table) BeforeInsertTriggers() []string { return t.beforeInsert }

// BeforeInsertWarning says, for people, what a BEFORE INSERT row trigger
// on the poll table can do unseen.
func BeforeInsertWarning(table string, names []string) string {
	return fmt.Sprintf("%s has BEFORE INSERT row trigger(s) %s: one that sets %s makes the row look published, and one that returns NULL keeps it out of the table; either way the poll source never relays its event, and nothing tells. Check that they do neither",
		table, strings.Join(names, ", "), ColumnPublishedAt)
}

// NotAlwaysWarning says, for people, what keep triggers of the table that
// fire in origin mode only (KeepTriggersNotAlways) cost, and the fix.
func NotAlwaysWarning(table string, names []string) string {
	return fmt.Sprintf("the keep trigger(s) %s of %s fire in origin mode only: a session with session_replication_role = replica (a superuser's, pg_restore --disable-triggers, a logical replication apply worker writing into the table, pglogical) deletes or truncates rows not published yet unchecked, and their events are lost without a word; "+
		"run pgoutbox migrate with the poll configuration (relay.source=poll), which makes them fire always (ALTER TABLE %s ENABLE ALWAYS TRIGGER ...; it waits for its lock on the table at most --lock-timeout)",
		strings.Join(names, " and "), table, table)
}
