package relay_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// timestampFixture is newFixture (newPollFixture, for the poll source)
// whose outbox has a column occurred, the records' timestamps
// (table.field.event.timestamp), with cfg for the source.
func timestampFixture(t *testing.T, env *testenv.Env, source string) (*fixture, relay.Config) {
	t.Helper()
	var f *fixture
	var cfg relay.Config
	if source == "poll" {
		f = newPollFixture(t, env, 1)
		cfg = f.pollConfig()
		cfg.Poll.MaxAttempts = 2
		cfg.Poll.RetryBackoff, cfg.Poll.RetryBackoffMax = 300*time.Millisecond, 300*time.Millisecond
	} else {
		f = newFixture(t, env, 1)
		cfg = f.config()
	}
	f.exec(t, "ALTER TABLE outbox ADD COLUMN occurred timestamptz")
	cfg.Router.EventTimestampField = "occurred"
	return f, cfg
}

// insertAt writes the event id of key k for the topic of aggregate type
// agg, in a transaction of its own, its timestamp column set by the SQL
// expression at; payload is the payload's SQL (NULL: '{}').
func (f *fixture) insertAt(t *testing.T, id, agg, k, at, payload string) {
	t.Helper()
	if payload == "" {
		payload = `'{}'`
	}
	f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, occurred) VALUES ($1, $2, $3, 'T', `+payload+`, `+at+`)`, id, agg, k)
}

// occurred is the event's timestamp column, as the relay's errors write it.
func (f *fixture) occurred(t *testing.T, id string) string {
	t.Helper()
	var ts time.Time
	if err := f.checkDB.QueryRow(context.Background(), "SELECT occurred FROM outbox WHERE id = $1", id).Scan(&ts); err != nil {
		t.Fatal(err)
	}
	return ts.UTC().Format(time.RFC3339Nano)
}

// TestRecordOlderThanItsTopicsRetentionIsPoison: with the timestamp column
// as the records' timestamps, a record older than its topic's retention.ms
// (CreateTime) was accepted by the broker, confirmed, and deleted by the
// next retention check: the event lost without a word. Here the topic keeps
// records an hour; an event stamped two hours ago is poison, on both
// sources and under both policies: with fail the relay stops naming the
// event, the topic, its retention and the record's timestamp and the ways
// on (and the WAL source's slot stays below it), with dead-letter it goes
// to the dead-letter topic, stamped with the time it is dead-lettered
// (the dead-letter topic, which keeps records an hour too, would delete it
// otherwise), and the next event of its key follows. A timestamp two hours
// ahead, which Kafka 4 refuses (message.timestamp.after.max.ms, one hour by
// default), is poison too, and its error says what to do.
func TestRecordOlderThanItsTopicsRetentionIsPoison(t *testing.T) {
	env := testenv.Require(t)
	const good1, bad, good2 = "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000b2", "00000000-0000-4000-8000-0000000000c3"
	cases := []struct {
		name   string
		at     string   // the poison event's timestamp
		local  bool     // refused by the relay, not by the broker
		reason []string // expected in the error or dead-letter reason
	}{
		{"older than the retention", "now() - interval '2 hours'", true,
			[]string{"retention.ms=3600000", "raise the topic's retention.ms", "message.timestamp.type=LogAppendTime", "leave table.field.event.timestamp unset"}},
		{"ahead of the broker's clock", "now() + interval '2 hours'", false,
			[]string{"message.timestamp.after.max.ms", "message.timestamp.type=LogAppendTime", "leave table.field.event.timestamp unset"}},
	}
	for _, c := range cases {
		for _, source := range []string{"wal", "poll"} {
			if source == "poll" && c.name == "ahead of the broker's clock" {
				continue // the broker's refusal is the same for both sources: its message is what is tested
			}
			for _, policy := range []string{"fail", "dead-letter"} {
				t.Run(c.name+"/"+source+"/"+policy, func(t *testing.T) {
					f, cfg := timestampFixture(t, env, source)
					topic, dlq := "outbox.event."+f.slot, f.slot+".dlq"
					hour := map[string]string{"retention.ms": "3600000"}
					env.CreateTopicWith(t, topic, testenv.TopicSpec{Partitions: 1, Configs: hour})
					env.CreateTopicWith(t, dlq, testenv.TopicSpec{Partitions: 1, Configs: hour})
					cfg.Relay.PoisonPolicy, cfg.Relay.DeadLetterTopic = policy, dlq
					done := startPoisonRelay(t, cfg)
					if source == "wal" {
						f.waitStreaming(t)
					}
					f.insertAt(t, good1, f.slot, "k", "now()", "")
					cons := env.NewConsumer(t, []string{topic})
					cons.WaitFor(t, 1, time.Minute)
					before := f.walLSN(t)
					f.insertAt(t, bad, f.slot, "k", c.at, "")
					f.insertAt(t, good2, f.slot, "k", "now()", "")
					stamp := f.occurred(t, bad)
					if policy == "fail" {
						err := waitPoisonStop(t, done)
						var fe *relay.FatalError
						if !errors.As(err, &fe) {
							t.Fatalf("want a fatal error, got %v", err)
						}
						want := append([]string{bad, topic, stamp}, c.reason...)
						for _, w := range want {
							if !strings.Contains(err.Error(), w) {
								t.Fatalf("the error does not say %q: %v", w, err)
							}
						}
						if source == "wal" {
							commit, perr := parseLSN(regexp.MustCompile(`[0-9A-F]+/[0-9A-F]+`).FindString(err.Error()))
							if perr != nil {
								t.Fatalf("no commit LSN in %v", err)
							}
							if confirmed, _ := f.slotState(t); confirmed > commit || commit < before {
								t.Fatalf("slot confirmed %s, past the poison transaction's commit %s (written after %s)", confirmed, commit, before)
							}
						} else {
							var published bool
							if err := f.checkDB.QueryRow(context.Background(), "SELECT published_at IS NOT NULL FROM outbox WHERE id = $1", bad).Scan(&published); err != nil || published {
								t.Fatalf("the poison row is marked published (%v)", err)
							}
						}
						if c.local {
							// Refused before it was sent, it held back the
							// next event of its key (a batch the broker
							// refuses may leave later batches written).
							time.Sleep(time.Second)
							for _, m := range cons.Messages() {
								if id, _ := m.Header("id"); string(id) != good1 {
									t.Fatalf("%s reached the topic, past the poison event", id)
								}
							}
						}
						return
					}
					// A batch the broker refused is sent again from the
					// slot: the first event may arrive twice.
					testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
						got := receivedIDs(cons.Messages())
						return slices.Contains(got, good2), fmt.Sprintf("records on the topic: %v", got)
					})
					if got := receivedIDs(cons.Messages()); !slices.Equal(got, []string{good1, good2}) {
						t.Fatalf("records on the topic %v, want %s and %s", got, good1, good2)
					}
					d := env.NewConsumer(t, []string{dlq}).WaitFor(t, 1, time.Minute)[0]
					id, _ := d.Header("id")
					reason, _ := d.Header("pgoutbox.error.reason")
					if string(id) != bad || string(d.Key) != "k" || len(d.Value) == 0 {
						t.Fatalf("dead-letter record: id %q key %q value %d bytes", id, d.Key, len(d.Value))
					}
					for _, w := range append([]string{stamp}, c.reason...) {
						if !strings.Contains(string(reason), w) {
							t.Fatalf("the dead-letter reason does not say %q: %s", w, reason)
						}
					}
					if age := time.Since(d.Timestamp); age < -time.Minute || age > 5*time.Minute {
						t.Fatalf("the dead-letter record is stamped %s: not the time it was dead-lettered (its topic keeps records an hour)", d.Timestamp)
					}
					requireRunning(t, done)
				})
			}
		}
	}
}

// TestOldRecordsReachTopicsThatKeepThem: the retention check spares topics
// that do not delete records by the timestamps they carry: LogAppendTime
// (the broker stamps them), retention.ms=-1, cleanup.policy=compact. An
// event a month old reaches each, under the fail policy, on both sources.
func TestOldRecordsReachTopicsThatKeepThem(t *testing.T) {
	env := testenv.Require(t)
	for _, source := range []string{"wal", "poll"} {
		t.Run(source, func(t *testing.T) {
			f, cfg := timestampFixture(t, env, source)
			cfg.Relay.PoisonPolicy = "fail"
			kinds := []struct {
				suffix  string
				configs map[string]string
			}{
				{"_append", map[string]string{"retention.ms": "3600000", "message.timestamp.type": "LogAppendTime"}},
				{"_forever", map[string]string{"retention.ms": "-1"}},
				{"_compact", map[string]string{"retention.ms": "3600000", "cleanup.policy": "compact"}},
			}
			var topics, want []string
			for i, k := range kinds {
				topic := "outbox.event." + f.slot + k.suffix
				env.CreateTopicWith(t, topic, testenv.TopicSpec{Partitions: 1, Configs: k.configs})
				topics = append(topics, topic)
				want = append(want, fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
			}
			done := startPoisonRelay(t, cfg)
			if source == "wal" {
				f.waitStreaming(t)
			}
			for i, k := range kinds {
				f.insertAt(t, want[i], f.slot+k.suffix, "k", "now() - interval '30 days'", "")
			}
			msgs := env.ConsumeAll(t, topics, time.Minute, func(n int) bool { return n >= len(want) })
			if got := receivedIDs(msgs); !slices.Equal(got, want) {
				t.Fatalf("received %v, want %v", got, want)
			}
			for _, m := range msgs {
				old := time.Since(m.Timestamp) > 29*24*time.Hour
				if appended := m.Topic == topics[0]; old == appended {
					t.Fatalf("record on %s stamped %s", m.Topic, m.Timestamp)
				}
			}
			requireRunning(t, done)
		})
	}
}

// TestRaisedMaxMessageBytesTakesEffectWhileRunning: the relay read a
// topic's max.message.bytes once and kept it: after an operator raised it,
// records between the old and the new limit were still refused (here:
// dead-lettered) until a restart. A record the cached setting refuses now
// waits for the setting to be read again.
func TestRaisedMaxMessageBytesTakesEffectWhileRunning(t *testing.T) {
	env := testenv.Require(t)
	for _, source := range []string{"wal", "poll"} {
		t.Run(source, func(t *testing.T) {
			var f *fixture
			var cfg relay.Config
			if source == "poll" {
				f = newPollFixture(t, env, 1)
				cfg = f.pollConfig()
				cfg.Poll.MaxAttempts = 1
			} else {
				f = newFixture(t, env, 1)
				cfg = f.config()
			}
			topic := "outbox.event." + f.slot
			env.CreateTopicWith(t, topic, testenv.TopicSpec{Partitions: 1, Configs: map[string]string{"max.message.bytes": "2000"}})
			dlq := f.poisonPolicy(t, &cfg, "dead-letter")
			done := startPoisonRelay(t, cfg)
			if source == "wal" {
				f.waitStreaming(t)
			}
			const first, second, small = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"
			insert := func(id string, size int) {
				t.Helper()
				f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', json_build_object('pad', repeat('x', $3::int)))`, id, f.slot, size)
			}
			insert(first, 3000)
			dl := env.NewConsumer(t, []string{dlq})
			d := dl.WaitFor(t, 1, time.Minute)[0]
			if id, _ := d.Header("id"); string(id) != first {
				t.Fatalf("dead-lettered %s, want %s", id, first)
			}
			if reason, _ := d.Header("pgoutbox.error.reason"); !strings.Contains(string(reason), "(2000)") {
				t.Fatalf("dead-letter reason %q does not name the limit", reason)
			}
			setTopicConfig(t, env, topic, "max.message.bytes", "100000")
			// The relay reads a setting again at most every
			// TopicSettingsFresh; the first record's read is older.
			time.Sleep(relay.TopicSettingsFresh)
			insert(second, 3000)
			insert(small, 10)
			cons := env.NewConsumer(t, []string{topic})
			testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
				got := receivedIDs(cons.Messages())
				return slices.Contains(got, small), fmt.Sprintf("records on the topic: %v", got)
			})
			if got := receivedIDs(cons.Messages()); !slices.Equal(got, []string{second, small}) {
				t.Fatalf("records on the topic %v, want %s and %s", got, second, small)
			}
			time.Sleep(time.Second)
			if n := dl.Len(); n != 1 {
				t.Fatalf("%d records dead-lettered, want the first only", n)
			}
			requireRunning(t, done)
		})
	}
}

// setTopicConfig sets one setting of topic and waits until the cluster
// describes it so.
func setTopicConfig(t *testing.T, env *testenv.Env, topic, name, value string) {
	t.Helper()
	kc := kafka.Config{Brokers: env.KafkaBrokers}
	admin, err := kafka.NewAdmin(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close() }()
	if err := admin.IncrementalAlterConfig(sarama.TopicResource, topic, map[string]sarama.IncrementalAlterConfigsEntry{
		name: {Operation: sarama.IncrementalAlterConfigsOperationSet, Value: &value},
	}, false); err != nil {
		t.Fatalf("set %s=%s on %s: %v", name, value, topic, err)
	}
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		st, err := kafka.CheckTopics(context.Background(), kc, []string{topic})
		if err != nil {
			return false, err.Error()
		}
		return st[0].Configs[name] == value, fmt.Sprintf("%s of %s is %q", name, topic, st[0].Configs[name])
	})
}
