package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// guardComment starts the comment on the pgoutbox_guard event trigger that
// lists, as a JSON array, the state tables the guard reads. The triggers
// have one name per database: without the list, a second deployment's
// migrate --guard (with another postgres.state.table) replaced the first
// one's guard by one that protected only its own publication and tables.
const guardComment = "pgoutbox migrate --guard protects what these state tables record: "

// guardLock serializes installs of the guard, each of which reads the
// list of state tables and writes it back merged.
const guardLock = "pgoutbox migrate --guard"

// oldGuardTable finds the one state table a guard installed by an earlier
// version reads (its body names it, and it has no comment).
var oldGuardTable = regexp.MustCompile(`to_regclass\('((?:[^']|'')*)'\)`)

// Guard is what the guard of migrate --guard in a database protects.
type Guard struct {
	// Installed says both event triggers exist.
	Installed bool
	// Disabled names those of them that exist but are disabled (ALTER
	// EVENT TRIGGER ... DISABLE), or fire in replica mode only (ENABLE
	// REPLICA): they refuse nothing in an ordinary session.
	Disabled []string
	// OriginOnly names those of them that fire in origin mode only
	// (evtenabled 'O': ALTER EVENT TRIGGER ... ENABLE, and what earlier
	// versions installed): a session whose session_replication_role is
	// replica (a superuser's, pg_restore --disable-triggers, pglogical)
	// is refused nothing. InstallGuard makes them fire always.
	OriginOnly []string
	// StateTables lists the state tables (schema.table) whose records
	// the guard protects.
	StateTables []string
}

// String says, in a line, what g protects.
func (g Guard) String() string {
	if !g.Installed {
		return "not installed (pgoutbox migrate --guard installs it)"
	}
	s := "installed, protecting what state table(s) " + strings.Join(g.StateTables, ", ") + " record"
	if len(g.Disabled) > 0 {
		s += "; but event trigger(s) " + strings.Join(g.Disabled, ", ") + " are disabled and refuse nothing (ALTER EVENT TRIGGER ... ENABLE ALWAYS)"
	}
	if len(g.OriginOnly) > 0 {
		s += "; but event trigger(s) " + strings.Join(g.OriginOnly, ", ") + " fire in origin mode only, so a session with session_replication_role = replica is refused nothing (pgoutbox migrate --guard, as a superuser, makes them fire always)"
	}
	return s
}

// Protects says whether g protects what stateTable records.
func (g Guard) Protects(stateTable string) bool {
	return g.Installed && len(g.Disabled) == 0 && slices.Contains(g.StateTables, qualifiedName(stateTable))
}

// qualifiedName is t as schema.table (public when t names no schema).
func qualifiedName(t string) string {
	if strings.IndexByte(t, '.') < 0 {
		return "public." + t
	}
	return t
}

// ReadGuard reads which guard the database has and what it protects.
func ReadGuard(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (Guard, error) {
	var g Guard
	rows, err := q.Query(ctx, `SELECT e.evtname::text, e.evtenabled::text, coalesce(obj_description(e.oid, 'pg_event_trigger'), ''), coalesce(p.prosrc, '')
		FROM pg_event_trigger e LEFT JOIN pg_proc p ON p.oid = e.evtfoid
		WHERE e.evtname IN ('pgoutbox_guard', 'pgoutbox_guard_ddl') ORDER BY e.evtname`)
	if err != nil {
		return g, fmt.Errorf("replication: read the event triggers of migrate --guard: %w", err)
	}
	defer rows.Close()
	found := 0
	for rows.Next() {
		var name, enabled, comment, src string
		if err := rows.Scan(&name, &enabled, &comment, &src); err != nil {
			return g, fmt.Errorf("replication: read the event triggers of migrate --guard: %w", err)
		}
		found++
		switch enabled {
		case "D", "R":
			g.Disabled = append(g.Disabled, name)
		case "O":
			g.OriginOnly = append(g.OriginOnly, name)
		}
		if name != "pgoutbox_guard" {
			continue
		}
		if rest, ok := strings.CutPrefix(comment, guardComment); ok {
			if err := json.Unmarshal([]byte(rest), &g.StateTables); err != nil {
				return g, fmt.Errorf("replication: the comment on event trigger pgoutbox_guard lists no state tables (%q): %w; run pgoutbox migrate --guard with each configuration of this database", comment, err)
			}
			continue
		}
		// Installed by an earlier version, for one state table.
		if m := oldGuardTable.FindStringSubmatch(src); m != nil {
			if t, ok := unquoteQualified(strings.ReplaceAll(m[1], "''", "'")); ok {
				g.StateTables = append(g.StateTables, t)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return g, fmt.Errorf("replication: read the event triggers of migrate --guard: %w", err)
	}
	g.Installed = found == 2
	return g, nil
}

// unquoteQualified reads "schema"."table" (quoteIdent's form) back as
// schema.table.
func unquoteQualified(s string) (string, bool) {
	var parts []string
	for range 2 {
		if !strings.HasPrefix(s, `"`) {
			return "", false
		}
		var b strings.Builder
		i := 1
		for ; i < len(s); i++ {
			if s[i] != '"' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			break
		}
		if i >= len(s) {
			return "", false
		}
		parts = append(parts, b.String())
		s = s[i+1:]
		if len(parts) == 1 {
			if !strings.HasPrefix(s, ".") {
				return "", false
			}
			s = s[1:]
		}
	}
	if s != "" {
		return "", false
	}
	return parts[0] + "." + parts[1], true
}

// InstallGuard installs (or replaces) the guard of migrate --guard so that
// it protects what stateTable records, besides what every state table the
// guard already installed protects: each deployment of pgoutbox on the
// database keeps its own state table, and the event triggers are one pair
// per database. It returns the state tables the guard now reads. It needs a
// superuser (event triggers).
func InstallGuard(ctx context.Context, conn *pgx.Conn, stateTable string) ([]string, error) {
	if stateTable == "" {
		return nil, errors.New("replication: the guard reads what to protect from the state table, and postgres.state.table is empty")
	}
	if _, err := qualifiedIdent(stateTable); err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("replication: install the guard: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", guardLock); err != nil {
		return nil, fmt.Errorf("replication: install the guard: take its lock: %w", err)
	}
	g, err := ReadGuard(ctx, tx)
	if err != nil {
		return nil, err
	}
	// This configuration's first: the functions go in its schema.
	tables := []string{qualifiedName(stateTable)}
	for _, t := range g.StateTables {
		if !slices.Contains(tables, t) {
			tables = append(tables, t)
		}
	}
	stmts, err := GuardSQL(tables...)
	if err != nil {
		return nil, err
	}
	list, err := json.Marshal(tables)
	if err != nil {
		return nil, err
	}
	stmts = append(stmts, "COMMENT ON EVENT TRIGGER pgoutbox_guard IS "+quoteLiteral(guardComment+string(list)),
		// An event trigger fires by default only in sessions whose
		// session_replication_role is origin: in one set to replica (a
		// superuser's, pg_restore --disable-triggers, pglogical) the DDL
		// the guard refuses went through.
		"ALTER EVENT TRIGGER pgoutbox_guard ENABLE ALWAYS",
		"ALTER EVENT TRIGGER pgoutbox_guard_ddl ENABLE ALWAYS")
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
				return nil, fmt.Errorf("replication: install the guard: %w; event triggers need a superuser: run pgoutbox migrate --guard as one", err)
			}
			return nil, fmt.Errorf("replication: install the guard: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("replication: install the guard: commit: %w", err)
	}
	return tables, nil
}
