package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollInstanceWithAnotherDestinationStops: two poll deployments on one
// outbox table, the second publishing to another topic (route.topic) or
// another Kafka cluster. Before, the second joined the first's bucket
// group (keyed by the table alone): each claimed half the keys and marked
// them published, so each topic got part of the events and nothing said
// so. Now the instance that joins with another destination stops with a
// fatal error before it claims, naming the first instance's PID and what
// differs; the first goes on, every event in its topic, none in the
// other's.
func TestPollInstanceWithAnotherDestinationStops(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	ctx := context.Background()
	topic1, topic2 := "revb.poll_p1_"+f.slot, "revb.poll_p2_"+f.slot
	env.CreateTopic(t, topic1, 1)
	env.CreateTopic(t, topic2, 1)
	cfg1 := f.pollConfig()
	cfg1.Router.RouteTopic = topic1
	runRelay(t, cfg1)
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

	for _, c := range []struct {
		name, want, not string
		change          func(*relay.Config)
	}{
		{"route.topic", "another router configuration", "another Kafka cluster", func(c *relay.Config) { c.Router.RouteTopic = topic2 }},
		{"kafka.brokers", "another Kafka cluster", "another router configuration", func(c *relay.Config) {
			c.Kafka.Brokers = append(append([]string{}, c.Kafka.Brokers...), "127.0.0.1:1")
		}},
	} {
		cfg2 := f.pollConfig()
		cfg2.Router.RouteTopic = topic1
		c.change(&cfg2)
		r, err := relay.New(cfg2, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		// Rows keep coming while the second instance starts and joins:
		// whatever buckets it claimed, their rows would go to its topic.
		var runErr error
		stopped := false
		for i := 0; i < 600 && !stopped; i++ {
			insert()
			select {
			case runErr = <-done:
				stopped = true
			case <-time.After(50 * time.Millisecond):
			}
		}
		cancel()
		if !stopped {
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				t.Fatalf("%s: the second instance did not stop within a minute of its cancel", c.name)
			}
			t.Fatalf("%s: a second poll instance on the table with another destination ran for 30s beside the first (stopped with %v), want a fatal error before it claims", c.name, runErr)
		}
		msg := fmt.Sprint(runErr)
		if !strings.Contains(msg, "publishes to another destination") || !strings.Contains(msg, c.want) || strings.Contains(msg, c.not) ||
			!strings.Contains(msg, fmt.Sprintf("PID %d", first)) {
			t.Fatalf("%s: the second instance stopped with %v; want a fatal error naming the first instance (PID %d) and %q only", c.name, runErr, first, c.want)
		}
		if fe := (*relay.FatalError)(nil); !errors.As(runErr, &fe) {
			t.Fatalf("%s: the second instance stopped with %T, want *relay.FatalError", c.name, runErr)
		}
	}

	// The first instance goes on alone with every bucket, and every row
	// reached its topic, none the other's.
	f.waitBalanced(t, 1, cfg1.Poll.Buckets)
	for range 5 {
		insert()
	}
	// One partition each: the high-water mark is the topic's count.
	counts := func() (int64, int64) {
		hw := env.HighWater(t, []string{topic1, topic2})
		return hw[topic1+"/0"], hw[topic2+"/0"]
	}
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		n1, n2 := counts()
		return n1 >= int64(written) && f.unpublished(t) == 0,
			fmt.Sprintf("%d of %d events in %s, %d in %s, %d rows unpublished", n1, written, topic1, n2, topic2, f.unpublished(t))
	})
	if n1, n2 := counts(); n2 != 0 || n1 != int64(written) {
		t.Fatalf("%d of %d events in %s, %d in %s (the second instance's topic): want every event in the first's, once", n1, written, topic1, n2, topic2)
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
