package relay

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/replication"
)

// skipCounter counts SkippedMessage by reason.
type skipCounter struct {
	NopObserver
	n map[string]int
}

func (c *skipCounter) SkippedMessage(reason string) { c.n[reason]++ }

// TestMessageThatLooksLikeAnEventNoRelayClaimsIsAnError: a logical decoding
// message whose prefix is not messages.prefix is skipped, and the slot
// confirmed past it. A writer whose prefix differs from the relay's lost
// its events with one Warn per prefix, and with nothing at all once a
// hundred other prefixes had been named (a hostile prober showed both).
// Now a message that looks like an outbox event, whose prefix no other
// slot's state row records, is an Error for each such prefix, whatever
// came before, and every skipped message is counted by reason; the
// prefix of another relay (its row records it) is that relay's business,
// said at Info once. Unit level: the session is fed the messages.
func TestMessageThatLooksLikeAnEventNoRelayClaimsIsAnError(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	obs := &skipCounter{n: map[string]int{}}
	clk := &stepClock{now: time.Unix(1_800_000_000, 0)}
	s := &session{r: &Relay{obs: obs, cfg: DefaultConfig()}, clock: clk, tr: checkpoint.New(1), log: zap.New(core),
		start: replication.Start{OtherPrefixes: map[string]string{"orders": "slot_b"}}}
	event := []byte(`{"id":"3f1c5b8e-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"o1","type":"Created","payload":{"x":1}}`)
	lsn := checkpoint.LSN(0x100)
	msg := func(prefix string, content []byte) {
		lsn += 0x10
		s.otherMessage(&replication.Message{Transactional: true, LSN: lsn, Prefix: prefix, Content: content})
	}
	msg("orders", event)
	for i := range 100 {
		msg(fmt.Sprintf("junk_%d", i), []byte("x"))
	}
	msg("orders", event)
	msg("orders2", event)
	msg("orders2", event)
	msg("orders3", []byte(`{"id":"1","payload":null}`))
	errs := logs.FilterLevelExact(zapcore.ErrorLevel)
	if errs.Len() != 2 || errs.FilterField(zap.String("prefix", "orders2")).Len() != 1 || errs.FilterField(zap.String("prefix", "orders3")).Len() != 1 {
		t.Fatalf("errors: %v; want one for orders2 and one for orders3 (event-shaped, no relay records them), none for orders (slot_b's)", errs.All())
	}
	if n := logs.FilterMessageSnippet("another slot relays").FilterField(zap.String("relayed_by_slots", "slot_b")).Len(); n != 1 {
		t.Fatalf("%d lines naming slot_b's prefix; want 1", n)
	}
	want := map[string]int{SkippedUnclaimed: 100, SkippedAnotherRelays: 2, SkippedUnclaimedEvent: 3}
	for r, n := range want {
		if obs.n[r] != n {
			t.Fatalf("counted %v; want %v", obs.n, want)
		}
	}
}
