package replication

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestInstancesStartingTogetherAllUseTheStateTable: replicas starting at
// the same moment on a fresh database all create the state table. CREATE
// TABLE IF NOT EXISTS is no guard against a concurrent creator: the loser
// gets 23505 (or 42P07/42710), and the start failed with it. Every one
// must go on with the table the winner made.
func TestInstancesStartingTogetherAllUseTheStateTable(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	testenv.AtOnce(t, dsn, 8, 10, 2*time.Minute, func(ctx context.Context, conn *pgx.Conn, round int) error {
		table := fmt.Sprintf("public.devc_state_%d", round)
		if err := EnsureStateTable(ctx, conn, table); err != nil {
			return err
		}
		_, _, err := ReadState(ctx, conn, table, "s")
		return err
	})
}
