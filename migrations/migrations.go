// Package migrations holds pgoutbox's own SQL: the default outbox tables,
// the publication and the state table, embedded in the binary and applied by
// `pgoutbox migrate`.
//
// Every name is quoted with the driver's identifier quoting and every value
// passed as a query parameter: no SQL is built by pasting a name.
package migrations

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/replication"
)

//go:embed 0001_outbox.sql
var outboxSQL string

var outboxTemplate = template.Must(template.New("0001_outbox.sql").Option("missingkey=error").Parse(outboxSQL))

// Params name the objects the migrations create.
type Params struct {
	// Tables are the schema-qualified outbox tables, e.g. public.outbox.
	Tables      []string
	Publication string
	// PublicationAutocreate is postgres.publication.autocreate.mode: with
	// all_tables the publication is created FOR ALL TABLES, as run creates
	// it; any other mode (or none) creates it FOR TABLE the outbox tables.
	PublicationAutocreate string
	// StateTableDDL creates the relay's state table ("" for none).
	StateTableDDL string
}

// Ident quotes a schema.table (or a plain) name with the driver's quoting.
func Ident(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) == 1 {
		parts = []string{"public", name}
	}
	if len(parts) != 2 {
		return "", fmt.Errorf("migrations: %q is not schema.table", name)
	}
	for _, p := range parts {
		if p == "" || len(p) > 63 {
			return "", fmt.Errorf("migrations: %q: each part of a name has 1 to 63 bytes", name)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

func pubIdent(name string) (string, error) {
	if name == "" || len(name) > 63 {
		return "", fmt.Errorf("migrations: publication name %q: use 1 to 63 bytes", name)
	}
	return pgx.Identifier{name}.Sanitize(), nil
}

// tableSQL renders the CREATE TABLE of one outbox table.
func tableSQL(table string) (string, error) {
	q, err := Ident(table)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := outboxTemplate.Execute(&b, map[string]string{"Table": q, "KeepTriggerName": KeepTrigger}); err != nil {
		return "", fmt.Errorf("migrations: render %s: %w", table, err)
	}
	return b.String(), nil
}

// createPublicationSQL creates p's publication exactly as run would
// (replication.CreatePublicationSQL: FOR TABLE the outbox tables, or FOR
// ALL TABLES with publication.autocreate.mode all_tables; inserts only;
// partitions' changes under their partitioned table's name). One function
// for both, so a publication made by migrate and one made by run cannot
// differ: migrate once made FOR TABLE where run makes FOR ALL TABLES.
func createPublicationSQL(p Params) (string, error) {
	if _, err := pubIdent(p.Publication); err != nil {
		return "", err
	}
	for _, t := range p.Tables {
		if _, err := Ident(t); err != nil {
			return "", err
		}
	}
	return replication.CreatePublicationSQL(replication.Config{
		Publication:           p.Publication,
		Tables:                p.Tables,
		PublicationAutocreate: p.PublicationAutocreate,
	}) + ";", nil
}

// Render returns the SQL Apply runs, for `pgoutbox migrate --print`. The
// publication's statements depend on what exists: both forms are given, the
// second as comments.
func Render(p Params) ([]string, error) {
	var out []string
	for _, t := range p.Tables {
		s, err := tableSQL(t)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	create, err := createPublicationSQL(p)
	if err != nil {
		return nil, err
	}
	out = append(out, "-- when the publication does not exist:\n"+create)
	qp, _ := pubIdent(p.Publication)
	for _, t := range p.Tables {
		q, _ := Ident(t)
		out = append(out, fmt.Sprintf("-- when it exists without %s:\n-- ALTER PUBLICATION %s ADD TABLE %s;", t, qp, q))
	}
	if p.StateTableDDL != "" {
		out = append(out, p.StateTableDDL+";")
	}
	return out, nil
}

// Apply creates what is missing, in one transaction: the outbox tables, the
// publication (or adds the tables to an existing one), the state table. It
// is idempotent.
func Apply(ctx context.Context, conn *pgx.Conn, p Params) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	for _, t := range p.Tables {
		s, err := tableSQL(t)
		if err != nil {
			return err
		}
		if err := createAgain(ctx, tx, s); err != nil {
			return fmt.Errorf("migrations: create table %s: %w", t, err)
		}
	}
	if err := ensurePublication(ctx, tx, p); err != nil {
		return err
	}
	if p.StateTableDDL != "" {
		if err := createAgain(ctx, tx, p.StateTableDDL); err != nil {
			return fmt.Errorf("migrations: create the state table: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: commit: %w", err)
	}
	return nil
}

// create runs sql, which makes objects, in a savepoint of tx. When another
// migrate or a starting relay made one of them at the same moment
// (replication.CreatedConcurrently), the savepoint is rolled back, so that
// the transaction goes on, and raced says so: the caller looks again, and
// goes on as with an object that existed.
func create(ctx context.Context, tx pgx.Tx, sql string) (raced bool, err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, err
	}
	if _, err := sp.Exec(ctx, sql); err != nil {
		if replication.CreatedConcurrently(err) {
			if rerr := sp.Rollback(ctx); rerr != nil {
				return false, errors.Join(err, rerr)
			}
			return true, err
		}
		return false, err
	}
	return false, sp.Commit(ctx)
}

// createAgain runs sql, statements that make only what is missing (IF NOT
// EXISTS), with create, and runs it again after a race: the other
// session's objects are then found and skipped.
func createAgain(ctx context.Context, tx pgx.Tx, sql string) error {
	raced, err := create(ctx, tx, sql)
	if raced {
		_, err = create(ctx, tx, sql)
	}
	return err
}

func ensurePublication(ctx context.Context, tx pgx.Tx, p Params) error {
	var oid uint32
	var all bool
	err := tx.QueryRow(ctx, "SELECT oid, puballtables FROM pg_publication WHERE pubname = $1", p.Publication).Scan(&oid, &all)
	if errors.Is(err, pgx.ErrNoRows) {
		sql, err := createPublicationSQL(p)
		if err != nil {
			return err
		}
		raced, err := create(ctx, tx, sql)
		if raced {
			// Made by another instance just now: read it, and add
			// what it lacks, as to one that existed.
			err = tx.QueryRow(ctx, "SELECT oid, puballtables FROM pg_publication WHERE pubname = $1", p.Publication).Scan(&oid, &all)
		} else if err == nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("migrations: create publication %q: %w", p.Publication, err)
		}
	} else if err != nil {
		return fmt.Errorf("migrations: read publication %q: %w", p.Publication, err)
	}
	if all {
		return nil
	}
	qp, _ := pubIdent(p.Publication)
	for _, t := range p.Tables {
		q, err := Ident(t)
		if err != nil {
			return err
		}
		var member bool
		err = tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication_rel WHERE prpubid = $1 AND prrelid = $2::regclass)", oid, q).Scan(&member)
		if err != nil {
			return fmt.Errorf("migrations: publication %q and table %s: %w", p.Publication, t, err)
		}
		if member {
			continue
		}
		// 42710 (CreatedConcurrently): a member through its schema, or
		// added by another instance at the same moment.
		if raced, err := create(ctx, tx, "ALTER PUBLICATION "+qp+" ADD TABLE "+q); err != nil && !raced {
			return fmt.Errorf("migrations: add table %s to publication %q: %w", t, p.Publication, err)
		}
	}
	return nil
}
