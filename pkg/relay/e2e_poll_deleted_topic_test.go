package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollTopicDeletedWhileRunningIsPoisonWithinTheMissingTimeout is
// TestTopicDeletedWhileRunningIsPoisonWithinTheMissingTimeout for the poll
// source: a topic it has published to is deleted while it runs, and a row
// for it follows. Kafka answers UNKNOWN_TOPIC_OR_PARTITION once the
// producer's metadata refresh gives up (kafka.metadata.timeout); the relay
// forgets the topic, the next claim has the topic checker ask for what is
// left of kafka.topic.missing.timeout, and the row fails its attempts
// without going to the producer again, its error saying the topic was
// deleted. With fail the relay stops naming the topic, the event and the
// deletion, and the row stays unpublished; with dead-letter the row goes to
// the dead-letter topic, its reason saying so, is marked published with its
// attempts, and the relay runs on. Before, the cache still held the topic
// as existing: every attempt went to the producer and waited out its
// metadata retries, and the poison said only "unknown topic or partition".
func TestPollTopicDeletedWhileRunningIsPoisonWithinTheMissingTimeout(t *testing.T) {
	// The topic's name holds "deleted" (the test's), so the words are
	// checked whole.
	const deletedSays = "was deleted while the relay ran"
	env := testenv.Require(t)
	const good, bad = "00000000-0000-4000-8000-0000000002a1", "00000000-0000-4000-8000-0000000002b2"
	for _, policy := range []string{"fail", "dead-letter"} {
		t.Run(policy, func(t *testing.T) {
			f := newPollFixture(t, env, 1)
			ctx := context.Background()
			cfg := f.pollConfig()
			topic, dlq := f.poisonTopics(t, &cfg, policy)
			const missing = 3 * time.Second
			cfg.Kafka.TopicMissingTimeout, cfg.Kafka.MetadataTimeout = missing, missing
			cfg.Poll.MaxAttempts = 2
			cfg.Poll.RetryBackoff, cfg.Poll.RetryBackoffMax = 300*time.Millisecond, 300*time.Millisecond
			obs := &producerRefusals{}
			done := startPoisonRelay(t, cfg, relay.WithObserver(obs))
			insert := func(id string) {
				t.Helper()
				if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')`, id, f.slot); err != nil {
					t.Fatal(err)
				}
			}
			state := func(id string) (attempts int, lastError string, published bool) {
				t.Helper()
				var le *string
				if err := f.checkDB.QueryRow(ctx, "SELECT attempts, last_error, published_at IS NOT NULL FROM outbox WHERE id = $1", id).Scan(&attempts, &le, &published); err != nil {
					t.Fatal(err)
				}
				if le != nil {
					lastError = *le
				}
				return
			}
			insert(good)
			env.NewConsumer(t, []string{topic}).WaitFor(t, 1, time.Minute)
			testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
				_, _, published := state(good)
				return published, "the first row is not marked published"
			})
			env.DeleteTopic(t, topic)
			start := time.Now()
			insert(bad)
			// The producer's refresh gives up after kafka.metadata.timeout,
			// a new session's claim has the checker ask for what is left of
			// the missing timeout, then the attempts (300 ms apart): the
			// timeouts and a margin for the sessions. Each further attempt
			// through the producer would add kafka.metadata.timeout.
			bound := 2*missing + 20*time.Second
			if policy == "fail" {
				var err error
				select {
				case err = <-done:
				case <-time.After(bound):
					t.Fatalf("the relay did not stop on the deleted topic within %s (kafka.topic.missing.timeout %s)", bound, missing)
				}
				t.Logf("stopped after %s: %v", time.Since(start).Round(time.Millisecond), err)
				obs.requireOnce(t, topic)
				var fe *relay.FatalError
				if !errors.As(err, &fe) {
					t.Fatalf("want a fatal error, got %v", err)
				}
				for _, want := range []string{topic, bad, deletedSays, "after 2 of poll.max.attempts=2"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not say %q: %v", want, err)
					}
				}
				attempts, lastError, published := state(bad)
				if attempts != 2 || !strings.Contains(lastError, deletedSays) || published {
					t.Fatalf("row of the deleted topic: attempts %d, last_error %q, published %v; want 2, the deletion, unpublished", attempts, lastError, published)
				}
				return
			}
			d := env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, bound)[0]
			t.Logf("dead-lettered after %s", time.Since(start).Round(time.Millisecond))
			obs.requireOnce(t, topic)
			id, _ := d.Header("id")
			reason, _ := d.Header("pgoutbox.error.reason")
			source, _ := d.Header("pgoutbox.source.topic")
			seq, _ := d.Header("pgoutbox.poll.seq")
			if string(id) != bad || !strings.Contains(string(reason), deletedSays) || string(source) != topic || len(seq) == 0 {
				t.Fatalf("dead-letter record: id %q reason %q source topic %q seq %q", id, reason, source, seq)
			}
			testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
				attempts, lastError, published := state(bad)
				return attempts == 2 && strings.Contains(lastError, deletedSays) && published,
					fmt.Sprintf("row of the deleted topic: attempts %d, last_error %q, published %v; want 2, the deletion, published (dead-lettered)", attempts, lastError, published)
			})
			requireRunning(t, done)
		})
	}
}

// producerRefusals counts the records Kafka (the producer) refused, by
// topic: a row the relay finds poison before sending it is not counted.
type producerRefusals struct {
	relay.NopObserver
	mu sync.Mutex
	n  map[string]int
}

func (o *producerRefusals) Failed(topic string, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[topic]++
}

// requireOnce fails the test unless the producer refused one record of
// topic: once forgotten, the deleted topic is asked about, not produced to.
func (o *producerRefusals) requireOnce(t *testing.T, topic string) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := o.n[topic]; n != 1 {
		t.Errorf("the producer refused %d records of the deleted topic; want 1: its later attempts went to the producer again, each waiting out kafka.metadata.timeout", n)
	}
}
