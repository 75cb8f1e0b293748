package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
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
	w := &askWatcher{}
	s := &session{r: &Relay{obs: obs, cfg: DefaultConfig()}, clock: clk, tr: checkpoint.New(1), log: zap.New(core),
		otherPrefixes: map[string]string{"orders": "slot_b"}, watcher: w}
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
	// The prefixes read again, as the catalog check does when asked: no
	// other slot relays orders2 or orders3.
	s.prefixesRead(catalogResult{OtherPrefixes: map[string]string{"orders": "slot_b"}, PrefixesFor: w.asked})
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

// askWatcher is a catalog watcher that only records ReadPrefixes's asks.
type askWatcher struct {
	catalogWatcher
	asked uint64
	asks  int
}

func (w *askWatcher) ReadPrefixes(ask uint64) { w.asked, w.asks = max(w.asked, ask), w.asks+1 }

// TestPrefixOfARelayAddedOrTakenAwayWhileStreaming: which prefixes other
// slots relay was read at the session's start only. A relay added to the
// database while this one streamed had its event messages taken for a
// misspelt prefix's, each an Error here feeding the unclaimed-events alert
// until this relay's next session; one taken away went on covering its
// prefix. An event-shaped message of a prefix no slot recorded is now
// held, and judged by a reading of the prefixes made after it; readings
// the checks make unasked replace what is known. Unit level: the session
// is fed the messages and the readings.
func TestPrefixOfARelayAddedOrTakenAwayWhileStreaming(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	obs := &skipCounter{n: map[string]int{}}
	w := &askWatcher{}
	s := &session{r: &Relay{obs: obs, cfg: DefaultConfig()}, clock: &stepClock{now: time.Unix(1_800_000_000, 0)}, tr: checkpoint.New(1),
		log: zap.New(core), otherPrefixes: map[string]string{"gone": "slot_d"}, watcher: w}
	event := []byte(`{"id":"3f1c5b8e-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"o1","type":"Created","payload":{"x":1}}`)
	lsn := checkpoint.LSN(0x100)
	msg := func(prefix string) {
		lsn += 0x10
		s.otherMessage(&replication.Message{Transactional: true, LSN: lsn, Prefix: prefix, Content: event})
	}
	// slot_c's relay started after this session: its first messages are
	// held, and one read is asked for.
	msg("added")
	msg("added")
	if w.asks != 1 || len(obs.n) != 0 {
		t.Fatalf("asks %d, counted %v; want one ask and nothing judged before the reading", w.asks, obs.n)
	}
	// A reading that began before the ask judges nothing.
	s.prefixesRead(catalogResult{OtherPrefixes: map[string]string{"gone": "slot_d"}, PrefixesFor: w.asked - 1})
	if len(obs.n) != 0 {
		t.Fatalf("counted %v on a reading older than the messages", obs.n)
	}
	// The reading after them names slot_c's prefix, and slot_d is gone.
	s.prefixesRead(catalogResult{OtherPrefixes: map[string]string{"added": "slot_c"}, PrefixesFor: w.asked})
	msg("added")
	if obs.n[SkippedAnotherRelays] != 3 || obs.n[SkippedUnclaimedEvent] != 0 {
		t.Fatalf("counted %v; want the three messages of slot_c's prefix as another relay's", obs.n)
	}
	msg("gone")
	s.settleUnsure(math.MaxUint64) // the session's end
	errs := logs.FilterLevelExact(zapcore.ErrorLevel)
	if errs.Len() != 1 || errs.FilterField(zap.String("prefix", "gone")).Len() != 1 || obs.n[SkippedUnclaimedEvent] != 1 {
		t.Fatalf("errors %v, counted %v; want one Error, for the prefix of the relay taken away", errs.All(), obs.n)
	}
	if n := logs.FilterMessageSnippet("another slot relays").FilterField(zap.String("relayed_by_slots", "slot_c")).Len(); n != 1 {
		t.Fatalf("%d lines naming slot_c's prefix; want 1", n)
	}
}

// TestMessagesDebeziumWouldHaveWrittenAreNamed: started from a connector
// configuration, the relay names at Warn, once per prefix, each logical
// decoding message Debezium's connector would have written to its message
// topic: one it skips, and one of messages.prefix it routes as an event
// instead. A real Debezium 3.6.1 wrote both to <topic.prefix>.message; the
// relay skipped the first at Info and routed the second without a word.
// Unit level: the session is fed the messages.
func TestMessagesDebeziumWouldHaveWrittenAreNamed(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := DefaultConfig()
	cfg.Postgres.StateTable = "" // judged at once
	cfg.Messages.Debezium = &DebeziumMessages{Topic: "shop.message", Exclude: []*regexp.Regexp{regexp.MustCompile(`(?i)\Anoise\z`)}}
	s := &session{r: &Relay{obs: &skipCounter{n: map[string]int{}}, cfg: cfg}, clock: &stepClock{now: time.Unix(1_800_000_000, 0)},
		tr: checkpoint.New(1), log: zap.New(core)}
	lsn := checkpoint.LSN(0x100)
	for _, prefix := range []string{"audit", "audit", "noise"} {
		lsn += 0x10
		if err := s.message(&replication.Message{Transactional: true, LSN: lsn, Prefix: prefix, Content: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	s.debeziumMessage(&replication.Message{Transactional: true, LSN: lsn + 0x10, Prefix: "outbox", Content: []byte("{}")})
	warns := logs.FilterLevelExact(zapcore.WarnLevel).FilterField(zap.String("debezium_topic", "shop.message"))
	if warns.Len() != 2 || warns.FilterField(zap.String("prefix", "audit")).FilterMessageSnippet("skips it").Len() != 1 ||
		warns.FilterField(zap.String("prefix", "outbox")).FilterMessageSnippet("routes it as an outbox event").Len() != 1 {
		t.Fatalf("warnings %v; want one for audit (skipped) and one for outbox (routed), none for the excluded noise", warns.All())
	}
}

// TestFailedReadOfThePrefixesAnswersNoAskAtFirst: the catalog watcher's
// read of the other slots' prefixes that failed (a timeout, a lock on the
// state table) answered the session's ask with nothing read, and the
// session judged the held messages by the list from before: the false
// Error the reading exists to prevent (a diff review). A failed read now
// answers no ask, and the next check reads again; only after
// prefixReadTries failures in a row is the ask answered unread.
func TestFailedReadOfThePrefixesAnswersNoAskAtFirst(t *testing.T) {
	fails := 0
	w := &liveWatcher{cfg: replication.Config{StateTable: "pgoutbox_state", Slot: "a"}, log: zap.NewNop(),
		relayedPrefixes: func(context.Context) (map[string]string, error) {
			if fails > 0 {
				fails--
				return nil, errors.New("canceling statement due to statement timeout")
			}
			return map[string]string{"added": "slot_c"}, nil
		}}
	read := func(ask uint64) catalogResult {
		var res catalogResult
		w.readPrefixes(context.Background(), &res, ask)
		return res
	}
	fails = 1
	if res := read(1); res.PrefixesFor != 0 {
		t.Fatalf("a failed read answered ask %d", res.PrefixesFor)
	}
	if res := read(1); res.PrefixesFor != 1 || res.OtherPrefixes["added"] != "slot_c" {
		t.Fatalf("the next read: %+v, want ask 1 answered with slot_c's prefix", res)
	}
	fails = prefixReadTries
	for i := 1; i < prefixReadTries; i++ {
		if res := read(2); res.PrefixesFor != 0 {
			t.Fatalf("failed read %d answered ask %d", i, res.PrefixesFor)
		}
	}
	if res := read(2); res.PrefixesFor != 2 || res.OtherPrefixes != nil {
		t.Fatalf("after %d failed reads: %+v, want ask 2 answered, unread", prefixReadTries, res)
	}
}
