package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrRowSecurity is wrapped by the error of a table whose row-level
// security policies apply to pgoutbox's role: the rows they hide would
// never be seen by the poll source or the initial snapshot (logical
// decoding ignores row security, the queries do not), and nothing would say
// so. pgoutbox's SQL connections run with row_security off, so that such a
// query fails instead of returning fewer rows; this error says it first,
// and how to fix it.
var ErrRowSecurity = errors.New("replication: row-level security hides rows of an outbox table from pgoutbox's role")

// rowSecuritySQL says whether row security applies to the current role on
// the table: it is enabled, and the role is no superuser, has no
// BYPASSRLS and does not own the table (or FORCE ROW LEVEL SECURITY holds
// owners to it too).
const rowSecuritySQL = `SELECT c.relrowsecurity AND NOT (r.rolsuper OR r.rolbypassrls
		OR (pg_has_role(c.relowner, 'USAGE') AND NOT c.relforcerowsecurity)), current_user
	FROM pg_class c, pg_roles r WHERE c.oid = to_regclass($1) AND r.rolname = current_user`

// CheckRowSecurity fails, wrapping ErrRowSecurity, when row-level security
// applies to the current role on table (schema.table). A table that does
// not exist passes: its readers say so.
func CheckRowSecurity(ctx context.Context, conn *pgx.Conn, table string) error {
	var applies bool
	var role string
	err := conn.QueryRow(ctx, rowSecuritySQL, quoteTable(table)).Scan(&applies, &role)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("replication: row-level security of %s: %w", table, err)
	case applies:
		return fmt.Errorf("%w: %s has row-level security enabled and role %q is subject to it, so the rows its policies hide would never be read: ALTER ROLE %s BYPASSRLS, or let the table's owner run pgoutbox (without FORCE ROW LEVEL SECURITY)",
			ErrRowSecurity, table, role, quoteIdent(role))
	}
	return nil
}
