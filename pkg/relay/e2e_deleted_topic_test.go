package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// routedCount counts the records routed to each topic.
type routedCount struct {
	relay.NopObserver
	mu sync.Mutex
	n  map[string]int
}

func (o *routedCount) Routed(_, topic string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[topic]++
}

func (o *routedCount) count(topic string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[topic]
}

// TestTopicDeletedWhileRunningIsPoisonWithinTheMissingTimeout: a topic the
// relay has produced to is deleted while it runs, and an event for it
// follows. Kafka answers UNKNOWN_TOPIC_OR_PARTITION, which sarama retried
// for 16 minutes with nothing in the log. With kafka.metadata.timeout
// (here as short as the missing timeout; by default the producer's
// retries last the 16 minutes, warned of every 30 s) the record fails,
// the relay forgets the topic and, within about kafka.topic.missing.timeout
// more, says so under the poison policy: with fail it stops naming the topic, the event and the deletion,
// and confirms nothing past the event; with dead-letter the event goes to
// the dead-letter topic and the relay runs on.
func TestTopicDeletedWhileRunningIsPoisonWithinTheMissingTimeout(t *testing.T) {
	// The topic's name holds "deleted" (the test's), so the words are
	// checked whole.
	const deletedSays = "was deleted while the relay ran"
	env := testenv.Require(t)
	const good, bad = "00000000-0000-4000-8000-0000000001a1", "00000000-0000-4000-8000-0000000001b2"
	for _, policy := range []string{"fail", "dead-letter"} {
		t.Run(policy, func(t *testing.T) {
			f := newFixture(t, env, 1)
			ctx := context.Background()
			cfg := f.config()
			topic, dlq := f.poisonTopics(t, &cfg, policy)
			const missing = 3 * time.Second
			cfg.Kafka.TopicMissingTimeout, cfg.Kafka.MetadataTimeout = missing, missing
			done := startPoisonRelay(t, cfg)
			f.waitStreaming(t)
			insert := func(id string) {
				t.Helper()
				if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')`, id, f.slot); err != nil {
					t.Fatal(err)
				}
			}
			insert(good)
			env.NewConsumer(t, []string{topic}).WaitFor(t, 1, time.Minute)
			env.DeleteTopic(t, topic)
			var before string
			if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&before); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			insert(bad)
			// sarama's refresh gives up after the timeout, the session
			// restarts, the topic checker finds the topic missing: the
			// timeout and a margin for the restart.
			bound := missing + 30*time.Second
			if policy == "fail" {
				var err error
				select {
				case err = <-done:
				case <-time.After(bound):
					t.Fatalf("the relay did not stop on the deleted topic within %s (kafka.topic.missing.timeout %s)", bound, missing)
				}
				t.Logf("stopped after %s: %v", time.Since(start).Round(time.Millisecond), err)
				var fe *relay.FatalError
				if !errors.As(err, &fe) {
					t.Fatalf("want a fatal error, got %v", err)
				}
				for _, want := range []string{topic, bad, deletedSays} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not say %q: %v", want, err)
					}
				}
				commit, perr := parseLSN(lsnPattern.FindString(err.Error()))
				if perr != nil {
					t.Fatalf("no commit LSN in %v", err)
				}
				confirmed, _ := f.slotState(t)
				beforeLSN, _ := parseLSN(before)
				if confirmed > commit || commit < beforeLSN {
					t.Fatalf("slot confirmed %s, past the event's transaction (commit %s, written after %s)", confirmed, commit, before)
				}
				return
			}
			d := env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, bound)[0]
			t.Logf("dead-lettered after %s", time.Since(start).Round(time.Millisecond))
			id, _ := d.Header("id")
			reason, _ := d.Header("pgoutbox.error.reason")
			if string(id) != bad || !strings.Contains(string(reason), deletedSays) {
				t.Fatalf("dead-letter record: id %q reason %q", id, reason)
			}
			requireRunning(t, done)
		})
	}
}

// TestSecondStopEndsAStallOnADeletedTopic: while the producer retries the
// metadata of a deleted topic (for its retries, about 16 minutes), a stop and then a second one (WithForceStop, the second
// signal) end Run within seconds: closing the producer does not wait for
// sarama's metadata refresh.
func TestSecondStopEndsAStallOnADeletedTopic(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	cfg := f.config()
	topic, _ := f.poisonTopics(t, &cfg, "fail")
	cfg.Kafka.TopicMissingTimeout = 5 * time.Minute
	obs := &routedCount{}
	force := make(chan struct{})
	r, err := relay.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), relay.WithObserver(obs), relay.WithForceStop(force))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	f.waitStreaming(t)
	insert := func(id string) {
		t.Helper()
		if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')`, id, f.slot); err != nil {
			t.Fatal(err)
		}
	}
	insert("00000000-0000-4000-8000-0000000001c1")
	env.NewConsumer(t, []string{topic}).WaitFor(t, 1, time.Minute)
	env.DeleteTopic(t, topic)
	insert("00000000-0000-4000-8000-0000000001c2")
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return obs.count(topic) == 2, "the event for the deleted topic was not routed"
	})
	cancel()
	close(force)
	start := time.Now()
	const bound = 5 * time.Second
	select {
	case err := <-done:
		t.Logf("Run returned %s after the second stop: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(bound):
		t.Fatalf("Run still running %s after the second stop", bound)
	}
}
