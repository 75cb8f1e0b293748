package poll

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Backlog is what a table holds that the poll source has not published.
type Backlog struct {
	// Unpublished counts the committed rows with published_at NULL.
	Unpublished int64 `json:"unpublished_rows"`
	// OldestAge is how long ago the oldest of them was written (by its
	// created_at, on the server's clock); zero when there is none, or no
	// created_at column. OldestKnown says whether it could be measured.
	OldestAge   time.Duration `json:"-"`
	OldestKnown bool          `json:"-"`
	// Attempted counts the unpublished rows that failed at least once.
	Attempted int64 `json:"failed_rows"`
}

// ReadBacklog counts t's unpublished rows and measures the oldest (one
// scan of the partial index of unpublished rows and their heap pages).
func ReadBacklog(ctx context.Context, conn *pgx.Conn, t *Table) (Backlog, error) {
	oldest := "NULL::float8"
	if t.created {
		oldest = "extract(epoch FROM now() - min(" + ColumnCreatedAt + "))::float8"
	}
	var b Backlog
	var age *float64
	err := conn.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE "+ColumnAttempts+" > 0), "+oldest+
		" FROM "+t.quoted+" WHERE "+ColumnPublishedAt+" IS NULL").Scan(&b.Unpublished, &b.Attempted, &age)
	if err != nil {
		return b, fmt.Errorf("poll: read the backlog of %s: %w", t.Name, err)
	}
	if t.created {
		b.OldestKnown = true
		if age != nil {
			b.OldestAge = time.Duration(max(*age, 0) * float64(time.Second))
		}
	}
	return b, nil
}
