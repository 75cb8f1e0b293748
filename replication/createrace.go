package replication

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// CreatedConcurrently reports whether err is what PostgreSQL returns to a
// statement that makes an object (CREATE TABLE … IF NOT EXISTS, CREATE
// INDEX … IF NOT EXISTS, CREATE PUBLICATION after finding none) when
// another session made the same object at the same moment, as two
// replicas starting together on a fresh database do. IF NOT EXISTS looks
// in the catalog before it inserts there, and nothing orders that against
// the other session: the later insert into the catalog's unique index
// waits for the other transaction and, once it commits, fails with
// unique_violation (23505, e.g. on pg_type_typname_nsp_index) instead of
// skipping; a session that looks a little later gets duplicate_table
// (42P07) or duplicate_object (42710). The caller then looks the object up
// again and goes on as with one that existed before; any other error, or
// an object still missing, stays an error.
func CreatedConcurrently(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "23505", "42P07", "42710": // unique_violation, duplicate_table, duplicate_object
		return true
	}
	return false
}
