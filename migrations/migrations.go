// Package migrations holds pgoutbox's own SQL: the default outbox table and
// the publication, embedded in the binary and applied by `pgoutbox migrate`.
package migrations

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var files embed.FS

// Params name the objects the migrations create.
type Params struct {
	Table       string // schema-qualified outbox table, e.g. public.outbox
	Publication string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Render returns the SQL of every migration, in order, for p.
func Render(p Params) ([]string, error) {
	schema, table := "public", p.Table
	if i := strings.IndexByte(p.Table, '.'); i >= 0 {
		schema, table = p.Table[:i], p.Table[i+1:]
	}
	if !identRE.MatchString(schema) || !identRE.MatchString(table) {
		return nil, fmt.Errorf("migrations: invalid table %q: use schema.table with plain identifiers", p.Table)
	}
	if !identRE.MatchString(p.Publication) {
		return nil, fmt.Errorf("migrations: invalid publication name %q", p.Publication)
	}
	data := map[string]string{
		"Table":              quote(schema) + "." + quote(table),
		"Publication":        quote(p.Publication),
		"PublicationLiteral": "'" + p.Publication + "'",
		"TableLiteral":       "'" + strings.ReplaceAll(quote(schema)+"."+quote(table), "'", "''") + "'",
	}
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]string, 0, len(names))
	for _, n := range names {
		src, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		t, err := template.New(n).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("migrations: parse %s: %w", n, err)
		}
		var b bytes.Buffer
		if err := t.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("migrations: render %s: %w", n, err)
		}
		out = append(out, b.String())
	}
	return out, nil
}

// Apply runs every migration in one transaction. The SQL is idempotent, so
// applying it again changes nothing.
func Apply(ctx context.Context, conn *pgx.Conn, p Params) error {
	stmts, err := Render(p)
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	for i, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("migrations: step %d: %w", i+1, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: commit: %w", err)
	}
	return nil
}
