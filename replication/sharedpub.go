package replication

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PublicationSharer is another slot of the database whose last pgoutbox
// session streamed other outbox tables through the same publication
// (PublicationSharers): another team's relay, most likely, both left at
// the default postgres.publication.name.
type PublicationSharer struct {
	Slot string
	// Tables are the outbox tables its state row records (schema.table),
	// none of them one of this configuration's; Carried are those the
	// publication carries now.
	Tables, Carried []string
}

// PublicationSharers names the other existing slots of this database, in
// cfg's state table, whose state row records cfg's publication and only
// outbox tables that cfg does not configure. A relay stops on the first
// row of a table its publication (not FOR ALL TABLES) carries and it does
// not relay, so two relays of disjoint tables cannot share a publication:
// adding one's tables to it stops the other. Slots that relay some of the
// same tables (regions relaying the same events to their own clusters, a
// blue/green pair) are not named. Without a state table there is none.
func PublicationSharers(ctx context.Context, conn *pgx.Conn, cfg Config) ([]PublicationSharer, error) {
	if cfg.StateTable == "" {
		return nil, nil
	}
	exists, err := StateTableExists(ctx, conn, cfg.StateTable)
	if err != nil || !exists {
		return nil, err
	}
	q, err := qualifiedIdent(cfg.StateTable)
	if err != nil {
		return nil, err
	}
	// The state row keeps tables as schema.table, unquoted (no dot in
	// either part).
	rows, err := conn.Query(ctx, `SELECT t.slot_name,
		coalesce((SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(t.table_oids) k), '{}'),
		coalesce((SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(t.table_oids) k,
			LATERAL (SELECT to_regclass(format('%I.%I', split_part(k, '.', 1), split_part(k, '.', 2)))::oid AS oid) c
			WHERE c.oid IS NOT NULL AND (p.puballtables
				OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = c.oid)
				OR EXISTS (SELECT 1 FROM pg_publication_namespace n JOIN pg_class k2 ON k2.relnamespace = n.pnnspid
					WHERE n.pnpubid = p.oid AND k2.oid = c.oid))), '{}')
		FROM `+q+` t
		JOIN pg_replication_slots s ON s.slot_name = t.slot_name AND s.database = current_database()
		JOIN pg_publication p ON p.pubname = t.publication_name
		WHERE t.slot_name <> $1 AND t.publication_name = $2 AND jsonb_typeof(t.table_oids) = 'object'
		ORDER BY 1`, cfg.Slot, cfg.Publication)
	if err != nil {
		return nil, fmt.Errorf("replication: read the state table %s: %w", cfg.StateTable, err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PublicationSharer, error) {
		var p PublicationSharer
		return p, r.Scan(&p.Slot, &p.Tables, &p.Carried)
	})
	if err != nil {
		return nil, fmt.Errorf("replication: read the state table %s: %w", cfg.StateTable, err)
	}
	ours := cfg.QualifiedTables()
	var out []PublicationSharer
	for _, p := range all {
		if len(p.Tables) == 0 || slices.ContainsFunc(p.Tables, func(t string) bool { return slices.Contains(ours, t) }) {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// SharedPublicationProblem says that publication is another relay's too
// and, as the fix, that each relay needs one of its own: "what: fix", as
// Catalog.Problems; "" when sharers is empty.
func SharedPublicationProblem(cfg Config, sharers []PublicationSharer) string {
	if len(sharers) == 0 {
		return ""
	}
	what, fix := SharedPublicationFix(cfg, sharers)
	return what + ": " + fix
}

// SharedPublicationFix is SharedPublicationProblem in its two parts.
func SharedPublicationFix(cfg Config, sharers []PublicationSharer) (what, fix string) {
	names := make([]string, len(sharers))
	for i, s := range sharers {
		names[i] = fmt.Sprintf("slot %q (outbox tables %s)", s.Slot, strings.Join(s.Tables, ", "))
	}
	what = fmt.Sprintf("publication %q is used by another pgoutbox relay of this database, %s, as state table %s records, and a relay stops on the rows of a table its publication carries that it does not relay (or, listed in postgres.table.include.list, sends the other relay's events to its own topics)",
		cfg.Publication, strings.Join(names, "; "), cfg.StateTable)
	fix = fmt.Sprintf("each relay needs a publication of its own: set postgres.publication.name to a name of this configuration's own and run pgoutbox migrate, which creates it with %s; leave the other relay's publication and its tables as they are",
		strings.Join(cfg.QualifiedTables(), ", "))
	return what, fix
}

// SharedPublication is the problem to list first when cfg's publication is
// another relay's too (PublicationSharers): when problems (cat's) already
// keep this relay from starting, whose other fixes would not help, or when
// the publication (not FOR ALL TABLES) carries the other relay's tables,
// whose first row would stop this relay. "" when neither applies. The
// state table is read for advice only: an error reading it leaves the
// problems as they are (the start reads it again and says so).
func SharedPublication(ctx context.Context, conn *pgx.Conn, cfg Config, cat *Catalog, problems []string) string {
	sharers, err := PublicationSharers(ctx, conn, cfg)
	if err != nil || len(sharers) == 0 {
		return ""
	}
	carried := slices.ContainsFunc(sharers, func(s PublicationSharer) bool { return len(s.Carried) > 0 })
	if len(problems) == 0 && (cat.AllTables || !carried) {
		return ""
	}
	return SharedPublicationProblem(cfg, sharers)
}
