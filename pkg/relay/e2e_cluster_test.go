package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestClusterFaults is the fault suite's part on the three-node Kafka
// cluster (topics with three replicas and min.insync.replicas=2, so that an
// acknowledged record is on two brokers at least): the idempotent
// producer's hard paths — a leader that moves, NOT_ENOUGH_REPLICAS while a
// follower is out, sequence numbers across a leader change — under the
// steady writer, each checked like the rest of the suite (nothing lost,
// per-key order, every duplicate explained by a logged session start).
// make test runs a fast form of each, make test-faults the full one.
func TestClusterFaults(t *testing.T) {
	// inSync bounds a node's catch-up after it came back.
	const inSync = 3 * time.Minute
	// A transaction every 20 ms (about 1,000 events/s): every record is
	// written three times, by three brokers that share two cores with
	// PostgreSQL and the relay.
	const every = 20 * time.Millisecond

	t.Run("cluster-rolling-restart", func(t *testing.T) {
		c := testenv.RequireClusterExclusive(t)
		r := newFaultRun(t, c.Env, 31, every)
		// make test stops one node (a leader moves, NOT_ENOUGH_REPLICAS
		// while it is out, sequence numbers across the change); the full
		// suite rolls through every node three times.
		nodes := c.Nodes[:pick(1, len(c.Nodes))]
		for round := 0; round < pick(1, 3); round++ {
			for _, n := range nodes {
				r.progress(pick(300, 1000))
				t0 := time.Now()
				c.Stop(t, n, "TERM")
				t1 := time.Now()
				// Delivery goes on with two of three nodes.
				r.progress(pick(300, 1000))
				t2 := time.Now()
				c.Start(t, n)
				t3 := time.Now()
				c.WaitInSync(t, r.f.topics, inSync)
				t.Logf("node %d: stopped in %s, delivery on in %s, started in %s, in sync in %s", n,
					t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond), time.Since(t3).Round(time.Millisecond))
			}
		}
		r.progress(500)
		r.finish()
	})

	t.Run("cluster-leader-sigkill", func(t *testing.T) {
		c := testenv.RequireClusterExclusive(t)
		r := newFaultRun(t, c.Env, 32, every)
		for i := 0; i < pick(1, 3); i++ {
			r.progress(500)
			// The first topic's partition 0 takes a third of its events.
			leader := c.Leader(t, r.f.topics[0], 0)
			c.Stop(t, leader, "KILL")
			// Its partitions have no leader until the controller fences
			// the node (broker.session.timeout.ms, 10 s); then delivery
			// goes on.
			r.progress(pick(500, 1500))
			// Progress can come from the other partitions alone: the
			// move of partition 0 is waited for (the controller fences
			// the node), not assumed.
			testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
				return c.Leader(t, r.f.topics[0], 0) != leader, fmt.Sprintf("partition 0 of %s is still led by the killed node %d", r.f.topics[0], leader)
			})
			c.Start(t, leader)
			c.WaitInSync(t, r.f.topics, inSync)
		}
		r.progress(500)
		r.finish()
	})

	t.Run("cluster-broker-paused", func(t *testing.T) {
		c := testenv.RequireClusterExclusive(t)
		r := newFaultRun(t, c.Env, 33, every)
		r.progress(500)
		paused := c.Leader(t, r.f.topics[0], 0)
		c.Pause(t, paused)
		at := time.Now()
		// The paused node answers nothing and holds its connections
		// open: its partitions move once it is fenced, and writes wait
		// while it is still in the ISR of the others (replica.lag.time.max.ms).
		r.progress(500)
		t.Logf("delivery went on %s after node %d was paused", time.Since(at).Round(time.Second), paused)
		testenv.Eventually(t, 5*time.Minute, 100*time.Millisecond, func() (bool, string) {
			r.peakRSS = max(r.peakRSS, r.p.peakRSS())
			return time.Since(at) >= pick(15*time.Second, 90*time.Second), "node paused"
		})
		c.Resume(t, paused)
		r.progress(500)
		c.WaitInSync(t, r.f.topics, inSync)
		r.progress(500)
		r.finish()
	})

	t.Run("cluster-first-broker-dead", func(t *testing.T) {
		c := testenv.RequireClusterExclusive(t)
		r := prepareFaultRun(t, c.Env)
		c.Stop(t, c.Nodes[0], "KILL")
		// kafka.brokers names the dead node first.
		r.environ = append(r.environ, "PGOUTBOX_KAFKA_BROKERS="+strings.Join(c.KafkaBrokers, ","))
		if c.KafkaBrokers[0] != c.Addr(c.Nodes[0]) {
			t.Fatalf("brokers %v do not start with node %d's %s", c.KafkaBrokers, c.Nodes[0], c.Addr(c.Nodes[0]))
		}
		started := time.Now()
		r.restart()
		t.Logf("streaming %s after start with the first broker dead", time.Since(started).Round(time.Millisecond))
		r.startWriter(34, every)
		r.progress(pick(500, 3000))
		c.Start(t, c.Nodes[0])
		c.WaitInSync(t, r.f.topics, inSync)
		r.progress(500)
		r.finish()
	})
}

// TestRunWarnsOfDurabilityAtStartAndPerTopic: pgoutbox run audits
// durability off the relay's goroutine and logs what it finds, without
// stopping: at start PostgreSQL (the test server has no
// max_slot_wal_keep_size) and the topics it knows (a dead-letter topic with
// one replica), and each topic when it first routes a record to it (one
// with min.insync.replicas=1 on the cluster); delivery goes on.
func TestRunWarnsOfDurabilityAtStartAndPerTopic(t *testing.T) {
	c := testenv.RequireCluster(t)
	f := newFixture(t, c.Env, 1)
	dlq := strings.ToLower(testenv.UniqueName(t, "dlq"))
	c.CreateTopicWith(t, dlq, testenv.TopicSpec{Partitions: 1, ReplicationFactor: 1})
	loose := f.topics[1]
	admin, err := kafka.NewAdmin(kafka.Config{Brokers: c.KafkaBrokers})
	if err != nil {
		t.Fatal(err)
	}
	one := "1"
	err = admin.AlterConfig(sarama.TopicResource, loose, map[string]*string{"min.insync.replicas": &one}, false)
	_ = admin.Close()
	if err != nil {
		t.Fatalf("min.insync.replicas=1 on %s: %v", loose, err)
	}

	cons := c.NewConsumer(t, f.topics)
	p := startBinaryWith(t, f, "pgoutbox.log", "PGOUTBOX_RELAY_POISON_POLICY=dead-letter", "PGOUTBOX_RELAY_DEAD_LETTER_TOPIC="+dlq)
	f.waitStreaming(t)
	p.waitLog(t, `"msg":"durability: -1 (no limit)`, time.Minute)
	p.waitLog(t, `"check":"dead-letter topic `+dlq+` durability"`, time.Minute)

	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 35)
	for i := 0; i < 30; i++ {
		if err := w.Txn(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, cons, w, 2*time.Minute)
	line := p.waitLog(t, `"check":"topic `+loose+` durability"`, time.Minute)
	if !strings.Contains(line, "replication factor 3 but min.insync.replicas 1") || !strings.Contains(line, `"fix":"kafka-configs.sh`) {
		t.Fatalf("the warning about %s says neither what nor how to fix: %s", loose, line)
	}
	p.terminate(t, time.Minute)
	for _, topic := range []string{f.topics[0], f.topics[2]} {
		if lines := p.logLines(t, `"check":"topic `+topic+` durability"`); len(lines) > 0 {
			t.Errorf("a warning about %s, which has three replicas and min.insync.replicas=2: %s", topic, lines[0])
		}
	}
}
