package replication

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestInstancesStartingTogetherAllUseThePublication: replicas starting at
// the same moment on a fresh database all find no publication and create
// it; the losers get 23505 (or 42710) and must go on as with a publication
// that existed. The queries before the CREATE spread the creators out, so
// fewer rounds overlap than for the state table (about one in seven with
// 16 creators on the old code): hence more of both.
func TestInstancesStartingTogetherAllUseThePublication(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	setup := testenv.ConnectPG(t, dsn)
	if _, err := setup.Exec(context.Background(), "CREATE TABLE public.devc_outbox (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	testenv.AtOnce(t, dsn, 16, 50, 2*time.Minute, func(ctx context.Context, conn *pgx.Conn, round int) error {
		cfg := Config{Publication: fmt.Sprintf("devc_pub_%d", round), Tables: []string{"public.devc_outbox"},
			Slot: "devc_no_slot", PublicationAutocreate: PublicationFiltered}
		return ensurePublication(ctx, conn, cfg, zap.NewNop())
	})
}
