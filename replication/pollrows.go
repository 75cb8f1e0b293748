package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PollKeepTrigger is the poll source's trigger that keeps an outbox row
// until it is published (migrations.KeepTrigger): while it is on a table,
// the poll source is that table's relay, and its rows with published_at
// NULL are events no slot has relayed.
const PollKeepTrigger = "pgoutbox_keep_unpublished"

// ErrPollRowsUnpublished: a slot made now would start after rows the poll
// source has not published yet, and the WAL source would never relay them.
var ErrPollRowsUnpublished = errors.New("replication: the poll source's table holds rows it has not published")

// maxCountedPollRows bounds the count of unpublished rows a refusal gives.
const maxCountedPollRows = 10000

// PollRows is a table the poll source relays (its keep trigger is on it
// and enabled) and how many of its rows it has not published
// (published_at NULL), counted up to 10,000.
type PollRows struct {
	Table string
	Rows  int
}

func (p PollRows) String() string {
	if p.Rows >= maxCountedPollRows {
		return fmt.Sprintf("%s (at least %d rows)", p.Table, p.Rows)
	}
	return fmt.Sprintf("%s (%d rows)", p.Table, p.Rows)
}

// UnpublishedPollRows returns, of tables (schema-qualified), those the
// poll source relays that hold rows it has not published. A slot made now
// would start after those rows: a WAL source that takes over from the
// poll source there would never relay them (a move without snapshot.mode:
// initial; a prober lost 20 of 50 events so).
func UnpublishedPollRows(ctx context.Context, conn *pgx.Conn, tables []string) ([]PollRows, error) {
	var out []PollRows
	for _, t := range tables {
		var polled bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_trigger g WHERE g.tgrelid = to_regclass($1) AND g.tgname = $2 AND g.tgenabled IN ('O', 'A'))
			AND EXISTS (SELECT FROM pg_catalog.pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attname = 'published_at' AND NOT a.attisdropped)`,
			quoteTable(t), PollKeepTrigger).Scan(&polled)
		if err != nil {
			return nil, fmt.Errorf("replication: look for the poll source's trigger on %s: %w", t, err)
		}
		if !polled {
			continue
		}
		var n int
		if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT FROM %s WHERE published_at IS NULL LIMIT %d) u`, quoteTable(t), maxCountedPollRows)).Scan(&n); err != nil {
			return nil, fmt.Errorf("replication: count the rows of %s the poll source has not published: %w", t, err)
		}
		if n > 0 {
			out = append(out, PollRows{Table: t, Rows: n})
		}
	}
	return out, nil
}

// PollRowsError is the refusal to make slot while the poll source's
// tables hold rows it has not published (UnpublishedPollRows) and no
// poll relay runs on them: a move from the poll source.
func PollRowsError(slot string, unpublished []PollRows) error {
	names := make([]string, len(unpublished))
	for i, u := range unpublished {
		names[i] = u.String()
	}
	return fmt.Errorf("%w: %s, whose keep trigger %s says the poll source relays it, holds rows with published_at NULL, no poll relay runs on it, and slot %q does not exist: a slot made now starts after those rows, so the WAL source would never relay them. Move from the poll source as the README's \"Moving between the sources\" says: start the WAL source with snapshot.mode: initial and snapshot.rows: unpublished, which publishes them and then makes the slot (or let the poll relays publish them first). A WAL relay meant to run beside the poll source (publishing elsewhere) starts while the poll relays run",
		ErrPollRowsUnpublished, strings.Join(names, ", "), PollKeepTrigger, slot)
}
