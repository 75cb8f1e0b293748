package migrations

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

//go:embed 0002_poll.sql
var pollSQL string

//go:embed 0003_poll_notify.sql
var pollNotifySQL string

//go:embed 0004_poll_state.sql
var pollStateSQL string

var (
	pollTemplate       = template.Must(template.New("0002_poll.sql").Option("missingkey=error").Parse(pollSQL))
	pollNotifyTemplate = template.Must(template.New("0003_poll_notify.sql").Option("missingkey=error").Parse(pollNotifySQL))
	pollStateTemplate  = template.Must(template.New("0004_poll_state.sql").Option("missingkey=error").Parse(pollStateSQL))
)

// PollParams name what the poll source's migration creates for one table.
type PollParams struct {
	// Table is the schema-qualified outbox table.
	Table string
	// Notify creates the notification trigger (on Channel); without it the
	// trigger is dropped, so that writers no longer pay for it.
	Notify  bool
	Channel string
}

// NotifyTrigger is the name of the poll source's trigger on its table.
const NotifyTrigger = "pgoutbox_notify"

// KeepTrigger is the poll source's trigger that skips the deletes of rows
// not published yet, unless DeleteUnpublished is on in the session (the
// setting 0002_poll.sql's functions read). KeepTruncateTrigger refuses a
// TRUNCATE of the table while it holds unpublished rows.
const (
	KeepTrigger         = "pgoutbox_keep_unpublished"
	KeepTruncateTrigger = "pgoutbox_keep_unpublished_truncate"
	DeleteUnpublished   = "pgoutbox.delete_unpublished"
)

// PollStateTable is the table, in each poll table's schema, where the
// poll source records the table it last checked under each name
// (0004_poll_state.sql).
const PollStateTable = "pgoutbox_poll_state"

// PollState returns the quoted name of the poll source's record table for
// the poll table table (schema.table, or table for public), and the
// statement that creates it if it does not exist.
func PollState(table string) (quoted, create string, err error) {
	schema, _, ok := strings.Cut(table, ".")
	if !ok {
		schema = "public"
	}
	if _, err := Ident(table); err != nil {
		return "", "", err
	}
	quoted = pgx.Identifier{schema, PollStateTable}.Sanitize()
	var b bytes.Buffer
	if err := pollStateTemplate.Execute(&b, map[string]string{"StateTable": quoted}); err != nil {
		return "", "", fmt.Errorf("migrations: render the poll record of %s: %w", table, err)
	}
	return quoted, b.String(), nil
}

// pollStatements renders the statements of the poll migration, in order.
func pollStatements(p PollParams) ([]string, error) {
	schema, rel, ok := strings.Cut(p.Table, ".")
	if !ok {
		schema, rel = "public", p.Table
	}
	table, err := Ident(schema + "." + rel)
	if err != nil {
		return nil, err
	}
	_, state, err := PollState(p.Table)
	if err != nil {
		return nil, err
	}
	index := func(suffix string) string {
		name := rel
		if len(name)+len(suffix) > 63 {
			name = name[:63-len(suffix)]
		}
		return pgx.Identifier{name + suffix}.Sanitize()
	}
	vals := map[string]string{
		"Table":                table,
		"UnpublishedIndex":     index("_unpublished_seq_idx"),
		"PublishedIndex":       index("_published_at_idx"),
		"Function":             pgx.Identifier{schema, "pgoutbox_notify"}.Sanitize(),
		"Trigger":              pgx.Identifier{NotifyTrigger}.Sanitize(),
		"KeepFunction":         pgx.Identifier{schema, KeepTrigger}.Sanitize(),
		"KeepTrigger":          pgx.Identifier{KeepTrigger}.Sanitize(),
		"KeepTruncateFunction": pgx.Identifier{schema, KeepTruncateTrigger}.Sanitize(),
		"KeepTruncateTrigger":  pgx.Identifier{KeepTruncateTrigger}.Sanitize(),
		"Channel":              "'" + strings.ReplaceAll(p.Channel, "'", "''") + "'",
	}
	var b bytes.Buffer
	if err := pollTemplate.Execute(&b, vals); err != nil {
		return nil, fmt.Errorf("migrations: render the poll table %s: %w", p.Table, err)
	}
	stmts := []string{b.String()}
	if p.Notify {
		b.Reset()
		if err := pollNotifyTemplate.Execute(&b, vals); err != nil {
			return nil, fmt.Errorf("migrations: render the poll trigger of %s: %w", p.Table, err)
		}
		stmts = append(stmts, b.String())
	} else {
		stmts = append(stmts, "DROP TRIGGER IF EXISTS "+vals["Trigger"]+" ON "+table+";\n")
	}
	return append(stmts, state), nil
}

// RenderPoll returns the SQL ApplyPoll runs, for `pgoutbox migrate --print`.
func RenderPoll(p PollParams) ([]string, error) { return pollStatements(p) }

// ApplyPoll creates (or completes) the poll table, its indexes and its
// trigger, and the table of the poll source's record (PollState), in one
// transaction. It is idempotent.
func ApplyPoll(ctx context.Context, conn *pgx.Conn, p PollParams) error {
	stmts, err := pollStatements(p)
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	for _, s := range stmts {
		// Each rendered file holds several statements: the simple protocol
		// runs them in one go.
		if _, err := tx.Exec(ctx, s, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("migrations: poll table %s: %w", p.Table, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: commit: %w", err)
	}
	return nil
}
