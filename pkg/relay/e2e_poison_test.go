package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPoisonRowsFollowThePolicy writes a good event, a poison one and
// another good event, for each kind of poison, under both policies: with
// fail the relay stops with the event id, the LSN and the reason, and the
// slot stays below the poison row; with dead-letter the poison goes to the
// dead-letter topic with its reason and the stream goes on.
// lsnPattern matches an LSN as PostgreSQL prints it; the part before the
// slash is 0 only until the server has written 4 GiB of WAL.
var lsnPattern = regexp.MustCompile(`[0-9A-F]+/[0-9A-F]+`)

func TestPoisonRowsFollowThePolicy(t *testing.T) {
	env := testenv.Require(t)
	const good1, bad, good2 = "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000b2", "00000000-0000-4000-8000-0000000000c3"
	cases := []struct {
		name   string
		setup  func(*relay.Config)
		insert string // the poison row; $P is the test's prefix
		reason string // expected in the error or dead-letter reason
		id     string // the event id the error and the dead-letter record name ("" for none)
		key    string // the dead-letter record's key: the row's own
	}{
		{"null routing value", nil,
			`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + bad + `', NULL, 'k', 'T', '{}')`, "NULL", bad, "k"},
		{"record larger than Kafka accepts", func(c *relay.Config) { c.Kafka.MaxMessageBytes = 4000 },
			`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + bad + `', '$P', 'k', 'T', json_build_object('pad', repeat('x', 5000)))`, "kafka.max.message.bytes", bad, "k"},
		{"topic does not exist", func(c *relay.Config) { c.Kafka.TopicMissingTimeout = 2 * time.Second },
			`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + bad + `', '$P_nowhere', 'k', 'T', '{}')`, "does not exist", bad, "k"},
		// One such message once crash-looped every relay on the database.
		{"message that is not a JSON object", nil,
			`SELECT pg_logical_emit_message(true, 'outbox', '["not", "an object"]')`, "not a JSON object", "", ""},
		// Without its key field it would go keyless, its order per key
		// lost, where a table without the column is refused.
		{"message without its key field", nil,
			`SELECT pg_logical_emit_message(true, 'outbox', '{"id": "` + bad + `", "aggregatetype": "$P", "type": "T", "payload": {}}')`, `table.field.event.key "aggregateid" is not a field of the message`, "", ""},
	}
	for _, c := range cases {
		for _, policy := range []string{"fail", "dead-letter"} {
			t.Run(c.name+"/"+policy, func(t *testing.T) {
				f := newFixture(t, env, 1)
				ctx := context.Background()
				cfg := f.config()
				topic, dlq := f.poisonTopics(t, &cfg, policy)
				if c.setup != nil {
					c.setup(&cfg)
				}
				dl := &deadLetterCount{}
				done := startPoisonRelay(t, cfg, relay.WithObserver(dl))
				f.waitStreaming(t)
				insert := func(sql string) {
					t.Helper()
					if _, err := f.conn.Exec(ctx, strings.ReplaceAll(sql, "$P", f.slot)); err != nil {
						t.Fatal(err)
					}
				}
				insert(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + good1 + `', '$P', 'k', 'T', '{"n": 1}')`)
				c1 := env.NewConsumer(t, []string{topic})
				c1.WaitFor(t, 1, time.Minute)
				var before string
				if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&before); err != nil {
					t.Fatal(err)
				}
				insert(c.insert)
				insert(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + good2 + `', '$P', 'k', 'T', '{"n": 2}')`)

				if policy == "fail" {
					err := waitPoisonStop(t, done)
					var fe *relay.FatalError
					if !errors.As(err, &fe) || !strings.Contains(err.Error(), c.reason) || !lsnPattern.MatchString(err.Error()) {
						t.Fatalf("want a fatal error with the reason %q and an LSN, got %v", c.reason, err)
					}
					if c.id != "" && !strings.Contains(err.Error(), c.id) && c.name != "null routing value" {
						t.Fatalf("error does not name event %s: %v", c.id, err)
					}
					// The error names the poison transaction's commit LSN;
					// the slot must not have been confirmed past it.
					m := regexp.MustCompile(`[0-9A-F]+/[0-9A-F]+`).FindString(err.Error())
					commit, perr := parseLSN(m)
					if perr != nil {
						t.Fatalf("no commit LSN in %v", err)
					}
					confirmed, _ := f.slotState(t)
					beforeLSN, _ := parseLSN(before)
					if confirmed > commit || commit < beforeLSN {
						t.Fatalf("slot confirmed %s, past the poison transaction's commit %s (written after %s)", confirmed, commit, before)
					}
					return
				}
				// dead-letter: the second good event arrives, the poison is on the DLQ.
				msgs := c1.WaitFor(t, 2, time.Minute)
				if id, _ := msgs[1].Header("id"); string(id) != good2 {
					t.Fatalf("second record is %s, want %s", id, good2)
				}
				d := env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, time.Minute)[0]
				id, _ := d.Header("id")
				reason, _ := d.Header("pgoutbox.error.reason")
				lsn, _ := d.Header("pgoutbox.commit.lsn")
				if string(id) != c.id || !strings.Contains(string(reason), c.reason) || !lsnPattern.MatchString(string(lsn)) || len(d.Value) == 0 {
					t.Fatalf("dead-letter record: id %q reason %q lsn %q value %d bytes", id, reason, lsn, len(d.Value))
				}
				if string(d.Key) != c.key {
					t.Fatalf("dead-letter record's key is %q, want the row's own %q", d.Key, c.key)
				}
				// A value cut to fit is still JSON, and says so.
				if _, cut := d.Header("pgoutbox.truncated.from"); cut {
					var v struct {
						Truncated bool   `json:"pgoutbox.truncated"`
						Head      []byte `json:"head_base64"`
					}
					if err := json.Unmarshal(d.Value, &v); err != nil || !v.Truncated || len(v.Head) == 0 {
						t.Fatalf("cut dead-letter value is not the JSON that says so: %v: %.200s", err, d.Value)
					}
				}
				requireRunning(t, done)
				// Counted under the topic the event was meant for (the
				// dead-letter topic's when it had none), as the poll
				// source counts it.
				want := dlq
				switch c.name {
				case "record larger than Kafka accepts":
					want = topic
				case "topic does not exist":
					want = "outbox.event." + f.slot + "_nowhere"
				}
				if got := dl.topics(); !slices.Equal(got, []string{want}) {
					t.Fatalf("dead-lettered events counted under %v, want [%s]", got, want)
				}
			})
		}
	}
}

// deadLetterCount records the topics the relay counts dead-lettered
// events under.
type deadLetterCount struct {
	relay.NopObserver
	mu   sync.Mutex
	seen []string
}

func (d *deadLetterCount) DeadLettered(topic string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen = append(d.seen, topic)
}

func (d *deadLetterCount) topics() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.seen)
}

// poisonTopics lets the outbox table hold a NULL routing value (one kind
// of poison), creates the test's topic with one partition, and sets cfg's
// poison policy as poisonPolicy does. It serves the WAL and the poll
// source's poison tests.
func (f *fixture) poisonTopics(t *testing.T, cfg *relay.Config, policy string) (topic, dlq string) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), "ALTER TABLE outbox ALTER COLUMN aggregatetype DROP NOT NULL"); err != nil {
		t.Fatal(err)
	}
	topic = "outbox.event." + f.slot
	f.env.CreateTopic(t, topic, 1)
	return topic, f.poisonPolicy(t, cfg, policy)
}

// poisonPolicy sets cfg's poison policy, with the test's dead-letter topic,
// which it creates with one partition.
func (f *fixture) poisonPolicy(t *testing.T, cfg *relay.Config, policy string) (dlq string) {
	t.Helper()
	dlq = f.slot + ".dlq"
	f.env.CreateTopic(t, dlq, 1)
	cfg.Relay.PoisonPolicy, cfg.Relay.DeadLetterTopic = policy, dlq
	return dlq
}

// startPoisonRelay runs the relay of cfg, logging warnings and worse, until
// the test ends. Its result arrives on the channel: the fail policy stops
// it (waitPoisonStop), dead-letter must not (requireRunning).
func startPoisonRelay(t *testing.T, cfg relay.Config, opts ...relay.Option) <-chan error {
	t.Helper()
	r, err := relay.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return done
}

// waitPoisonStop waits a minute for the relay to stop on the poison row,
// and returns Run's error.
func waitPoisonStop(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("relay did not stop on the poison row")
		return nil
	}
}

// requireRunning fails if the relay has stopped.
func requireRunning(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("relay stopped: %v", err)
	default:
	}
}

// TestTopicCreatedAfterItsFirstRecordIsNotPoison: the first record for a
// topic that does not exist yet waits (kafka.topic.missing.timeout) for it,
// rather than counting as poison at once, and the relay keeps streaming and
// answering PostgreSQL meanwhile.
func TestTopicCreatedAfterItsFirstRecordIsNotPoison(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	late := "outbox.event." + f.slot + "_late"
	cfg := f.config()
	dlq := f.poisonPolicy(t, &cfg, "dead-letter")
	cfg.Kafka.TopicMissingTimeout = time.Minute
	p := runInProcess(t, cfg)
	defer func() {
		if err := p.stop(t); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	f.waitStreaming(t)
	const id = "00000000-0000-4000-8000-0000000000d4"
	if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')`,
		id, f.slot+"_late"); err != nil {
		t.Fatal(err)
	}
	// The relay has the record and asks about the topic; create it now.
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		lsn, _ := f.slotState(t)
		return lsn > 0, "slot state"
	})
	env.CreateTopic(t, late, 1)
	m := env.NewConsumer(t, []string{late}).WaitFor(t, 1, time.Minute)[0]
	if got, _ := m.Header("id"); string(got) != id {
		t.Fatalf("record id %q, want %s", got, id)
	}
	if hw := env.HighWater(t, []string{dlq}); hw[dlq+"/0"] != 0 {
		t.Fatalf("the record was dead-lettered as well: %d records on %s", hw[dlq+"/0"], dlq)
	}
}

// TestBatchTooLargeForItsTopicPoisonsOnlyTheRecordTooLarge: a topic whose
// max.message.bytes is far below the producer's refuses whole batches as too
// large; only the record that is too large on its own is poison (here: it
// goes to the dead-letter topic), every other record arrives.
func TestBatchTooLargeForItsTopicPoisonsOnlyTheRecordTooLarge(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	small := "outbox.event." + f.slot + "_small"
	cfg := f.config()
	dlq := f.poisonPolicy(t, &cfg, "dead-letter")
	if err := kafka.CreateTopicsWithConfig(kafka.Config{Brokers: env.KafkaBrokers}, []string{small}, 1, 1,
		map[string]string{"max.message.bytes": "6000"}); err != nil {
		t.Fatal(err)
	}
	cfg.Kafka.FlushFrequency = 50 * time.Millisecond // batches of many records
	p := runInProcess(t, cfg)
	f.waitStreaming(t)
	const big = "00000000-0000-4000-8000-0000000000ff"
	tx, err := f.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 0; i < 60; i++ {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'T', json_build_object('pad', repeat('x', 900)))`,
			id, f.slot+"_small", fmt.Sprint(i%4)); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', json_build_object('pad', repeat('x', 8000)))`,
		big, f.slot+"_small"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := receivedIDs(env.ConsumeAll(t, []string{small}, time.Minute, func(n int) bool { return n >= len(want) }))
	if !slices.Equal(got, want) {
		t.Fatalf("received %d distinct records, want %d", len(got), len(want))
	}
	env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, time.Minute)
	if err := p.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The refused batch is resent from the slot, so the big record may be
	// dead-lettered twice (with its id): never another record.
	n := env.HighWater(t, []string{dlq})[dlq+"/0"]
	for _, m := range env.ConsumeAll(t, []string{dlq}, time.Minute, func(got int) bool { return int64(got) >= n }) {
		if id, _ := m.Header("id"); string(id) != big {
			t.Fatalf("dead-lettered %q, want only %s", id, big)
		}
	}
}

// TestRecordKafkaRefusesAloneIsDeadLettered: a row with a NULL key for a
// compacted topic, which Kafka refuses (INVALID_RECORD) and pgoutbox cannot
// know beforehand, in a transaction with good rows and followed by another.
// Kafka refuses the whole batch, the relay resends one record per request,
// and the record refused alone is dead-lettered and the stream goes on, in
// both modes. In exactly-once mode the record refused alone used to be
// dead-lettered into the Kafka transaction its refusal had doomed, which
// failed, and the next session did the same: a restart loop with the slot
// frozen. With exactly-once, a read_committed consumer sees each key in
// commit order.
func TestRecordKafkaRefusesAloneIsDeadLettered(t *testing.T) {
	env := testenv.Require(t)
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, env, 1)
			ctx := context.Background()
			topic := "outbox.event." + f.slot + "_compact"
			cfg := f.config()
			dlq := f.poisonPolicy(t, &cfg, "dead-letter")
			if err := kafka.CreateTopicsWithConfig(kafka.Config{Brokers: env.KafkaBrokers}, []string{topic}, 1, 1,
				map[string]string{"cleanup.policy": "compact"}); err != nil {
				t.Fatal(err)
			}
			var opts []testenv.ConsumerOption
			if mode == "exactly-once" {
				cfg.Kafka.ExactlyOnce = true
				cfg.Kafka.OffsetsTopic = "pgoutbox.offsets." + f.slot
				opts = append(opts, testenv.ReadCommitted())
			}
			cfg.Kafka.FlushFrequency = 50 * time.Millisecond // batches of many records
			f.exec(t, "ALTER TABLE outbox ALTER COLUMN aggregateid DROP NOT NULL")
			p := runInProcess(t, cfg)
			f.waitStreaming(t)
			const bad = "00000000-0000-4000-8000-0000000000ff"
			var want []string
			var end checkpoint.LSN // within the last transaction, after its rows
			for tx := 0; tx < 2; tx++ {
				b, err := f.conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 8; i++ {
					if tx == 0 && i == 4 {
						if _, err := b.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, NULL, 'T', '{}')`,
							bad, f.slot+"_compact"); err != nil {
							t.Fatal(err)
						}
					}
					id := fmt.Sprintf("00000000-0000-4000-8000-%06d%06d", tx, i)
					if _, err := b.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'T', '{}')`,
						id, f.slot+"_compact", fmt.Sprintf("k%d", i%4)); err != nil {
						t.Fatal(err)
					}
					want = append(want, id)
				}
				var at string
				if err := b.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&at); err != nil {
					t.Fatal(err)
				}
				if end, err = parseLSN(at); err != nil {
					t.Fatal(err)
				}
				if err := b.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			c := env.NewConsumer(t, []string{topic}, opts...)
			sorted := slices.Sorted(slices.Values(want))
			var msgs []testenv.Message
			testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
				msgs = c.Messages()
				got := receivedIDs(msgs)
				return slices.Equal(got, sorted), fmt.Sprintf("received %d distinct events of %d: %v", len(got), len(sorted), got)
			})
			// With read_committed, each key in commit order (ids grow with
			// it). At least once does not promise that here: sarama writes
			// the later batches it holds when Kafka refuses one (README,
			// "Order per key is kept").
			seen := map[string]bool{}
			if mode != "exactly-once" {
				seen = nil
			}
			last := map[string]string{}
			for _, m := range msgs {
				if seen == nil {
					break
				}
				id, _ := m.Header("id")
				if seen[string(id)] {
					continue
				}
				seen[string(id)] = true
				if prev := last[string(m.Key)]; prev > string(id) {
					t.Errorf("key %s: %s arrived first after %s, which was committed after it", m.Key, prev, id)
				}
				last[string(m.Key)] = string(id)
			}
			d := env.NewConsumer(t, []string{dlq}, opts...).WaitFor(t, 1, time.Minute)
			for _, m := range d {
				if id, _ := m.Header("id"); string(id) != bad {
					t.Fatalf("dead-lettered %q, want only %s", id, bad)
				}
			}
			testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
				confirmed, _ := f.slotState(t)
				return confirmed >= end, fmt.Sprintf("the slot is at %s, below %s in the last transaction written", confirmed, end)
			})
			if err := p.stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}

// TestCompressedRecordOverTheTopicsLimitUncompressedIsSent: the broker
// applies a topic's max.message.bytes to batches after compression. With
// kafka.compression on, a record larger than the limit uncompressed but far
// smaller compressed is one Kafka accepts: it was refused as poison by the
// relay's own size check (here: dead-lettered), and now arrives on its
// topic. A record too large even compressed is still poison (the broker
// refuses it alone).
func TestCompressedRecordOverTheTopicsLimitUncompressedIsSent(t *testing.T) {
	env := testenv.Require(t)
	f, small, cfg, dlq := gzipFixture(t, env, "6000")
	ctx := context.Background()
	p := runInProcess(t, cfg)
	f.waitStreaming(t)
	const compressible, random = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
	if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
		($1, $3, 'k', 'T', json_build_object('pad', repeat('x', 20000))),
		($2, $3, 'k', 'T', json_build_object('pad', (SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 400) g)))`,
		compressible, random, f.slot+"_gz"); err != nil {
		t.Fatal(err)
	}
	got := receivedIDs(env.ConsumeAll(t, []string{small}, time.Minute, func(n int) bool { return n >= 1 }))
	if !slices.Equal(got, []string{compressible}) {
		t.Fatalf("received %v on %s, want the compressible record only", got, small)
	}
	dl := env.ConsumeAll(t, []string{dlq}, time.Minute, func(n int) bool { return n >= 1 })
	if id, _ := dl[0].Header("id"); string(id) != random {
		t.Fatalf("dead-lettered %q, want %s (13 KB of hex does not compress under 6 KB)", id, random)
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestOversizeCompressedRecordKeepsOtherKeysInOrder: with compression on, a
// record too large for its topic even compressed, sent to the broker,
// takes its whole batch down with it: another key's records in that batch
// fail too, sarama sends later batches meanwhile, and the restart resends
// the failed ones after them, out of commit order. The relay judges such a
// record by its size compressed and refuses it before sending (here: it is
// dead-lettered), so key a's records arrive in commit order. One
// transaction: a0, the large record of key b, then a1 to a2999.
func TestOversizeCompressedRecordKeepsOtherKeysInOrder(t *testing.T) {
	env := testenv.Require(t)
	f, topic, cfg, dlq := gzipFixture(t, env, "200000")
	ctx := context.Background()
	p := runInProcess(t, cfg)
	f.waitStreaming(t)
	const n = 3000
	if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, $1,
			CASE WHEN g = 1 THEN 'b' ELSE 'a' END, 'T',
			CASE WHEN g = 1 THEN json_build_object('pad', (SELECT string_agg(md5(h::text || random()::text), '') FROM generate_series(1, 20000) h))
				ELSE json_build_object('n', g, 'pad', repeat('y', 1000)) END
		FROM generate_series(0, $2) g ORDER BY g`, f.slot+"_gz", n); err != nil {
		t.Fatal(err)
	}
	got := env.ConsumeAll(t, []string{topic}, 2*time.Minute, func(k int) bool { return k >= n })
	var first []string
	seen := map[string]bool{}
	for _, m := range got {
		id, _ := m.Header("id")
		if string(m.Key) != "a" || seen[string(id)] {
			continue
		}
		seen[string(id)] = true
		first = append(first, string(id))
	}
	if len(first) != n {
		t.Fatalf("%d distinct records of key a, want %d", len(first), n)
	}
	if !slices.IsSorted(first) {
		for i := 1; i < len(first); i++ {
			if first[i] < first[i-1] {
				t.Fatalf("key a first delivered out of commit order: %s after %s (position %d of %d)", first[i], first[i-1], i, len(first))
			}
		}
	}
	d := env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, time.Minute)[0]
	if id, _ := d.Header("id"); string(id) != "00000000-0000-4000-8000-000000000001" {
		t.Fatalf("dead-lettered %q, want the large record", id)
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// gzipFixture is a fixture whose relay compresses with gzip and
// dead-letters poison, and a topic of aggregate type <slot>_gz whose
// max.message.bytes is limit.
func gzipFixture(t *testing.T, env *testenv.Env, limit string) (f *fixture, topic string, cfg relay.Config, dlq string) {
	t.Helper()
	f = newFixture(t, env, 1)
	topic = "outbox.event." + f.slot + "_gz"
	cfg = f.config()
	cfg.Kafka.Compression = "gzip"
	dlq = f.poisonPolicy(t, &cfg, "dead-letter")
	if err := kafka.CreateTopicsWithConfig(kafka.Config{Brokers: env.KafkaBrokers}, []string{topic}, 1, 1,
		map[string]string{"max.message.bytes": limit}); err != nil {
		t.Fatal(err)
	}
	return f, topic, cfg, dlq
}
