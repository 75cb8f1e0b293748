package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestMigratesRunTogetherAllSucceed: pgoutbox migrate run by several
// replicas (or init containers) at the same moment on a fresh database.
// The loser of each CREATE … IF NOT EXISTS or CREATE PUBLICATION gets
// 23505, 42P07 or 42710 and must go on with what the winner made, in the
// same transaction.
func TestMigratesRunTogetherAllSucceed(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	testenv.AtOnce(t, dsn, 8, 10, 2*time.Minute, func(ctx context.Context, conn *pgx.Conn, round int) error {
		ddl, err := replication.StateTableDDL(fmt.Sprintf("public.devc_state_%d", round))
		if err != nil {
			return err
		}
		return migrations.Apply(ctx, conn, migrations.Params{
			Tables:        []string{fmt.Sprintf("public.devc_outbox_%d", round)},
			Publication:   fmt.Sprintf("devc_pub_%d", round),
			StateTableDDL: ddl,
		})
	})
}
