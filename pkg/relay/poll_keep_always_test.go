package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollStartWarnsOfKeepTriggersFiringInOriginModeOnly: keep triggers as
// earlier versions made them fire in origin mode only, which a session
// with session_replication_role = replica skips. The relay starts and
// relays (refusing would break upgrades), and warns once per session,
// naming the triggers and pgoutbox migrate.
func TestPollStartWarnsOfKeepTriggersFiringInOriginModeOnly(t *testing.T) {
	ctx := context.Background()
	cfg, conn := scriptedPollDatabase(t, nil)
	if _, err := conn.Exec(ctx, "ALTER TABLE public.outbox ENABLE TRIGGER "+migrations.KeepTrigger+", ENABLE TRIGGER "+migrations.KeepTruncateTrigger); err != nil {
		t.Fatal(err)
	}
	be := &scriptedPollBackend{}
	be.liveBackend, be.acked = &liveBackend{log: zap.NewNop()}, map[string][]bool{}
	core, logs := observer.New(zapcore.WarnLevel)
	r, err := New(cfg, zap.New(core), withBackend(be, realClock{}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("the relay did not stop within a minute")
		}
	}()
	const id = "00000000-0000-4000-8000-00000000d0e1"
	if _, err := conn.Exec(ctx, "INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', 'k', 'T', '{}')", id); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		return len(be.ackedBy(id)) > 0, "row " + id + " not relayed"
	})
	warned := logs.FilterMessageSnippet("fire in origin mode only").All()
	if len(warned) == 0 {
		t.Fatalf("no warning of keep triggers firing in origin mode only; logged: %v", logs.All())
	}
	if m := warned[0].Message; !strings.Contains(m, migrations.KeepTrigger+" and "+migrations.KeepTruncateTrigger) ||
		!strings.Contains(m, "session_replication_role = replica") || !strings.Contains(m, "pgoutbox migrate") {
		t.Fatalf("warning %q: want the triggers, the cause and the fix named", m)
	}
}
