package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/router"
)

// ErrCatalogChanged is wrapped by the error of a publication or outbox table
// that is no longer what the relay started with: events written since may
// never reach the stream, so the relay must stop.
var ErrCatalogChanged = errors.New("replication: the publication or an outbox table changed")

// Catalog is what the server's catalog says about the publication and the
// outbox tables, read in one snapshot. The relay reads it when a session
// starts and then every few seconds, and compares: any change that can keep
// an insert out of the stream (the publication dropped or recreated, a table
// dropped, recreated, renamed or removed from the publication, inserts no
// longer published, a row filter or column list added) stops it, and so
// does one that leaves no trace in the catalog's state but did so for a
// while (a table taken out of the publication and put back); one that may
// have (the publication's row written: its options changed and changed
// back, or only its owner) is warned of.
type Catalog struct {
	// CheckedAt is the server's WAL position read before the catalog: every
	// DDL committed before it is reflected here.
	CheckedAt LSN
	// Publication is the publication's OID; 0 when it does not exist.
	Publication uint32
	AllTables   bool
	Insert      bool
	ViaRoot     bool // publish_via_partition_root
	// PublicationXmin is the transaction that last wrote the publication's
	// catalog row (pg_publication.xmin): ALTER PUBLICATION ... SET, OWNER
	// TO and RENAME write it (adding or dropping tables writes other rows).
	// Inserts unpublished for a while and published again leave no other
	// trace, so a new one is warned of (Altered).
	PublicationXmin uint32
	// GeneratedColumns: the publication sends stored generated columns
	// (PostgreSQL 18's publish_generated_columns = stored); before 18,
	// logical decoding never sends them.
	GeneratedColumns bool
	Tables           []TableInfo
	// UserTypes are the types of the configured tables' columns that are
	// not built in (OIDs from 16384 on), and the domains among them (also
	// information_schema's, which initdb makes), by OID.
	UserTypes map[uint32]UserType
	// SyncStandby is set when the slot's walsender is a synchronous
	// standby or a candidate ("application_name sync_state"): commits then
	// wait for pgoutbox, which waits for them (visible with the privileges
	// of pg_read_all_stats).
	SyncStandby string
}

// UserType is a column type that is not built in. The stream names a
// domain's column by the domain's OID, where a query's row description and
// Debezium (through the JDBC driver's column metadata) name its base type:
// the relay resolves it to read the column's value as its base type's.
type UserType struct {
	// Base is the domain's base type, through every level of domains; 0
	// when the type is not a domain (an enum, an extension's type, ...).
	Base uint32
	// BaseMod is the type modifier the domain gives its base type
	// (numeric(12,2)'s), -1 where it gives none.
	BaseMod int32
	// NotReproduced says Debezium makes a Connect value of the type (or
	// of the domain's base type) that pgoutbox does not reproduce: a user
	// type other than an enum (whose value is its label), citext or ltree
	// (their text), such as an array of an enum, a composite, a range of a user
	// type, hstore or PostGIS's geometry. The router makes a column of
	// it placed through a Kafka Connect converter a poison row
	// (router.NotReproducedType) instead of writing other bytes than
	// Debezium's.
	NotReproduced bool
}

// userTypesSQL is a query of the user types whose OIDs seed (a query of
// one oid column) gives, one text row each, "oid:base:modifier:kind":
// base is the domain's base type through every level, the type itself when
// it is not a domain; modifier the last domain's (-1 when none); kind is
// "r" when pgoutbox reproduces Debezium's Connect value of the base type
// (a built-in type, where the router decides; an enum; citext and ltree,
// which Debezium's connector takes as strings by their names, as pgoutbox
// does),
// "n" when not.
func userTypesSQL(seed string) string {
	return `WITH RECURSIVE d(oid, base, mod) AS (
			SELECT s.oid, s.oid, -1 FROM (` + seed + `) s(oid)
			UNION
			SELECT d.oid, t.typbasetype, t.typtypmod FROM d JOIN pg_type t ON t.oid = d.base AND t.typtype = 'd')
		SELECT d.oid::text || ':' || d.base::text || ':' || d.mod || ':'
			|| CASE WHEN d.base < 16384 OR t.typtype = 'e' OR (t.typtype = 'b' AND t.typname IN ('citext', 'ltree')) THEN 'r' ELSE 'n' END
		FROM d JOIN pg_type t ON t.oid = d.base
		WHERE t.typtype <> 'd' ORDER BY 1`
}

// parseUserTypes adds the rows of userTypesSQL to m.
func parseUserTypes(rows []string, m map[uint32]UserType) error {
	for _, ty := range rows {
		var oid, base uint32
		var mod int32
		var kind string
		if _, err := fmt.Sscanf(ty, "%d:%d:%d:%s", &oid, &base, &mod, &kind); err != nil || (kind != "r" && kind != "n") {
			return fmt.Errorf("unexpected user type row %q", ty)
		}
		ut := UserType{Base: base, BaseMod: mod, NotReproduced: kind == "n"}
		if base == oid {
			ut.Base, ut.BaseMod = 0, -1
		}
		m[oid] = ut
	}
	return nil
}

// ReadUserTypes reads the user types among oids (those from FirstUserOID
// on) that are not in m into m, which it makes when nil. The query paths
// (the poll source, the snapshot) call it with a row description's types,
// where a domain is already its base type but an enum or an array of one
// is not told apart.
func ReadUserTypes(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, oids []uint32, m map[uint32]UserType) (map[uint32]UserType, error) {
	var missing []uint32
	for _, oid := range oids {
		if _, ok := m[oid]; oid >= FirstUserOID && !ok && !slices.Contains(missing, oid) {
			missing = append(missing, oid)
		}
	}
	if len(missing) == 0 {
		return m, nil
	}
	rows, err := q.Query(ctx, userTypesSQL(`SELECT unnest($1::oid[])`), missing)
	if err != nil {
		return m, fmt.Errorf("read the column types %v: %w", missing, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return m, fmt.Errorf("read the column types %v: %w", missing, err)
	}
	if m == nil {
		m = map[uint32]UserType{}
	}
	if err := parseUserTypes(got, m); err != nil {
		return m, err
	}
	for _, oid := range missing {
		if _, ok := m[oid]; !ok {
			// Dropped since the row was read: nothing tells what it was.
			m[oid] = UserType{BaseMod: -1, NotReproduced: true}
		}
	}
	return m, nil
}

// FirstUserOID is PostgreSQL's FirstNormalObjectId: objects with lower OIDs
// are built in.
const FirstUserOID = 16384

// RouterTypes returns the column types and type modifiers a row of a table
// with these column types is routed by: domains resolved to their base
// types (a column's own modifier is -1 under a domain: the domain's
// applies). rt and rm are nil when no column is of a type that is not
// built in: the row is routed by types and mods. known is false when a
// type that is not built in is not in c (a column added since c was read).
// See the function RouterTypes for what each becomes.
func (c *Catalog) RouterTypes(types []uint32, mods []int32) (rt []uint32, rm []int32, known bool) {
	return RouterTypes(c.UserTypes, types, mods)
}

// firstInitdbOID is PostgreSQL's FirstGenbkiObjectId: every type below it is
// built in with a fixed OID; from it up to FirstUserOID are the objects
// initdb creates, such as information_schema's domains.
const firstInitdbOID = 10000

// RouterTypes is Catalog.RouterTypes over the user types in m. No type
// from FirstUserOID on reaches the router: a domain becomes its base type,
// an enum, citext or ltree (or a domain over one) text, and a type pgoutbox
// does not reproduce (UserType.NotReproduced) or that m does not know
// router.NotReproducedType, so that a row no catalog explained is refused,
// never written as text. information_schema's domains are in m like the
// user's (they have OIDs below FirstUserOID).
func RouterTypes(m map[uint32]UserType, types []uint32, mods []int32) (rt []uint32, rm []int32, known bool) {
	known = true
	for i, oid := range types {
		ut, ok := m[oid]
		switch {
		case !ok && oid < firstInitdbOID:
			continue // built in
		case !ok && oid < FirstUserOID:
			// Made by initdb: a domain when the catalog did not list it.
			known = false
			continue
		case !ok:
			known = false
			ut = UserType{BaseMod: -1, NotReproduced: true}
		}
		if rt == nil {
			rt, rm = slices.Clone(types), make([]int32, len(types))
			for j := range rm {
				rm[j] = -1
			}
			copy(rm, mods)
		}
		switch {
		case ut.NotReproduced:
			rt[i], rm[i] = router.NotReproducedType, -1
		case ut.Base == 0 || ut.Base >= FirstUserOID:
			// An enum, citext or ltree, or a domain over one: its text.
			rt[i], rm[i] = textOID, -1
		default:
			rt[i] = ut.Base
			if i >= len(mods) || mods[i] == -1 {
				rm[i] = ut.BaseMod
			}
		}
	}
	return rt, rm, known
}

// textOID is the type text.
const textOID = 25

// TableInfo describes one configured outbox table in a Catalog.
type TableInfo struct {
	Name string // schema.table, as configured
	// OID is 0 when no table of that name exists.
	OID uint32
	// Kind is pg_class.relkind: 'r' a table, 'p' a partitioned table.
	Kind byte
	// Persistence is pg_class.relpersistence: 'p' permanent, 'u' unlogged
	// (never written to the WAL), 't' temporary.
	Persistence byte
	// Published says the publication carries the table: it is a member,
	// or its schema is, or the publication is FOR ALL TABLES.
	Published bool
	// RowFilter and ColumnList say the publication filters the table's
	// rows or columns (PostgreSQL 15+), which keeps events out silently.
	RowFilter, ColumnList bool
	// Membership identifies what makes the publication carry the table:
	// the OID of its pg_publication_rel row and of its schema's
	// pg_publication_namespace row (0 where there is none). A table taken
	// out of the publication and put back, or given another row filter or
	// column list, has a new row and so a new OID: the inserts committed
	// while it was out were never decoded, and nothing else tells.
	Membership Membership
	// Partitions are the table's partitions at every level (none for an
	// ordinary table), with the few facts that can keep their rows out of
	// the WAL.
	Partitions []PartitionInfo
	// Columns are the table's columns, and Generated those of them that
	// are generated (their values are computed, and logical decoding
	// sends them only where GeneratedColumns allows stored ones).
	Columns   []string
	Generated map[string]byte
	// Inheritors are the tables that inherit from it at any level by table
	// inheritance (INHERITS), not as partitions, as schema.table. PostgreSQL
	// decodes their rows under their own names, whatever the publication
	// says of the parent: a publication created FOR TABLE the parent takes
	// in the children of that moment only, and nothing maps them back to
	// the outbox table.
	Inheritors []string
	// ReportedAs is, for an outbox table that is itself a partition, the
	// ancestor (schema.table) under whose name and OID the publication
	// reports its changes: with publish_via_partition_root, the topmost one
	// the publication carries (the root in a FOR ALL TABLES one). Empty
	// when they are reported under its own.
	ReportedAs string
	// InsteadRules are the rules ON INSERT DO INSTEAD of the table and its
	// partitions ("schema.table: rule"): an insert they replace never
	// reaches the table, nor the WAL as the outbox's. BeforeInsert are its
	// (and its partitions') enabled BEFORE INSERT row triggers, which may
	// skip a row by returning NULL: nothing then reaches the WAL either.
	InsteadRules, BeforeInsert []string
}

// PartitionInfo is one partition of a partitioned outbox table.
type PartitionInfo struct {
	OID         uint32
	Name        string // schema.table
	Kind        byte   // 'r', 'p' or 'f' (a foreign table: its rows are not in this WAL)
	Persistence byte
	// RowFilter and ColumnList say the publication lists the partition
	// itself with a row filter or a column list: without
	// publish_via_partition_root, pgoutput applies the partition's own.
	RowFilter, ColumnList bool
	// Own says the publication carries the partition on its own (it is
	// listed, or its schema is), not only as part of its outbox table.
	Own bool
	// Joined and JoinedCmd are the transaction and command that made the
	// partition part of the outbox table: the pg_inherits row of the
	// youngest link between them (its own, or an ancestor's). Rows written
	// before that (an older transaction, or an earlier command of that
	// one) were decoded as the table's own, not the outbox's: a table
	// written into, then attached (ATTACH PARTITION). A partition created
	// as one (CREATE TABLE ... PARTITION OF) has no such rows.
	Joined, JoinedCmd uint32
	// Created is the transaction that created the partition: the catalog
	// row that makes its row type depend on it (pg_depend), which a rename
	// or a change of owner does not rewrite (0 when not found). A partition
	// created by the transaction that made it part of the outbox table
	// can hold rows from before only from that transaction: no other could
	// see it before then.
	Created uint32
}

// CreatedJoining says the partition was created by the transaction that
// made it part of its outbox table.
func (p PartitionInfo) CreatedJoining() bool { return p.Created != 0 && p.Created == p.Joined }

// PartitionJoins returns every partition of the configured tables by OID,
// with the transaction that made it part of its table (as State.Attached
// records them).
func (c *Catalog) PartitionJoins() map[uint32]uint32 {
	out := map[uint32]uint32{}
	for _, t := range c.Tables {
		for _, p := range t.Partitions {
			out[p.OID] = p.Joined
		}
	}
	return out
}

// PartitionOf returns the configured table the relation with OID oid is a
// partition of, whatever the publication reports partitions under.
func (c *Catalog) PartitionOf(oid uint32) (string, bool) {
	for _, t := range c.Tables {
		for _, p := range t.Partitions {
			if p.OID == oid {
				return t.Name, true
			}
		}
	}
	return "", false
}

// Membership is a table's pg_publication_rel and pg_publication_namespace
// row OIDs in a publication (see TableInfo.Membership).
type Membership struct {
	Rel, Schema uint32
	// SchemaLink, with a Schema row, is the transaction that last wrote
	// the table's dependency on its schema (pg_depend): ALTER TABLE ...
	// SET SCHEMA writes it. A table moved out of a schema the publication
	// carries and back keeps its OID, its name and the schema's row, and
	// the inserts committed while it was elsewhere were never decoded. 0
	// in records from before it.
	SchemaLink uint32 `json:",omitempty"`
}

// Kept says the table stayed in the publication from was to m without a
// break: by the same row of pg_publication_rel, or of its schema in
// pg_publication_namespace without leaving the schema in between. A
// publication FOR ALL TABLES has no such rows (it is the same publication
// throughout, which Changes checks).
func (m Membership) Kept(was Membership) bool {
	if was.Rel != 0 && was.Rel == m.Rel {
		return true
	}
	return was.Schema != 0 && was.Schema == m.Schema && (was.SchemaLink == 0 || was.SchemaLink == m.SchemaLink)
}

// Table returns the configured table named name, if any.
func (c *Catalog) Table(name string) (TableInfo, bool) {
	for _, t := range c.Tables {
		if t.Name == name {
			return t, true
		}
	}
	return TableInfo{}, false
}

// Root returns the configured table that the relation with OID oid is, or,
// when the publication reports partitions under their own names
// (publish_via_partition_root off), that it is a partition of. With it on,
// a relation under a partition's own name was written before the setting
// was turned on, or is a table detached since: PartitionOf finds it, and
// only a check made after its transaction tells which.
func (c *Catalog) Root(oid uint32) (string, bool) {
	for _, t := range c.Tables {
		if t.OID == oid && oid != 0 {
			return t.Name, true
		}
		if c.ViaRoot {
			continue
		}
		for _, p := range t.Partitions {
			if p.OID == oid {
				return t.Name, true
			}
		}
	}
	return "", false
}

const catalogPublicationSQL = `SELECT oid, puballtables, pubinsert, pubviaroot, xmin::text::bigint,
	coalesce(to_jsonb(p) ->> 'pubgencols', 'n') IN ('s', 'true')
	FROM pg_publication p WHERE pubname = $1`

// catalogTableSQL reads one table by schema and name: its OID, kind and
// persistence, whether the publication carries it and filters it, the OIDs
// of its membership rows, its partitions as a text array of
// "oid:kind:persistence:flags:joined:schema.name" (flags: "r" for a row
// filter, "c" for a column list of the partition's own, "o" when the
// publication carries it on its own; joined: "xmin/cmin/created", see
// PartitionInfo.Joined), the tables that
// inherit from it without being partitions, its columns as
// "generated:name", and its columns' user types as userTypesSQL gives
// them. A partition's columns have its table's types.
// InsertRulesAndTriggersSQL is two SQL expressions, comma-separated: the
// rules ON INSERT DO INSTEAD, and the enabled BEFORE INSERT row triggers,
// of the table of OID rel and its partitions, each an array of
// "schema.table: name". The WAL source's catalog check reads them
// (TableInfo.InsteadRules, BeforeInsert), and so does the poll source's.
func InsertRulesAndTriggersSQL(rel string) string {
	return `ARRAY(SELECT rn.nspname || '.' || rc.relname || ': ' || rw.rulename FROM pg_rewrite rw
		JOIN pg_class rc ON rc.oid = rw.ev_class JOIN pg_namespace rn ON rn.oid = rc.relnamespace
		WHERE rw.ev_class IN (SELECT ` + rel + ` UNION SELECT rt.relid FROM pg_partition_tree(` + rel + `) rt)
			AND rw.ev_type = '3' AND rw.is_instead ORDER BY 1),
	ARRAY(SELECT tn.nspname || '.' || tc.relname || ': ' || tg.tgname FROM pg_trigger tg
		JOIN pg_class tc ON tc.oid = tg.tgrelid JOIN pg_namespace tn ON tn.oid = tc.relnamespace
		WHERE tg.tgrelid IN (SELECT ` + rel + ` UNION SELECT tt.relid FROM pg_partition_tree(` + rel + `) tt)
			AND NOT tg.tgisinternal AND tg.tgenabled <> 'D' AND tg.tgtype::int & 7 = 7 ORDER BY 1)`
}

var catalogTableSQL = `SELECT c.oid, c.relkind::text, c.relpersistence::text,
	(p.oid IS NOT NULL AND (p.puballtables OR r.oid IS NOT NULL OR pns.oid IS NOT NULL)),
	r.prqual IS NOT NULL, r.prattrs IS NOT NULL, coalesce(r.oid, 0), coalesce(pns.oid, 0),
	coalesce((SELECT d.xmin::text::int8 FROM pg_depend d WHERE pns.oid IS NOT NULL AND d.classid = 'pg_class'::regclass
		AND d.objid = c.oid AND d.objsubid = 0 AND d.refclassid = 'pg_namespace'::regclass AND d.refobjid = c.relnamespace), 0),
	ARRAY(WITH RECURSIVE link(relid, jx, jc) AS (
			-- Each partition's youngest link on its way up to the table:
			-- the links of every partition at once, walking down the tree.
			SELECT i.inhrelid, i.xmin, i.cmin::text::bigint FROM pg_inherits i WHERE i.inhparent = c.oid AND c.relkind = 'p'
			UNION ALL
			SELECT i.inhrelid,
				CASE WHEN age(i.xmin) < age(l.jx) OR i.xmin = l.jx AND i.cmin::text::bigint > l.jc THEN i.xmin ELSE l.jx END,
				CASE WHEN age(i.xmin) < age(l.jx) OR i.xmin = l.jx AND i.cmin::text::bigint > l.jc THEN i.cmin::text::bigint ELSE l.jc END
			FROM pg_inherits i JOIN link l ON i.inhparent = l.relid)
		SELECT t.relid::oid::text || ':' || pc.relkind::text || ':' || pc.relpersistence::text || ':'
			|| coalesce((SELECT CASE WHEN pr.prqual IS NOT NULL THEN 'r' ELSE '' END || CASE WHEN pr.prattrs IS NOT NULL THEN 'c' ELSE '' END
				FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = t.relid), '')
			|| CASE WHEN EXISTS (SELECT 1 FROM pg_publication_rel po WHERE po.prpubid = p.oid AND po.prrelid = t.relid)
				OR EXISTS (SELECT 1 FROM pg_publication_namespace ps WHERE ps.pnpubid = p.oid AND ps.pnnspid = pc.relnamespace) THEN 'o' ELSE '' END
			|| ':' || coalesce(l.jx::text || '/' || l.jc::text, '0/0')
			|| '/' || coalesce((SELECT d.xmin::text FROM pg_depend d WHERE d.classid = 'pg_type'::regclass AND d.objid = pc.reltype
				AND d.refclassid = 'pg_class'::regclass AND d.refobjid = t.relid AND d.deptype = 'i' LIMIT 1), '0')
			|| ':' || pn.nspname || '.' || pc.relname
		FROM pg_partition_tree(c.oid) t JOIN pg_class pc ON pc.oid = t.relid JOIN pg_namespace pn ON pn.oid = pc.relnamespace
			LEFT JOIN link l ON l.relid = t.relid
		WHERE t.relid <> c.oid ORDER BY t.relid),
	ARRAY(WITH RECURSIVE d(oid) AS (
			SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = c.oid
			UNION SELECT i.inhrelid FROM pg_inherits i JOIN d ON i.inhparent = d.oid)
		SELECT dn.nspname || '.' || dc.relname FROM d JOIN pg_class dc ON dc.oid = d.oid
		JOIN pg_namespace dn ON dn.oid = dc.relnamespace
		WHERE NOT dc.relispartition ORDER BY 1),
	` + InsertRulesAndTriggersSQL("c.oid") + `,
	coalesce((SELECT an.nspname || '.' || ac.relname
		FROM pg_partition_ancestors(c.oid) WITH ORDINALITY a(relid, n)
		JOIN pg_class ac ON ac.oid = a.relid JOIN pg_namespace an ON an.oid = ac.relnamespace
		WHERE c.relispartition AND p.pubviaroot AND a.relid <> c.oid
			AND (p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_rel ar WHERE ar.prpubid = p.oid AND ar.prrelid = a.relid)
				OR EXISTS (SELECT 1 FROM pg_publication_namespace ans WHERE ans.pnpubid = p.oid AND ans.pnnspid = ac.relnamespace))
		ORDER BY a.n DESC LIMIT 1), ''),
	ARRAY(SELECT a.attgenerated::text || ':' || a.attname FROM pg_attribute a
		WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum),
	ARRAY(` + userTypesSQL(`SELECT a.atttypid FROM pg_attribute a
			WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
				AND (a.atttypid >= 16384 OR EXISTS (SELECT 1 FROM pg_type dt WHERE dt.oid = a.atttypid AND dt.typtype = 'd'))`) + `)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	LEFT JOIN pg_publication p ON p.pubname = $3
	-- At most one row each: they are unique by publication and table, and
	-- by publication and schema.
	LEFT JOIN pg_publication_rel r ON r.prpubid = p.oid AND r.prrelid = c.oid
	LEFT JOIN pg_publication_namespace pns ON pns.pnpubid = p.oid AND pns.pnnspid = c.relnamespace
	WHERE n.nspname = $1 AND c.relname = $2`

// ReadCatalog reads the publication and every configured table in one
// repeatable-read transaction, after reading the WAL position it reports as
// CheckedAt, and only once that transaction's snapshot holds every
// transaction whose commit record lies before CheckedAt.
//
// That is not the case by itself: a transaction is committed in WAL
// before it becomes visible, and under synchronous replication it stays
// invisible until a standby confirms it, while the logical walsender sends
// it at once. A check that read the catalog then would pass a DDL whose
// commit lies before CheckedAt (a table taken out of the publication, a
// partition created with its first rows). So the first round trip reads,
// after the WAL position, the transactions that wait for a synchronous
// standby; the catalog's snapshot must see them all, or it is read again
// (until ctx ends: then the error names them). Without a standby the gap
// between a commit's WAL record and its visibility is microseconds, against
// the round trip between reading the WAL position and the snapshot.
//
// A read takes two round trips when nothing waits (the relay checks the
// catalog up to ten times a second while it confirms): the WAL position
// and the waiting transactions, then the transaction as one pipeline.
func ReadCatalog(ctx context.Context, conn *pgx.Conn, cfg Config) (Catalog, error) {
	return ReadCatalogSeeing(ctx, conn, cfg, 0)
}

// ReadCatalogSeeing is ReadCatalog whose snapshot must also see the
// transaction xid (0: none), which the caller knows committed (the stream
// carried it): a commit is in WAL, and sent, a moment before it is
// visible, so a read as of a WAL position past it may not see it yet.
func ReadCatalogSeeing(ctx context.Context, conn *pgx.Conn, cfg Config, xid uint32) (Catalog, error) {
	var c Catalog
	var at, sync string
	var waiting []string
	// One statement after another, each with its own snapshot: the waiting
	// transactions are listed after the WAL position was read.
	var b pgx.Batch
	b.Queue("SELECT pg_current_wal_lsn()::text").QueryRow(func(row pgx.Row) error { return row.Scan(&at) })
	b.Queue(committedInvisibleSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&waiting) })
	b.Queue(`SELECT coalesce(string_agg(r.application_name || ' ' || r.sync_state, ', '), '')
		FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
		WHERE s.slot_name = $1 AND r.sync_state <> 'async'`, cfg.Slot).QueryRow(func(row pgx.Row) error { return row.Scan(&sync) })
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		rollback(ctx, conn)
		return c, fmt.Errorf("replication: read the WAL position: %w", err)
	}
	l, err := pglogrepl.ParseLSN(at)
	if err != nil {
		return c, fmt.Errorf("replication: WAL position %q: %w", at, err)
	}
	if xid != 0 {
		waiting = append(waiting, strconv.FormatUint(uint64(xid), 10))
	}
	// However long ctx is, a commit is waited for at most invisibleWait.
	wctx, cancel := context.WithTimeout(ctx, invisibleWait)
	defer cancel()
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		c = Catalog{CheckedAt: LSN(l), SyncStandby: sync}
		if waiting, err = readCatalogAt(ctx, conn, cfg, &c, waiting); err != nil || len(waiting) == 0 {
			return c, err
		}
		if sync != "" {
			// The waiting commits may wait for pgoutbox: Problems says so.
			return c, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-wctx.Done():
			t.Stop()
			return Catalog{}, fmt.Errorf("replication: read the catalog as of %s: transactions %s committed before it are not visible yet (a synchronous standby has not confirmed them; if pgoutbox's own replication connection is a synchronous standby, commits wait for pgoutbox while it waits for them: take its application_name out of synchronous_standby_names): %w",
				c.CheckedAt, strings.Join(waiting, ", "), wctx.Err())
		case <-t.C:
		}
	}
}

// invisibleWait bounds how long a catalog read waits for commits to
// become visible.
const invisibleWait = 10 * time.Second

// committedInvisibleSQL lists the transactions whose commit waits for a
// synchronous standby: committed in WAL, not yet visible. Another role's
// sessions show their wait and transaction only to a superuser or a member
// of pg_read_all_stats; without that, none is listed (see the README).
const committedInvisibleSQL = `SELECT coalesce(array_agg(backend_xid::text ORDER BY backend_xid::text), '{}')
	FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND backend_xid IS NOT NULL`

// readCatalogAt reads the catalog into c in one repeatable-read
// transaction, unless its snapshot still counts one of waiting as running:
// it then returns those, and c is not to be used.
func readCatalogAt(ctx context.Context, conn *pgx.Conn, cfg Config, c *Catalog, waiting []string) ([]string, error) {
	// The snapshot is taken by the first query after BEGIN.
	var b pgx.Batch
	b.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
	// The planner's estimates for the catalog functions (a thousand rows
	// each) put the table query over jit_above_cost on a server with JIT:
	// 1.6 s for a read that takes 3 ms without. SET takes no snapshot.
	b.Queue("SET LOCAL jit = off")
	var snap string
	var failed error // a query's own error, already saying which
	b.Queue("SELECT pg_current_snapshot()::text").QueryRow(func(row pgx.Row) error { return row.Scan(&snap) })
	var xmin int64
	b.Queue(catalogPublicationSQL, cfg.Publication).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&c.Publication, &c.AllTables, &c.Insert, &c.ViaRoot, &xmin, &c.GeneratedColumns)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			err = fmt.Errorf("replication: read publication %q: %w", cfg.Publication, err)
			failed = cmp.Or(failed, err)
			return err
		}
		return nil
	})
	names := cfg.QualifiedTables()
	c.Tables = make([]TableInfo, len(names))
	for i, name := range names {
		schema, table, _ := splitTable(name)
		b.Queue(catalogTableSQL, schema, table, cfg.Publication).QueryRow(func(row pgx.Row) error {
			err := scanTable(row, name, &c.Tables[i], c)
			if err != nil {
				failed = cmp.Or(failed, err)
			}
			return err
		})
	}
	b.Queue("ROLLBACK")
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		// A failed query skips the rest of the pipeline, ROLLBACK too.
		rollback(ctx, conn)
		if failed == nil {
			failed = fmt.Errorf("replication: read the catalog: %w", err)
		}
		return nil, failed
	}
	c.PublicationXmin = uint32(xmin)
	return invisible(snap, waiting)
}

// invisible returns the transactions of waiting (32-bit IDs, as
// pg_stat_activity shows them) that the snapshot snap
// (pg_current_snapshot's "xmin:xmax:xip,...") counts as running: those in
// its list, and those at or after its xmax (which a snapshot does not
// list).
func invisible(snap string, waiting []string) ([]string, error) {
	if len(waiting) == 0 {
		return nil, nil
	}
	f := strings.SplitN(snap, ":", 3)
	if len(f) != 3 {
		return nil, fmt.Errorf("replication: unexpected snapshot %q", snap)
	}
	xmax, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("replication: unexpected snapshot %q", snap)
	}
	running := map[uint32]bool{}
	for x := range strings.SplitSeq(f[2], ",") {
		if x == "" {
			continue
		}
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("replication: unexpected snapshot %q", snap)
		}
		running[uint32(v)] = true
	}
	var still []string
	for _, w := range waiting {
		v, err := strconv.ParseUint(w, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("replication: unexpected transaction ID %q", w)
		}
		// Modulo 2^32, as PostgreSQL compares 32-bit IDs: v precedes xmax.
		if running[uint32(v)] || int32(uint32(v)-uint32(xmax)) >= 0 {
			still = append(still, w)
		}
	}
	return still, nil
}

// rollback ends a transaction a failed pipeline left open, so that the
// connection can be used again.
func rollback(ctx context.Context, conn *pgx.Conn) {
	if !conn.PgConn().IsClosed() && conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_, _ = conn.Exec(rctx, "ROLLBACK")
		cancel()
	}
}

// scanTable reads one row of catalogTableSQL into t (no row: the table
// does not exist), and its user types into c.
func scanTable(row pgx.Row, name string, t *TableInfo, c *Catalog) error {
	*t = TableInfo{Name: name}
	var kind, persistence string
	var parts, cols, types []string
	err := row.Scan(&t.OID, &kind, &persistence, &t.Published, &t.RowFilter, &t.ColumnList, &t.Membership.Rel, &t.Membership.Schema, &t.Membership.SchemaLink, &parts, &t.Inheritors, &t.InsteadRules, &t.BeforeInsert, &t.ReportedAs, &cols, &types)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("replication: read table %s: %w", name, err)
	}
	t.Kind, t.Persistence = kind[0], persistence[0]
	for _, col := range cols {
		gen, name, _ := strings.Cut(col, ":")
		t.Columns = append(t.Columns, name)
		if gen != "" {
			if t.Generated == nil {
				t.Generated = map[string]byte{}
			}
			t.Generated[name] = gen[0]
		}
	}
	if c.UserTypes == nil && len(types) > 0 {
		c.UserTypes = map[uint32]UserType{}
	}
	if err := parseUserTypes(types, c.UserTypes); err != nil {
		return fmt.Errorf("replication: column types of %s: %w", name, err)
	}
	for _, p := range parts {
		pi, err := parsePartition(p)
		if err != nil {
			return fmt.Errorf("replication: partitions of %s: %w", name, err)
		}
		t.Partitions = append(t.Partitions, pi)
	}
	return nil
}

func parsePartition(s string) (PartitionInfo, error) {
	f := strings.SplitN(s, ":", 6)
	if len(f) != 6 || len(f[1]) != 1 || len(f[2]) != 1 {
		return PartitionInfo{}, fmt.Errorf("unexpected partition row %q", s)
	}
	oid, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil {
		return PartitionInfo{}, fmt.Errorf("unexpected partition OID in %q", s)
	}
	j := strings.Split(f[4], "/")
	if len(j) != 3 {
		return PartitionInfo{}, fmt.Errorf("unexpected partition transaction in %q", s)
	}
	var n [3]uint32
	for i, v := range j {
		u, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return PartitionInfo{}, fmt.Errorf("unexpected partition transaction in %q", s)
		}
		n[i] = uint32(u)
	}
	return PartitionInfo{OID: uint32(oid), Kind: f[1][0], Persistence: f[2][0], Name: f[5], Joined: n[0], JoinedCmd: n[1], Created: n[2],
		RowFilter: strings.Contains(f[3], "r"), ColumnList: strings.Contains(f[3], "c"), Own: strings.Contains(f[3], "o")}, nil
}

// Problems lists what, in this catalog alone, keeps inserts into an outbox
// table out of the stream, each with its fix. Empty means nothing does.
func (c *Catalog) Problems(cfg Config) []string {
	var out []string
	pub := quoteIdent(cfg.Publication)
	if c.Publication == 0 {
		return []string{fmt.Sprintf("publication %q does not exist: create it (pgoutbox migrate)", cfg.Publication)}
	}
	if !c.Insert {
		out = append(out, fmt.Sprintf("publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", cfg.Publication, pub))
	}
	if c.SyncStandby != "" {
		out = append(out, fmt.Sprintf("the replication connection of slot %q is a synchronous standby (%s): synchronous_standby_names takes it in (as '*' does), so commits can wait for pgoutbox, which confirms them only once it sees them in the catalog; list only real standbys there",
			cfg.Slot, c.SyncStandby))
	}
	if c.AllTables && !c.ViaRoot && c.Partitioned() {
		// Rows of a partition then arrive under the partition's own name,
		// and in a stream of every table a partition the catalog no longer
		// lists (detached or dropped before pgoutbox read its rows, as
		// while it is behind) cannot be told from any other table: its
		// events would be skipped without a word. (A publication FOR TABLE
		// carries no other tables, so there such a row stops pgoutbox.)
		out = append(out, fmt.Sprintf("publication %q is FOR ALL TABLES and reports the changes of partitions under their own names (publish_via_partition_root is off), so the rows of a partition of an outbox table detached or dropped before pgoutbox read them could not be told from another table's and would be skipped: ALTER PUBLICATION %s SET (publish_via_partition_root = true) while pgoutbox is stopped and caught up",
			cfg.Publication, pub))
	}
	for _, t := range c.Tables {
		switch {
		case t.OID == 0:
			out = append(out, fmt.Sprintf("outbox table %s does not exist: create it (pgoutbox migrate) or correct postgres.table.include.list", t.Name))
			continue
		case t.Kind != 'r' && t.Kind != 'p':
			out = append(out, fmt.Sprintf("%s is not a table (relkind %q): its rows are not decoded", t.Name, t.Kind))
		case t.Persistence != 'p':
			out = append(out, fmt.Sprintf("outbox table %s is %s: its rows are never written to the WAL, so no event would ever be relayed: ALTER TABLE %s SET LOGGED",
				t.Name, persistenceName(t.Persistence), quoteTable(t.Name)))
		}
		if !t.Published {
			out = append(out, fmt.Sprintf("publication %q does not include table %s: ALTER PUBLICATION %s ADD TABLE %s", cfg.Publication, t.Name, pub, quoteTable(t.Name)))
		}
		if t.RowFilter {
			out = append(out, fmt.Sprintf("publication %q has a row filter (WHERE) on %s: rows it filters out are never sent, so events would be lost silently: ALTER PUBLICATION %s SET TABLE %s without a WHERE clause",
				cfg.Publication, t.Name, pub, quoteTable(t.Name)))
		}
		if t.ColumnList {
			out = append(out, fmt.Sprintf("publication %q publishes only some columns of %s: ALTER PUBLICATION %s SET TABLE %s without a column list",
				cfg.Publication, t.Name, pub, quoteTable(t.Name)))
		}
		if t.ReportedAs != "" && !slices.Contains(cfg.QualifiedTables(), t.ReportedAs) {
			// Its rows arrive as the ancestor's, which is no outbox table:
			// in a FOR ALL TABLES or schema stream they would be skipped as
			// another table's.
			out = append(out, fmt.Sprintf("outbox table %s is a partition of %s, and publication %q reports the changes of partitions under the topmost table it carries (publish_via_partition_root), so its inserts arrive as %s's, which is not an outbox table: configure %s as the outbox table (its rows are all events), or publish %s on its own in a publication without publish_via_partition_root",
				t.Name, t.ReportedAs, cfg.Publication, t.ReportedAs, t.ReportedAs, t.Name))
		}
		for _, r := range t.InsteadRules {
			out = append(out, fmt.Sprintf("rule %s replaces the inserts into outbox table %s (ON INSERT DO INSTEAD): the rows it keeps out are never written there, so their events would never reach the stream; drop the rule (DROP RULE), or configure the table it writes into",
				r, t.Name))
		}
		for _, h := range t.Inheritors {
			out = append(out, fmt.Sprintf("table %s inherits from outbox table %s by table inheritance (INHERITS, not as a partition), so PostgreSQL decodes the rows inserted into it as %s's, not the outbox's, and a publication of %s takes in only the children it had when it was made; events inserted into %s would be missed: insert into %s itself, or partition it declaratively (PARTITION BY) and attach such tables as partitions",
				h, t.Name, h, t.Name, h, t.Name))
		}
		for _, p := range t.Partitions {
			switch {
			case p.Kind == 'f':
				out = append(out, fmt.Sprintf("partition %s of outbox table %s is a foreign table: rows inserted into it are not in this server's WAL", p.Name, t.Name))
			case p.Persistence != 'p':
				out = append(out, fmt.Sprintf("partition %s of outbox table %s is %s: its rows are never written to the WAL: ALTER TABLE %s SET LOGGED",
					p.Name, t.Name, persistenceName(p.Persistence), quoteTable(p.Name)))
			}
			if !c.ViaRoot && p.Own {
				// Its rows arrive under its own OID, attached or not: once
				// detached, they could not be told from the outbox's.
				out = append(out, fmt.Sprintf("publication %q carries partition %s of outbox table %s on its own (it is listed, or its schema is) and reports partitions under their own names (publish_via_partition_root is off): once detached, its rows would still arrive under the same OID and be taken for %s's: ALTER PUBLICATION %s SET (publish_via_partition_root = true), or publish the partition only through its table",
					cfg.Publication, p.Name, t.Name, t.Name, pub))
			}
			// Through the root, PostgreSQL applies the root's filters.
			if !c.ViaRoot && p.RowFilter {
				out = append(out, fmt.Sprintf("publication %q has a row filter (WHERE) on partition %s of outbox table %s, which applies without publish_via_partition_root: rows it filters out are never sent, so events would be lost silently: ALTER PUBLICATION %s DROP TABLE %s",
					cfg.Publication, p.Name, t.Name, pub, quoteTable(p.Name)))
			}
			if !c.ViaRoot && p.ColumnList {
				out = append(out, fmt.Sprintf("publication %q publishes only some columns of partition %s of outbox table %s: ALTER PUBLICATION %s DROP TABLE %s",
					cfg.Publication, p.Name, t.Name, pub, quoteTable(p.Name)))
			}
		}
	}
	return out
}

// SentColumn says whether logical decoding sends column col of table t: it
// exists and is not generated, or is a stored generated one the
// publication sends (PostgreSQL 18). why says what is wrong otherwise.
func (c *Catalog) SentColumn(t TableInfo, col string) (ok bool, why string) {
	if !slices.Contains(t.Columns, col) {
		return false, fmt.Sprintf("is not a column of outbox table %s", t.Name)
	}
	switch g := t.Generated[col]; {
	case g == 0:
		return true, ""
	case g == 's' && c.GeneratedColumns:
		return true, ""
	}
	return false, fmt.Sprintf("is a generated column of outbox table %s, whose values logical decoding does not send (PostgreSQL 18 sends stored ones with the publication's publish_generated_columns = stored)", t.Name)
}

// Partitioned reports whether any configured table is partitioned.
func (c *Catalog) Partitioned() bool {
	for _, t := range c.Tables {
		if t.Kind == 'p' {
			return true
		}
	}
	return false
}

// Changes compares a catalog read later (now) with this one, read when the
// session started, and describes every change that can keep an insert out
// of the stream. Partitions attached or detached are not changes: the relay
// classifies new partitions as it meets them.
func (c *Catalog) Changes(now *Catalog, cfg Config) []string {
	var out []string
	switch {
	case now.Publication == 0:
		return []string{fmt.Sprintf("publication %q was dropped", cfg.Publication)}
	case now.Publication != c.Publication:
		out = append(out, fmt.Sprintf("publication %q was dropped and created again (OID %d, now %d): PostgreSQL may skip the changes in between",
			cfg.Publication, c.Publication, now.Publication))
	}
	if now.ViaRoot != c.ViaRoot && c.Partitioned() {
		out = append(out, fmt.Sprintf("publication %q changed publish_via_partition_root from %v to %v: partitions' changes now report under other names", cfg.Publication, c.ViaRoot, now.ViaRoot))
	}
	for _, t := range c.Tables {
		n, _ := now.Table(t.Name)
		switch {
		case n.OID == 0:
			out = append(out, fmt.Sprintf("outbox table %s was dropped or renamed", t.Name))
		case n.OID != t.OID:
			out = append(out, fmt.Sprintf("outbox table %s was dropped and created again (OID %d, now %d): the new table's rows are not in the stream", t.Name, t.OID, n.OID))
		case now.Publication == c.Publication:
			out = append(out, now.leftPublication(t.Name, t.Membership, n.Membership, "the session started", cfg)...)
		}
	}
	for _, p := range now.Problems(cfg) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// Altered describes the publication's catalog row written since (xmin,
// read when the session started or recorded in the state table), or ""
// when it is the same or nothing was recorded. It is a warning, not a
// change that stops the relay: the row is written by ALTER PUBLICATION ...
// SET (publish = ...) and back, which can have kept inserts out for a
// while without a trace, but also by OWNER TO, REASSIGN OWNED, a RENAME
// and back, and by a SET that changes nothing (as tools that reconcile
// publications run), which cannot.
func (c *Catalog) Altered(was uint32, since string, cfg Config) string {
	if was == 0 || c.PublicationXmin == 0 || was == c.PublicationXmin {
		return ""
	}
	return fmt.Sprintf("publication %q was altered since %s (its catalog row was written by transaction %d, before by %d: ALTER PUBLICATION ... SET, OWNER TO, RENAME): if it stopped publishing inserts for a while (publish = 'update' and back), the events committed then were never decoded, and no trace of that remains; compare the outbox with Kafka over that time",
		cfg.Publication, since, c.PublicationXmin, was)
}

// leftPublication describes a table whose membership in the publication
// (was, now) did not last throughout: it was taken out and put back, or its
// row filter or column list changed. A publication FOR ALL TABLES, or
// nothing recorded, tells nothing.
func (c *Catalog) leftPublication(table string, was, now Membership, since string, cfg Config) []string {
	// Out now is a problem of its own (Problems): not in the publication.
	if c.AllTables || was == (Membership{}) || now == (Membership{}) || now.Kept(was) {
		return nil
	}
	if was.Rel == 0 && now.Rel == 0 && was.Schema == now.Schema {
		return []string{fmt.Sprintf("outbox table %s, which publication %q carries only as part of its schema, was moved to another schema and back since %s (ALTER TABLE ... SET SCHEMA; its dependency on the schema was written by transaction %d, before by %d): inserts committed while it was elsewhere were never decoded, and no trace of that remains; add the table to the publication by name (ALTER PUBLICATION ... ADD TABLE) so that it follows the table",
			table, cfg.Publication, since, now.SchemaLink, was.SchemaLink)}
	}
	return []string{fmt.Sprintf("outbox table %s was taken out of publication %q and put back since %s, or its row filter or column list changed (pg_publication_rel row %d, now %d; schema's pg_publication_namespace row %d, now %d): inserts committed while it was out were never decoded, and no trace of that remains",
		table, cfg.Publication, since, was.Rel, now.Rel, was.Schema, now.Schema)}
}

func persistenceName(p byte) string {
	switch p {
	case 'u':
		return "UNLOGGED"
	case 't':
		return "TEMPORARY"
	}
	return fmt.Sprintf("of persistence %q", p)
}

// quoteTable quotes a schema.table name for a fix in a message.
func quoteTable(name string) string {
	schema, table, err := splitTable(name)
	if err != nil {
		return name
	}
	return quoteIdent(schema) + "." + quoteIdent(table)
}

// PublicationInfo is a publication as status and validate show it.
type PublicationInfo struct {
	Name   string
	Exists bool
	Insert bool
	// Update: the publication publishes updates (publish includes
	// 'update'); pgoutbox's own publishes inserts only.
	Update    bool
	AllTables bool
	// Tables are pg_publication_tables' schema.table entries, sorted:
	// what the publication carries as it reports it.
	Tables []string
}

// ReadPublication reads a publication and the tables it carries.
func ReadPublication(ctx context.Context, conn *pgx.Conn, name string) (PublicationInfo, error) {
	p := PublicationInfo{Name: name, Tables: []string{}}
	err := conn.QueryRow(ctx, "SELECT pubinsert, pubupdate, puballtables FROM pg_publication WHERE pubname = $1", name).Scan(&p.Insert, &p.Update, &p.AllTables)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("replication: read publication %q: %w", name, err)
	}
	p.Exists = true
	rows, err := conn.Query(ctx, "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1", name)
	if err != nil {
		return p, fmt.Errorf("replication: tables of publication %q: %w", name, err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return p, fmt.Errorf("replication: tables of publication %q: %w", name, err)
	}
	if tables != nil {
		p.Tables = tables
	}
	return p, nil
}
