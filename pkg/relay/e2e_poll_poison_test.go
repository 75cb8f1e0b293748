package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollPoisonRowsFollowThePolicy writes, for each kind of poison, a good
// row of key k, then in one transaction the poison row of k, a good row of
// k and a row of another key; under both policies with poll.max.attempts
// 2. The poison row is tried twice (its attempts and last error recorded),
// the other key is published meanwhile, and the later row of k waits: with
// fail the relay stops naming the event and the later row of k is never
// published; with dead-letter the poison row goes to the dead-letter topic
// with its reason, is marked published, and the later row of k follows.
func TestPollPoisonRowsFollowThePolicy(t *testing.T) {
	env := testenv.Require(t)
	const good1, bad, good2, other = "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000b2", "00000000-0000-4000-8000-0000000000c3", "00000000-0000-4000-8000-0000000000d4"
	cases := []struct {
		name   string
		setup  func(*relay.Config)
		insert string // the poison row; $P is the test's prefix
		reason string
	}{
		{"null routing value", nil,
			`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + bad + `', NULL, 'k', 'T', '{}')`, "NULL"},
		{"record larger than Kafka accepts", func(c *relay.Config) { c.Kafka.MaxMessageBytes = 4000 },
			`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + bad + `', '$P', 'k', 'T', json_build_object('pad', repeat('x', 5000)))`, "kafka.max.message.bytes"},
		{"topic does not exist", func(c *relay.Config) { c.Kafka.TopicMissingTimeout = time.Second },
			`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + bad + `', '$P_nowhere', 'k', 'T', '{}')`, "does not exist"},
	}
	for _, c := range cases {
		for _, policy := range []string{"fail", "dead-letter"} {
			t.Run(c.name+"/"+policy, func(t *testing.T) {
				f := newPollFixture(t, env, 1)
				ctx := context.Background()
				cfg := f.pollConfig()
				topic, dlq := f.poisonTopics(t, &cfg, policy)
				cfg.Poll.MaxAttempts = 2
				cfg.Poll.RetryBackoff, cfg.Poll.RetryBackoffMax = 300*time.Millisecond, 300*time.Millisecond
				if c.setup != nil {
					c.setup(&cfg)
				}
				done := startPoisonRelay(t, cfg)
				row := func(id, key, payload string) string {
					return `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + id + `', '$P', '` + key + `', 'T', '` + payload + `');`
				}
				exec := func(sql string) {
					t.Helper()
					if _, err := f.conn.Exec(ctx, strings.ReplaceAll(sql, "$P", f.slot)); err != nil {
						t.Fatal(err)
					}
				}
				exec(row(good1, "k", `{"n": 1}`))
				cons := env.NewConsumer(t, []string{topic})
				cons.WaitFor(t, 1, time.Minute)
				exec("BEGIN; " + c.insert + "; " + row(good2, "k", `{"n": 2}`) + row(other, "z", `{"n": 3}`) + " COMMIT;")
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
				if policy == "fail" {
					err := waitPoisonStop(t, done)
					var fe *relay.FatalError
					if !errors.As(err, &fe) || !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "after 2 of poll.max.attempts=2") {
						t.Fatalf("want a fatal error naming event %s, the reason %q and the attempts, got %v", bad, c.reason, err)
					}
					attempts, lastError, published := state(bad)
					if attempts != 2 || !strings.Contains(lastError, c.reason) || published {
						t.Fatalf("poison row: attempts %d, last_error %q, published %v; want 2, the reason, unpublished", attempts, lastError, published)
					}
					if _, _, published := state(good2); published {
						t.Fatal("the later row of the poison row's key was published")
					}
					if _, _, published := state(other); !published {
						t.Fatal("the row of another key was not published")
					}
					msgs := drain(t, cons, &fixture{env: env, topics: []string{topic}})
					for _, m := range msgs {
						if id, _ := m.Header("id"); string(id) == good2 {
							t.Fatal("the later row of the poison row's key reached Kafka")
						}
					}
					return
				}
				msgs := cons.WaitFor(t, 3, time.Minute)
				var order []string
				for _, m := range msgs {
					id, _ := m.Header("id")
					order = append(order, string(id))
				}
				if order[0] != good1 || !strings.Contains(strings.Join(order[1:], " "), good2) || !strings.Contains(strings.Join(order[1:], " "), other) {
					t.Fatalf("records %v; want %s first, then %s and %s", order, good1, good2, other)
				}
				d := env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, time.Minute)[0]
				id, _ := d.Header("id")
				reason, _ := d.Header("pgoutbox.error.reason")
				seq, _ := d.Header("pgoutbox.poll.seq")
				if string(id) != bad || !strings.Contains(string(reason), c.reason) || len(seq) == 0 || string(d.Key) != "k" || len(d.Value) == 0 {
					t.Fatalf("dead-letter record: id %q reason %q seq %q key %q value %d bytes", id, reason, seq, d.Key, len(d.Value))
				}
				attempts, lastError, published := state(bad)
				if attempts != 2 || !strings.Contains(lastError, c.reason) || !published {
					t.Fatalf("poison row: attempts %d, last_error %q, published %v; want 2, the reason, published", attempts, lastError, published)
				}
				requireRunning(t, done)
			})
		}
	}
}
