package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// memberReports records one relay's sessions and standby reports.
type memberReports struct {
	relay.NopObserver
	mu      sync.Mutex
	started int
	standby []error
}

func (o *memberReports) SessionStarted(checkpoint.LSN) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.started++
}

func (o *memberReports) counts() (started, standby int, last error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.standby); n > 0 {
		last = o.standby[n-1]
	}
	return o.started, len(o.standby), last
}

func (o *memberReports) StandingBy(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.standby = append(o.standby, err)
}

// memberLog is a relay's logger: its entries kept for the test, warnings
// and errors also in the test's log.
func memberLog(t *testing.T, name string) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	tl := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core()
	return zap.New(zapcore.NewTee(core, tl)).Named(name), logs
}

// destinationFixture is a fixture with a second set of topics on the same
// Kafka, which configuration y routes to (another
// router.route.topic.replacement: another destination).
func destinationFixture(t *testing.T) (f *fixture, x, y relay.Config, yTopics []string) {
	env := testenv.Require(t)
	f = newFixture(t, env, 1)
	x, y = f.config(), f.config()
	y.Router.RouteTopicReplacement = "devf_y.outbox.event.${routedByValue}"
	for _, topic := range f.topics {
		yTopics = append(yTopics, "devf_y."+topic)
		env.CreateTopic(t, "devf_y."+topic, 1)
	}
	return f, x, y, yTopics
}

// recordedDestination reads the state row's destination ("" when NULL).
func (f *fixture) recordedDestination(t testing.TB) string {
	t.Helper()
	var d *string
	if err := f.checkDB.QueryRow(context.Background(), "SELECT destination FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&d); err != nil {
		t.Fatal(err)
	}
	if d == nil {
		return ""
	}
	return *d
}

// TestStandbyWithAnotherDestinationDoesNotTakeTheSlotOver: standbys on one
// slot with another kafka.brokers or other topic settings (two Helm
// releases, a blue/green pair) took the slot over from each other when the
// streaming one ended, and the events were split between two destinations
// with no error (a Kubernetes review). Now the streaming session records
// its destination in the state row, every instance shows its own with an
// advisory lock, and a standby whose destination differs from the
// recorded one does not take over while an instance with the recorded one
// runs. A1 streams to X, B1 (Y) and A2 (X) stand by; B1 polls the slot far
// more often than A2, so that before the change it took the slot as soon
// as A1 stopped (and the events written after went to Y's topics). Now A2
// takes over, B1 never streams and logs the Error naming both
// destinations, and stays available for a rolling update.
func TestStandbyWithAnotherDestinationDoesNotTakeTheSlotOver(t *testing.T) {
	f, x, y, yTopics := destinationFixture(t)
	a1, a2, b1 := &memberReports{}, &memberReports{}, &memberReports{}
	a1log, _ := memberLog(t, "a1")
	stopA1 := runRelayLog(t, x, a1log, relay.WithObserver(a1))
	f.waitStreaming(t)
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		d := f.recordedDestination(t)
		return d != "", "no destination recorded in the state row"
	})
	before := f.insertEvents(t, "a001", 3, nil)

	b1log, b1logs := memberLog(t, "b1")
	runRelayLog(t, y, b1log, relay.WithObserver(b1), relay.WithStandbyPoll(100*time.Millisecond))
	a2log, _ := memberLog(t, "a2")
	runRelayLog(t, x, a2log, relay.WithObserver(a2), relay.WithStandbyPoll(6*time.Second))
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		_, bn, _ := b1.counts()
		_, an, _ := a2.counts()
		return bn > 0 && an > 0, fmt.Sprintf("standby reports: b1 %d, a2 %d", bn, an)
	})

	if err := stopA1(); err != nil {
		t.Fatalf("A1: %v", err)
	}
	after := f.insertEvents(t, "a002", 5, nil)
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		as, _, _ := a2.counts()
		bs, _, _ := b1.counts()
		return as > 0 || bs > 0, "no standby took the slot over"
	})
	if bs, _, _ := b1.counts(); bs > 0 {
		t.Fatalf("B1, with another destination, took the slot over (%d sessions) while A2, with the recorded one, ran", bs)
	}

	cx := f.env.NewConsumer(t, f.topics)
	got := cx.WaitFor(t, len(before)+len(after), 60*time.Second)
	ids := map[string]bool{}
	for _, m := range got {
		id, _ := m.Header("id")
		ids[string(id)] = true
	}
	for _, id := range append(before, after...) {
		if !ids[id] {
			t.Errorf("event %s did not reach X's topics", id)
		}
	}
	cy := f.env.NewConsumer(t, yTopics)
	time.Sleep(3 * time.Second) // B1 polls the slot every 100 ms meanwhile
	if n := cy.Len(); n != 0 {
		t.Errorf("%d records reached Y's topics", n)
	}
	if bs, _, _ := b1.counts(); bs > 0 {
		t.Fatalf("B1 took the slot over (%d sessions)", bs)
	}
	// Available for a rolling update while it waits (/rolloutz).
	if _, _, last := b1.counts(); last != nil {
		t.Errorf("B1 reports itself unavailable while it waits: %v", last)
	}
	if d := f.recordedDestination(t); strings.Contains(d, "devf_y") {
		t.Errorf("the state row records Y: %s", d)
	}

	var logged bool
	// At Warn for the wait's first five minutes (a rolling update's), at
	// Error after.
	for _, e := range b1logs.FilterLevelExact(zap.WarnLevel).All() {
		if !strings.Contains(e.Message, "another deployment with another destination is running on this slot") {
			continue
		}
		fields := e.ContextMap()
		rec, _ := fields["recorded_destination"].(string)
		own, _ := fields["destination"].(string)
		members, _ := fields["members"].([]interface{})
		if strings.Contains(rec, `route.topic.replacement="outbox.event.${routedByValue}"`) && strings.Contains(own, "devf_y.outbox.event") &&
			strings.Contains(fmt.Sprint(fields["differs"]), "topics") && !strings.Contains(fmt.Sprint(fields["differs"]), "kafka.brokers") && len(members) > 0 {
			logged = true
		} else {
			t.Logf("B1's Warn lacks a detail: %v", fields)
		}
	}
	if !logged {
		t.Errorf("B1 did not log the Warn naming the other destination and its members")
	}
	if n := len(b1logs.FilterLevelExact(zap.WarnLevel).FilterMessageSnippet("another deployment").All()); n > 2 {
		t.Errorf("B1 logged the Warn %d times within seconds; want at most once a minute", n)
	}

	// pgoutbox status's warning: from Y's configuration, A2 publishes
	// elsewhere, to the recorded destination; from X's, B1 does.
	ctx := context.Background()
	others, recorded, err := y.OtherDestinations(ctx, f.checkDB)
	if err != nil || len(others) != 1 || !strings.Contains(others[0], "the destination the state row records") || !strings.Contains(recorded, `replacement="outbox.event.`) {
		t.Errorf("Y's OtherDestinations = %q, %q, %v; want A2, publishing to the recorded X", others, recorded, err)
	}
	others, recorded, err = x.OtherDestinations(ctx, f.checkDB)
	if err != nil || len(others) != 1 || recorded != "" {
		t.Errorf("X's OtherDestinations = %q, %q, %v; want B1 only, and the recorded destination X's own", others, recorded, err)
	}
}

// TestRollingUpdateThatChangesTheDestinationTakesOver: a rolling update
// that changes the destination starts B1 and B2 (Y) while A1 (X) streams;
// once A1 has stopped no instance with X runs, so one of them takes the
// slot over, records Y and says the destination changed.
func TestRollingUpdateThatChangesTheDestinationTakesOver(t *testing.T) {
	f, x, y, yTopics := destinationFixture(t)
	a1, b1, b2 := &memberReports{}, &memberReports{}, &memberReports{}
	a1log, _ := memberLog(t, "a1")
	stopA1 := runRelayLog(t, x, a1log, relay.WithObserver(a1))
	f.waitStreaming(t)
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return f.recordedDestination(t) != "", "no destination recorded in the state row"
	})
	b1log, b1logs := memberLog(t, "b1")
	b2log, b2logs := memberLog(t, "b2")
	runRelayLog(t, y, b1log, relay.WithObserver(b1), relay.WithStandbyPoll(200*time.Millisecond))
	runRelayLog(t, y, b2log, relay.WithObserver(b2), relay.WithStandbyPoll(200*time.Millisecond))
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		_, n1, _ := b1.counts()
		_, n2, _ := b2.counts()
		return n1 > 0 && n2 > 0, fmt.Sprintf("standby reports: b1 %d, b2 %d", n1, n2)
	})
	if err := stopA1(); err != nil {
		t.Fatalf("A1: %v", err)
	}
	after := f.insertEvents(t, "b001", 4, nil)
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		s1, _, _ := b1.counts()
		s2, _, _ := b2.counts()
		return s1+s2 > 0, "neither B1 nor B2 took the slot over"
	})
	if d := f.recordedDestination(t); !strings.Contains(d, "devf_y.outbox.event") {
		t.Errorf("the state row records %q; want Y", d)
	}
	cy := f.env.NewConsumer(t, yTopics)
	cy.WaitFor(t, len(after), 60*time.Second)
	changed := len(b1logs.FilterMessageSnippet("destination changed").All()) + len(b2logs.FilterMessageSnippet("destination changed").All())
	if changed == 0 {
		t.Errorf("the takeover did not log that the destination changed")
	}
}
