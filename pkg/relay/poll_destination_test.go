package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollInstanceWithAnotherDestinationWaits: two poll deployments on one
// outbox table, the second publishing to another topic (route.topic) or
// another Kafka cluster. Before, the second joined the first's bucket
// group (keyed by the table alone): each claimed half the keys and marked
// them published, so each topic got part of the events and nothing said
// so. Now the instance that joins with another destination claims
// nothing: it says so at Error, naming the first instance's PID and what
// differs, and waits; the first goes on with every bucket, every event in
// its topic. Once the first has left (the old instances of a rolling
// update that changes the topic), the second claims, and the later events
// go to its topic.
func TestPollInstanceWithAnotherDestinationWaits(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	ctx := context.Background()
	topic1, topic2 := "revb.poll_p1_"+f.slot, "revb.poll_p2_"+f.slot
	env.CreateTopic(t, topic1, 1)
	env.CreateTopic(t, topic2, 1)
	cfg1 := f.pollConfig()
	cfg1.Router.RouteTopic = topic1
	stop1 := runRelay(t, cfg1)
	f.waitBalanced(t, 1, cfg1.Poll.Buckets)
	first := f.pollMembers(t)[0].PID

	written := 0
	insert := func() {
		t.Helper()
		written++
		if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', $1, 'created', '{}')`,
			fmt.Sprint("key-", written%7)); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		insert()
	}
	// One partition each: the high-water mark is the topic's count.
	counts := func() (int64, int64) {
		hw := env.HighWater(t, []string{topic1, topic2})
		return hw[topic1+"/0"], hw[topic2+"/0"]
	}

	var second chan error
	var cancelSecond context.CancelFunc
	for _, c := range []struct {
		name, want, not string
		change          func(*relay.Config)
	}{
		{"kafka.brokers", "another Kafka cluster", "another router configuration", func(c *relay.Config) {
			c.Kafka.Brokers = append(append([]string{}, c.Kafka.Brokers...), "127.0.0.1:1")
		}},
		{"route.topic", "another router configuration", "another Kafka cluster", func(c *relay.Config) { c.Router.RouteTopic = topic2 }},
	} {
		cfg2 := f.pollConfig()
		cfg2.Router.RouteTopic = topic1
		c.change(&cfg2)
		core, logs := observer.New(zap.ErrorLevel)
		r, err := relay.New(cfg2, zap.New(core))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		// Rows keep coming while the second instance starts and joins:
		// whatever buckets it claimed, their rows would go to its topic.
		said := ""
		testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
			insert()
			select {
			case err := <-done:
				t.Fatalf("%s: the second instance stopped: %v; want it to wait", c.name, err)
			default:
			}
			for _, e := range logs.FilterMessageSnippet("another destination").All() {
				said = fmt.Sprint(e.ContextMap()["error"])
			}
			return said != "", c.name + ": the second instance has not said it waits"
		})
		if !strings.Contains(said, c.want) || strings.Contains(said, c.not) || !strings.Contains(said, fmt.Sprintf("PID %d", first)) {
			t.Fatalf("%s: the second instance said %q; want the first instance (PID %d) and %q only", c.name, said, first, c.want)
		}
		if _, n2 := counts(); n2 != 0 {
			t.Fatalf("%s: %d events in %s while the first instance runs", c.name, n2, topic2)
		}
		if c.name != "route.topic" {
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("%s: the second instance stopped with %v", c.name, err)
			}
			continue
		}
		second, cancelSecond = done, cancel
	}
	defer cancelSecond()

	// While both run, the first has every bucket and every event.
	f.waitBalanced(t, 1, cfg1.Poll.Buckets)
	before := written
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		n1, n2 := counts()
		return n1 >= int64(before) && f.unpublished(t) == 0,
			fmt.Sprintf("%d of %d events in %s, %d in %s, %d rows unpublished", n1, before, topic1, n2, topic2, f.unpublished(t))
	})
	if n1, n2 := counts(); n2 != 0 || n1 != int64(before) {
		t.Fatalf("%d of %d events in %s, %d in %s (the waiting instance's topic): want every event in the first's, once", n1, before, topic1, n2, topic2)
	}
	// The first leaves: the second claims, and the events go to its topic.
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		insert()
	}
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		_, n2 := counts()
		return n2 == 5 && f.unpublished(t) == 0, fmt.Sprintf("%d of 5 events in %s after the first left, %d rows unpublished", n2, topic2, f.unpublished(t))
	})
	cancelSecond()
	if err := <-second; err != nil {
		t.Fatalf("the second instance stopped with %v", err)
	}
}

// TestPollDestinationIsWhereRowsGo: the poll instances' fingerprint
// changes with the Kafka brokers (not their order) and with the settings
// that decide a row's topic, a table's routes entry included, and not
// with settings that only shape records.
func TestPollDestinationIsWhereRowsGo(t *testing.T) {
	base := func() relay.Config {
		c := relay.DefaultConfig()
		c.Postgres.Tables = []string{"public.outbox"}
		c.Kafka.Brokers = []string{"k1:9092", "k2:9092"}
		return c
	}
	b := base()
	want := b.PollDestination("public.outbox")
	for _, c := range []struct {
		name                 string
		change               func(*relay.Config)
		kafkaSame, routeSame bool
	}{
		{"brokers in another order", func(c *relay.Config) { c.Kafka.Brokers = []string{" K2:9092", "k1:9092"} }, true, true},
		{"a converter", func(c *relay.Config) { c.Router.ValueConverter = "string" }, true, true},
		{"another broker", func(c *relay.Config) { c.Kafka.Brokers = []string{"k3:9092"} }, false, true},
		{"route.topic", func(c *relay.Config) { c.Router.RouteTopic = "orders" }, true, false},
		{"route.topic.replacement", func(c *relay.Config) { c.Router.RouteTopicReplacement = "x.${routedByValue}" }, true, false},
		{"the table's routes entry", func(c *relay.Config) {
			c.Routes = map[string]map[string]string{"outbox": {"route.topic": "orders"}}
		}, true, false},
		{"another table's routes entry", func(c *relay.Config) {
			c.Routes = map[string]map[string]string{"public.other": {"route.topic": "orders"}}
		}, true, true},
		{"the dead-letter topic", func(c *relay.Config) { c.Relay.DeadLetterTopic = "dlq" }, true, false},
	} {
		cfg := base()
		c.change(&cfg)
		got := cfg.PollDestination("public.outbox")
		if (got.Kafka == want.Kafka) != c.kafkaSame || (got.Router == want.Router) != c.routeSame || got.Kafka == 0 || got.Router == 0 {
			t.Errorf("%s: %+v against %+v; want the Kafka part same=%v, the router part same=%v", c.name, got, want, c.kafkaSame, c.routeSame)
		}
	}
}
