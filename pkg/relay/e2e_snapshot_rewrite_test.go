package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestInitialSnapshotOfATableRewrittenAfterTheExportTakesANewOne: a table
// rewrite (here ALTER COLUMN … TYPE) committed after the initial snapshot
// was exported and before the table was read makes the old snapshot read
// the table as empty: PostgreSQL keeps no old snapshot working across a
// rewrite, and the rewrite is no insert the slot decodes. The snapshot
// published no row of it and the slot was made past them all: every event
// lost, with an Info line of 0 rows (a reviewer showed it with a second
// table published first, and with pgoutbox's own ADD COLUMN seq). The
// hook commits the rewrite at that moment, which a test cannot otherwise
// reach; the snapshot must see it and take a new one.
func TestInitialSnapshotOfATableRewrittenAfterTheExportTakesANewOne(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	const rows = 200
	cfg := snapshotOf(t, f, rows, 0)
	var rewrites atomic.Int32
	hook := func() {
		if rewrites.Add(1) > 1 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := f.checkDB.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN payload TYPE json USING payload::json"); err != nil {
			t.Errorf("rewrite the outbox table: %v", err)
		}
	}
	c := env.NewConsumer(t, f.topics[:1])
	stop := runRelay(t, cfg, relay.WithSnapshotExportedHook(hook))
	distinct := map[string]bool{}
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		for _, m := range c.Poll() {
			id, _ := m.Header("id")
			distinct[string(id)] = true
		}
		return len(distinct) == rows, fmt.Sprintf("%d of %d rows published (snapshots exported: %d)", len(distinct), rows, rewrites.Load())
	})
	f.waitStreaming(t) // the anchor goes once the slot is made from it
	noAnchorLeft(t, f, cfg)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := rewrites.Load(); n < 2 {
		t.Fatalf("%d snapshots exported; want a second one after the rewrite", n)
	}
}
