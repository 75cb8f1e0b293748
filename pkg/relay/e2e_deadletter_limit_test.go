package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// limitCase is a dead-letter test's setup: the event topic and the
// dead-letter topic with max.message.bytes of their own, and the relay
// running on the source with poison.policy=dead-letter.
type limitCase struct {
	f          *fixture
	topic, dlq string
	obs        *sessionCount
	done       <-chan error
}

// limitSources are the paths a poison row takes: the WAL source's stream,
// the poll source, and the WAL source's initial snapshot.
var limitSources = []string{"stream", "poll", "snapshot"}

// startLimitCase makes the topics (the event topic's max.message.bytes
// topicLimit, the dead-letter topic's dlqLimit), starts the relay on
// source (one of limitSources; on the poll source each row gets one
// attempt, so that a poison row is dead-lettered in the claim it comes in,
// with the rows around it) and writes the rows (insertRows: before the
// start for the snapshot).
func startLimitCase(t *testing.T, env *testenv.Env, source string, topicLimit, dlqLimit int) *limitCase {
	t.Helper()
	c := &limitCase{obs: &sessionCount{}}
	var cfg relay.Config
	if source == "poll" {
		c.f = newPollFixture(t, env, 1)
		cfg = c.f.pollConfig()
		cfg.Poll.MaxAttempts = 1
	} else {
		c.f = newFixture(t, env, 1)
		cfg = c.f.config()
	}
	c.topic, c.dlq = "outbox.event."+c.f.slot, c.f.slot+".dlq"
	env.CreateTopicWith(t, c.topic, testenv.TopicSpec{Partitions: 1, Configs: map[string]string{"max.message.bytes": strconv.Itoa(topicLimit)}})
	env.CreateTopicWith(t, c.dlq, testenv.TopicSpec{Partitions: 1, Configs: map[string]string{"max.message.bytes": strconv.Itoa(dlqLimit)}})
	cfg.Relay.PoisonPolicy, cfg.Relay.DeadLetterTopic = "dead-letter", c.dlq
	if source == "snapshot" {
		cfg.Snapshot.Mode = relay.SnapshotInitial
		c.insertRows(t)
	}
	c.done = startPoisonRelay(t, cfg, relay.WithObserver(c.obs))
	switch source {
	case "stream":
		c.f.waitStreaming(t)
		c.insertRows(t)
	case "poll":
		c.insertRows(t)
	}
	return c
}

// The rows of a limitCase: a good row of key k, a poison row of k larger
// than the event topic takes (and than the dead-letter topic takes), a
// later good row of k and a row of another key, in one transaction: one
// claim of the poll source.
const (
	limitGood1 = "00000000-0000-4000-8000-0000000001a1"
	limitBad   = "00000000-0000-4000-8000-0000000001b2"
	limitGood2 = "00000000-0000-4000-8000-0000000001c3"
	limitOther = "00000000-0000-4000-8000-0000000001d4"
)

func (c *limitCase) insertRows(t *testing.T) {
	t.Helper()
	row := func(id, key, payload string) string {
		return `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + id + `', '` + c.f.slot + `', '` + key + `', 'T', ` + payload + `);`
	}
	sql := "BEGIN; " + row(limitGood1, "k", `'{"n": 1}'`) + row(limitBad, "k", `json_build_object('pad', repeat('x', 5000))`) +
		row(limitGood2, "k", `'{"n": 2}'`) + row(limitOther, "z", `'{"n": 3}'`) + " COMMIT;"
	if _, err := c.f.conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// sent is the ids of the records on topic, in order, read up to its high
// water mark.
func (c *limitCase) sent(t *testing.T, topic string) []string {
	t.Helper()
	n := c.f.env.HighWater(t, []string{topic})[topic+"/0"]
	if n == 0 {
		return nil
	}
	var ids []string
	for _, m := range c.f.env.ConsumeAll(t, []string{topic}, time.Minute, func(got int) bool { return int64(got) >= n }) {
		id, _ := m.Header("id")
		ids = append(ids, string(id))
	}
	return ids
}

// sessionCount counts the relay's sessions.
type sessionCount struct {
	relay.NopObserver
	mu sync.Mutex
	n  int
}

func (s *sessionCount) SessionStarted(checkpoint.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
}

func (s *sessionCount) sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// TestDeadLetterRecordIsCutToTheDeadLetterTopicsOwnLimit: the dead-letter
// topic takes less (max.message.bytes 1500) than the event topic (2000),
// and a poison row is larger than both. Its dead-letter record was cut to
// half the producer's limit only, which the dead-letter topic refused: the
// WAL source stopped on it at every start, and the poll source took the
// refusal for a batch to resend, rolled its claim back and started again
// every few seconds, sending the claim's other rows again each time and
// never marking them published (and the snapshot started again, and
// again). Now it is cut to what the dead-letter topic takes, and says so;
// every other row is sent once.
func TestDeadLetterRecordIsCutToTheDeadLetterTopicsOwnLimit(t *testing.T) {
	env := testenv.Require(t)
	for _, source := range limitSources {
		t.Run(source, func(t *testing.T) {
			c := startLimitCase(t, env, source, 2000, 1500)
			msgs, err := waitOrStop(env.NewConsumer(t, []string{c.dlq}), 1, 40*time.Second, c.done)
			if err != nil {
				t.Fatalf("no dead-letter record (%d sessions): %v", c.obs.sessions(), err)
			}
			d := msgs[0]
			id, _ := d.Header("id")
			from, cut := d.Header("pgoutbox.truncated.from")
			var v struct {
				Truncated bool   `json:"pgoutbox.truncated"`
				Size      int    `json:"size"`
				Head      []byte `json:"head_base64"`
			}
			if string(id) != limitBad || !cut || json.Unmarshal(d.Value, &v) != nil || !v.Truncated || len(v.Head) < 200 || strconv.Itoa(v.Size) != string(from) {
				t.Fatalf("dead-letter record: id %q, truncated.from %q (%v), value of %d bytes %.300s; want %s, cut, with the value's head", id, from, cut, len(d.Value), d.Value, limitBad)
			}
			testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
				n := env.HighWater(t, []string{c.topic})[c.topic+"/0"]
				return n >= 3, fmt.Sprintf("%d records on %s", n, c.topic)
			})
			if source == "poll" {
				testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
					n := c.f.unpublished(t)
					return n == 0, fmt.Sprintf("%d rows unpublished", n)
				})
			}
			requireRunning(t, c.done)
			if got, want := c.sent(t, c.topic), []string{limitGood1, limitOther, limitGood2}; !sameIDs(got, want) {
				t.Fatalf("records on %s: %v; want each of %v once", c.topic, got, want)
			}
			if got := c.sent(t, c.dlq); !slices.Equal(got, []string{limitBad}) {
				t.Fatalf("records on %s: %v; want %s once", c.dlq, got, limitBad)
			}
			// The snapshot's stream may be about to start.
			if n := c.obs.sessions(); n != 1 && (source != "snapshot" || n != 0) {
				t.Fatalf("%d sessions; want 1 (no restart)", n)
			}
		})
	}
}

// TestDeadLetterRecordTheDeadLetterTopicRefusesStopsOnce: the dead-letter
// topic takes so little (max.message.bytes 300) that the dead-letter
// record's key and headers alone are too large. The relay stops once, at
// once, naming the event and both topics; on the poll source the rows of
// the claim Kafka acknowledged are marked published, not sent again (the
// snapshot sends them again at the next start, as it sends everything).
func TestDeadLetterRecordTheDeadLetterTopicRefusesStopsOnce(t *testing.T) {
	env := testenv.Require(t)
	for _, source := range limitSources {
		t.Run(source, func(t *testing.T) {
			c := startLimitCase(t, env, source, 2000, 300)
			err := waitPoisonStop(t, c.done)
			var fe *relay.FatalError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), limitBad) || !strings.Contains(err.Error(), strconv.Quote(c.topic)) || !strings.Contains(err.Error(), strconv.Quote(c.dlq)) {
				t.Fatalf("want a fatal error naming event %s, %s and %s; got %v", limitBad, c.topic, c.dlq, err)
			}
			// The snapshot stops before the stream's session.
			if n := c.obs.sessions(); n != 1 && (source != "snapshot" || n != 0) {
				t.Fatalf("%d sessions; want 1 (no restart)", n)
			}
			if got := c.sent(t, c.dlq); len(got) != 0 {
				t.Fatalf("records on %s: %v; want none", c.dlq, got)
			}
			got := c.sent(t, c.topic)
			if source == "stream" {
				// The transaction is not confirmed: a start sends it again.
				return
			}
			if source == "snapshot" {
				// Its fetches follow the rows' size: the row of the other
				// key may come in the poison row's fetch or after it. The
				// next start takes a new snapshot.
				if !sameIDs(got, []string{limitGood1}) && !sameIDs(got, []string{limitGood1, limitOther}) {
					t.Fatalf("records on %s: %v; want %s once, and %s at most once", c.topic, got, limitGood1, limitOther)
				}
				return
			}
			if want := []string{limitGood1, limitOther}; !sameIDs(got, want) {
				t.Fatalf("records on %s: %v; want each of %v once", c.topic, got, want)
			}
			published := map[string]bool{}
			rows, qerr := c.f.checkDB.Query(context.Background(), "SELECT id::text, published_at IS NOT NULL FROM outbox")
			if qerr != nil {
				t.Fatal(qerr)
			}
			for rows.Next() {
				var id string
				var p bool
				if err := rows.Scan(&id, &p); err != nil {
					t.Fatal(err)
				}
				published[id] = p
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
			if !published[limitGood1] || !published[limitOther] || published[limitBad] || published[limitGood2] {
				t.Fatalf("published: %v; want %s and %s only", published, limitGood1, limitOther)
			}
		})
	}
}

// TestPollRecordForAPartitionAddedSinceIsDelivered: a row placed on a
// partition added to its topic after the producer cached the topic's
// partition count (sarama keeps it up to ten minutes) is refused as if the
// partition did not exist. The poll source counted that as an attempt and
// dead-lettered the row after poll.max.attempts; it now starts a new
// producer, with fresh metadata, once per row before counting an attempt,
// as the WAL source restarts once. A row placed on a partition that does
// not exist with fresh metadata either gets one new producer, then counts
// its attempts and is dead-lettered.
func TestPollRecordForAPartitionAddedSinceIsDelivered(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	f := newPollFixture(t, env, 1)
	if _, err := f.conn.Exec(ctx, "ALTER TABLE outbox ADD COLUMN part int"); err != nil {
		t.Fatal(err)
	}
	topic := f.pollTopic(t)
	cfg := f.pollConfig()
	dlq := f.poisonPolicy(t, &cfg, "dead-letter")
	cfg.Router.AdditionalPlacement = "part:partition"
	cfg.Poll.MaxAttempts = 2
	cfg.Poll.RetryBackoff, cfg.Poll.RetryBackoffMax = 300*time.Millisecond, 300*time.Millisecond
	obs := &sessionCount{}
	done := startPoisonRelay(t, cfg, relay.WithObserver(obs))
	const first, second = "00000000-0000-4000-8000-0000000002a1", "00000000-0000-4000-8000-0000000002b2"
	insert := func(id string, part int) {
		t.Helper()
		if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, part) VALUES ($1, $2, 'k', 'T', '{}', $3)`, id, f.slot, part); err != nil {
			t.Fatal(err)
		}
	}
	// The producer learns the topic has one partition.
	insert(first, 0)
	cons := env.NewConsumer(t, []string{topic})
	cons.WaitFor(t, 1, time.Minute)
	addPartitions(t, env, topic, 2)
	insert(second, 1)
	// A consumer reads the partitions the topic had when it was made.
	msgs, err := waitOrStop(env.NewConsumer(t, []string{topic}), 2, 90*time.Second, done)
	if err != nil {
		t.Fatalf("the row placed on the new partition was not delivered (%d dead-lettered): %v", env.HighWater(t, []string{dlq})[dlq+"/0"], err)
	}
	i := slices.IndexFunc(msgs, func(m testenv.Message) bool { id, _ := m.Header("id"); return string(id) == second })
	if i < 0 || msgs[i].Partition != 1 {
		t.Fatalf("records %+v; want %s on partition 1", msgs, second)
	}
	var attempts int
	var published bool
	if err := f.checkDB.QueryRow(ctx, "SELECT attempts, published_at IS NOT NULL FROM outbox WHERE id = $1", second).Scan(&attempts, &published); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("the row counted %d attempts; want none (a refusal from stale metadata is not an attempt)", attempts)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := f.unpublished(t)
		return n == 0, fmt.Sprintf("%d rows unpublished", n)
	})
	if hw := env.HighWater(t, []string{dlq}); hw[dlq+"/0"] != 0 {
		t.Fatalf("%d records dead-lettered; want none", hw[dlq+"/0"])
	}
	// A partition that does not exist with fresh metadata either: one new
	// producer, then its attempts count, and it is dead-lettered.
	const third = "00000000-0000-4000-8000-0000000002c3"
	insert(third, 7)
	if _, err := waitOrStop(env.NewConsumer(t, []string{dlq}), 1, time.Minute, done); err != nil {
		t.Fatalf("the row placed on a partition that does not exist was not dead-lettered (%d sessions): %v", obs.sessions(), err)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := f.unpublished(t)
		return n == 0, fmt.Sprintf("%d rows unpublished", n)
	})
	if err := f.checkDB.QueryRow(ctx, "SELECT attempts FROM outbox WHERE id = $1", third).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	// A session to start with, and one new producer for each row.
	if n := obs.sessions(); attempts != 2 || n != 3 {
		t.Fatalf("the row placed on a partition that does not exist: %d attempts, %d sessions; want 2 and 3", attempts, n)
	}
	requireRunning(t, done)
}

// addPartitions grows topic to n partitions and waits until a new client
// sees them.
func addPartitions(t *testing.T, env *testenv.Env, topic string, n int32) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(env.KafkaBrokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close() }()
	if err := admin.CreatePartitions(topic, n, nil, false); err != nil {
		t.Fatalf("add partitions to %s: %v", topic, err)
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		client, err := sarama.NewClient(env.KafkaBrokers, sc)
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = client.Close() }()
		parts, err := client.Partitions(topic)
		return err == nil && len(parts) == int(n), fmt.Sprintf("%s: %d partitions (%v)", topic, len(parts), err)
	})
}

// sameIDs says got holds each of want once, in any order.
func sameIDs(got, want []string) bool {
	return len(got) == len(want) && !slices.ContainsFunc(want, func(id string) bool { return !slices.Contains(got, id) })
}

// waitOrStop waits up to timeout for c to have read n records; it gives
// up early when the relay of done stops.
func waitOrStop(c *testenv.Consumer, n int, timeout time.Duration, done <-chan error) ([]testenv.Message, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for c.Len() < n {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("read %d of %d records within %s", c.Len(), n, timeout)
		}
		select {
		case err := <-done:
			return nil, fmt.Errorf("relay stopped: %w", err)
		case <-tick.C:
		}
	}
	return c.Messages(), nil
}
