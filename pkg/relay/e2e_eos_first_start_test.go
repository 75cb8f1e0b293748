package relay_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestExactlyOnceFirstStartAfterMigrateDoesNotWarnOfALostRecord: the first
// exactly-once start after pgoutbox migrate (which writes the slot's state
// row) warned that the offsets topic's record was gone and events would be
// sent twice: the one warning that means a lost record, on every normal
// first start (a reviewer found it). A row no session has recorded itself
// in streamed nothing.
func TestExactlyOnceFirstStartAfterMigrateDoesNotWarnOfALostRecord(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	cfg := f.config()
	cfg.Kafka.ExactlyOnce = true
	cfg.Kafka.OffsetsTopic = "pgoutbox.offsets." + f.slot
	migrate := exec.Command(pgoutboxBinary(t), "migrate")
	migrate.Env = append(f.environ(), "PGOUTBOX_KAFKA_EXACTLY_ONCE=true", "PGOUTBOX_KAFKA_OFFSETS_TOPIC="+cfg.Kafka.OffsetsTopic)
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	core, logs := observer.New(zap.InfoLevel)
	r, err := relay.New(cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		return logs.FilterMessageSnippet("exactly-once: the offsets topic holds no position").Len() > 0, "the exactly-once start has not said where it starts"
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w := logs.FilterMessageSnippet("though pgoutbox streamed from it before").All(); len(w) > 0 {
		t.Fatalf("the first start after migrate warned of a lost record: %s", w[0].Message)
	}
}
