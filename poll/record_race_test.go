package poll_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestRelaysStartingTogetherAllUseTheRecordTable: poll relays starting at
// the same moment all make the record table (pgoutbox_poll_state) when
// migrate has not; the losers get 23505 (or 42P07/42710) and must use the
// winner's.
func TestRelaysStartingTogetherAllUseTheRecordTable(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	setup := testenv.ConnectPG(t, dsn)
	for r := range 10 {
		if _, err := setup.Exec(context.Background(), fmt.Sprintf("CREATE SCHEMA devc_s%d", r)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.AtOnce(t, dsn, 8, 10, 2*time.Minute, func(ctx context.Context, conn *pgx.Conn, round int) error {
		table, err := poll.NewTable(fmt.Sprintf("devc_s%d.outbox", round), "", "")
		if err != nil {
			return err
		}
		return table.EnsureRecordTable(ctx, conn)
	})
}
