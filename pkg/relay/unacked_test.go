package relay

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// stepClock is a clock the test moves by hand; nothing here waits on it.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time               { return c.now }
func (c *stepClock) NewTimer(time.Duration) timer { panic("stepClock: no timers") }

// TestRecordsUnacknowledgedForLongAreWarnedOf: records that wait for Kafka
// with no ack arriving for unackedWarnAfter are warned of in the log, and
// again every unackedWarnAfter while they wait. A reviewer saw 16 minutes
// of nothing but "catching up" while a record waited on a deleted topic.
// Any ack restarts the count; none in flight, no warning.
func TestRecordsUnacknowledgedForLongAreWarnedOf(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	clk := &stepClock{now: time.Unix(1_800_000_000, 0)}
	s := &session{r: &Relay{obs: NopObserver{}}, clock: clk, tr: checkpoint.New(1), log: zap.New(core)}
	id, _ := s.tr.Begin()
	_ = s.tr.Add(2)
	rec := router.Record{Key: []byte("k"), Value: []byte("v")}
	m1, m2 := s.meta(&rec, nil, id, 0), s.meta(&rec, nil, id, 0)
	warned := func() int {
		return logs.FilterMessageSnippet("no acknowledgement").Len()
	}
	for i, step := range []struct {
		after time.Duration
		ack   *kafka.Meta
		want  int // warnings so far
	}{
		{after: 10 * time.Second, want: 0},
		{after: 10 * time.Second, ack: &m1, want: 0}, // an ack: the wait starts again
		{after: 25 * time.Second, want: 0},
		{after: 6 * time.Second, want: 1}, // 31 s with no ack
		{after: 9 * time.Second, want: 1}, // said 9 s ago
		{after: 22 * time.Second, want: 2},
		{after: time.Second, ack: &m2, want: 2}, // none in flight
		{after: time.Hour, want: 2},
	} {
		clk.now = clk.now.Add(step.after)
		if step.ack != nil {
			if err := s.ack(kafka.Ack{Meta: *step.ack}); err != nil {
				t.Fatal(err)
			}
		}
		s.warnUnacked()
		if got := warned(); got != step.want {
			t.Fatalf("step %d: %d warnings, want %d", i, got, step.want)
		}
	}
}

// TestRecordsNeverAcknowledgedAreWarnedOf: the first records of a session
// that never get an ack (the session started while the topic was already
// gone) are warned of too: the wait counts from the first record made
// (meta) while none was in flight.
func TestRecordsNeverAcknowledgedAreWarnedOf(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	clk := &stepClock{now: time.Unix(1_800_000_000, 0)}
	s := &session{r: &Relay{obs: NopObserver{}}, clock: clk, tr: checkpoint.New(1), log: zap.New(core)}
	id, err := s.tr.Begin()
	if err != nil {
		t.Fatal(err)
	}
	_ = s.tr.Add(1)
	rec := router.Record{Key: []byte("k"), Value: []byte("v")}
	s.meta(&rec, nil, id, 0)
	for i, step := range []struct {
		after time.Duration
		want  int
	}{{0, 0}, {20 * time.Second, 0}, {11 * time.Second, 1}} {
		clk.now = clk.now.Add(step.after)
		s.warnUnacked()
		if got := logs.FilterMessageSnippet("no acknowledgement").Len(); got != step.want {
			t.Fatalf("step %d: %d warnings, want %d", i, got, step.want)
		}
	}
}
