package relay

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestSimulatedMessagesOfAnotherPrefixAreNamed: logical decoding messages
// whose prefix is not messages.prefix are skipped, and were skipped
// without a word: a misspelt prefix confirmed past every table-less event
// with nothing in the log. Each other prefix is now named once per
// session: at Error when the message looks like an outbox event and no
// other slot's state row records its prefix (at Warn before a prober lost
// events with it), at Info otherwise. The harness, not a real server: only the log is under test.
func TestSimulatedMessagesOfAnotherPrefixAreNamed(t *testing.T) {
	w := newSimWorld(7)
	w.failAfter, w.tooLarge, w.missing, w.catChange, w.faulty = false, false, "", 0, false
	core, logs := observer.New(zapcore.InfoLevel)
	w.logger = zap.New(core)
	w.log = t.Logf
	a := simSlotStart + 0x100
	w.wal = []simEntry{
		{kind: 't', commitStart: a, commitEnd: a + 32, events: []simEvent{
			{id: "e0000", key: "k1", topic: "outbox.event.Order", message: true, prefix: "outbx", seq: 0},
			{id: "e0001", key: "k1", topic: "outbox.event.Order", message: true, prefix: "outbx", seq: 1},
			{id: "e0002", key: "k2", topic: "outbox.event.Order", seq: 2},
		}},
	}
	if err := w.run(); err != nil || w.err != nil {
		t.Fatalf("run: %v %v", err, w.err)
	}
	if w.delivered["e0000"] || !w.delivered["e0002"] {
		t.Fatalf("delivered %v; want e0002 only", w.delivered)
	}
	named := logs.FilterMessageSnippet("whose prefix is not messages.prefix").FilterField(zap.String("prefix", "outbx"))
	if named.Len() != 1 || named.All()[0].Level != zapcore.ErrorLevel {
		t.Fatalf("%d log entries name prefix outbx (%v); want one, at Error", named.Len(), named.All())
	}
}
