package testenv

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// envKafkaCluster names the cluster's brokers once scripts/testenv.sh
// cluster-up has run.
const envKafkaCluster = "PGOUTBOX_TEST_KAFKA_CLUSTER"

// clusterHowTo is the skip (or failure) message without a cluster.
const clusterHowTo = "no Kafka cluster: PGOUTBOX_TEST_KAFKA_CLUSTER is unset and there is no environment directory to start one in (scripts/testenv.sh cluster-up DIR)"

// Cluster is the environment's three-node Kafka cluster (KRaft, each node a
// broker and a controller; see scripts/testenv.sh cluster-up), on loopback
// beside the single broker. Its embedded Env is the environment with the
// cluster as its Kafka: CreateTopic makes topics with three replicas and
// min.insync.replicas=2, NewConsumer, ConsumeAll and HighWater read the
// cluster. The Env's own stop and start methods still act on PostgreSQL
// and the single broker, and refuse to (the Env is not exclusive).
type Cluster struct {
	*Env
	// Nodes are the node ids, 1 to 3; Addr gives each one's address.
	Nodes []int
	addrs map[int]string
	// exclusive: the test may stop, pause and kill nodes.
	exclusive bool
}

var clusterUp struct {
	sync.Mutex
	brokers string
	err     error
	done    bool
}

// RequireCluster returns the cluster, starting it (once per test process)
// if it does not run, for a test that uses it without disrupting it; the
// test shares PostgreSQL and the single broker as with Require. It skips
// the test when there can be no cluster (fails it under
// PGOUTBOX_REQUIRE_INTEGRATION=1).
func RequireCluster(t testing.TB) *Cluster {
	t.Helper()
	return requireCluster(t, false)
}

// RequireClusterExclusive is RequireCluster for a test that stops, kills or
// pauses cluster nodes: it waits until no other test uses the cluster and
// keeps them out until it ends, and at the end it resumes or starts every
// node and waits until the cluster serves. PostgreSQL and the single broker
// stay shared.
func RequireClusterExclusive(t testing.TB) *Cluster {
	t.Helper()
	return requireCluster(t, true)
}

func requireCluster(t testing.TB, exclusive bool) *Cluster {
	t.Helper()
	e := Require(t)
	brokers := e.startCluster(t)
	c := &Cluster{addrs: map[int]string{}}
	ce := *e
	ce.exclusive, ce.heal = false, ""
	ce.KafkaBrokers = nil
	ce.topics = TopicSpec{ReplicationFactor: 3, Configs: map[string]string{"min.insync.replicas": "2"}}
	for i, b := range strings.Split(brokers, ",") {
		ce.KafkaBrokers = append(ce.KafkaBrokers, b)
		c.Nodes = append(c.Nodes, i+1)
		c.addrs[i+1] = b
	}
	c.Env = &ce
	ce.lockNamed(t, lockCluster, exclusive)
	if exclusive {
		if e.Dir == "" {
			t.Fatalf("testenv: %s is not set, so cluster nodes cannot be stopped or started", envDir)
		}
		c.exclusive = true
		ce.heal = "cluster-heal"
		// Registered after the lock's release, so it runs before it.
		t.Cleanup(func() {
			if _, err := ce.run("cluster-heal"); err != nil {
				t.Errorf("testenv: restarting the cluster after the test: %v", err)
			}
		})
	}
	return c
}

// brokersLine is the last line cluster-up prints.
var brokersLine = regexp.MustCompile(`(?m)^(127\.0\.0\.1:\d+(?:,127\.0\.0\.1:\d+)+)\s*$`)

// startCluster runs cluster-up once per process (it starts what is stopped
// and waits until the cluster serves) and returns the brokers; without an
// environment directory it takes them from PGOUTBOX_TEST_KAFKA_CLUSTER.
func (e *Env) startCluster(t testing.TB) string {
	t.Helper()
	if e.Dir == "" {
		b := os.Getenv(envKafkaCluster)
		if b == "" {
			if os.Getenv(envRequire) == "1" {
				t.Fatal(clusterHowTo)
			}
			t.Skip(clusterHowTo)
		}
		return b
	}
	clusterUp.Lock()
	defer clusterUp.Unlock()
	if !clusterUp.done {
		out, err := e.run("cluster-up")
		clusterUp.done = true
		if err != nil {
			clusterUp.err = err
		} else if m := brokersLine.FindAllStringSubmatch(out, -1); len(m) == 0 {
			clusterUp.err = fmt.Errorf("scripts/testenv.sh cluster-up printed no broker list:\n%s", out)
		} else {
			clusterUp.brokers = m[len(m)-1][1]
		}
	}
	if clusterUp.err != nil {
		t.Fatalf("testenv: starting the Kafka cluster: %v", clusterUp.err)
	}
	return clusterUp.brokers
}

// Addr is node's PLAINTEXT address.
func (c *Cluster) Addr(node int) string { return c.addrs[node] }

// Stop sends signal ("TERM", "KILL", ...) to node and waits until it has
// exited. A node stopped with TERM hands its partitions' leadership over
// first (controlled shutdown); one killed keeps it until the controller
// fences it, broker.session.timeout.ms (10 s) later. Needs
// RequireClusterExclusive.
func (c *Cluster) Stop(t testing.TB, node int, signal string) {
	t.Helper()
	c.control(t, "cluster-stop", strconv.Itoa(node), signal)
}

// Start starts node again (same configuration, data and port) and waits
// until it serves: after a KILL that takes until the killed incarnation's
// session has expired (about 10 s). Its replicas may still be catching up:
// see WaitInSync. Needs RequireClusterExclusive.
func (c *Cluster) Start(t testing.TB, node int) {
	t.Helper()
	c.control(t, "cluster-start", strconv.Itoa(node))
}

// Pause freezes node (SIGSTOP): its connections stay open and its requests
// go unanswered. Needs RequireClusterExclusive.
func (c *Cluster) Pause(t testing.TB, node int) {
	t.Helper()
	c.control(t, "cluster-pause", strconv.Itoa(node))
}

// Resume undoes Pause (SIGCONT). Needs RequireClusterExclusive.
func (c *Cluster) Resume(t testing.TB, node int) {
	t.Helper()
	c.control(t, "cluster-resume", strconv.Itoa(node))
}

func (c *Cluster) control(t testing.TB, args ...string) {
	t.Helper()
	if !c.exclusive {
		t.Fatalf("testenv: %s disrupts every test that uses the cluster: get it with RequireClusterExclusive", args[0])
	}
	if _, err := c.Env.run(args...); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// clusterClient is a client of the cluster through the nodes in addrs.
func (c *Cluster) client(t testing.TB, addrs []string) sarama.Client {
	t.Helper()
	cfg := newSaramaConfig()
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 1
	client, err := sarama.NewClient(addrs, cfg)
	if err != nil {
		t.Fatalf("testenv: connect to the Kafka cluster: %v", err)
	}
	return client
}

// Leader returns the node that leads partition of topic, as the cluster's
// metadata says now.
func (c *Cluster) Leader(t testing.TB, topic string, partition int32) int {
	t.Helper()
	client := c.client(t, c.KafkaBrokers)
	defer func() { _ = client.Close() }()
	var leader int
	Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		if err := client.RefreshMetadata(topic); err != nil {
			return false, fmt.Sprintf("metadata of %s: %v", topic, err)
		}
		b, err := client.Leader(topic, partition)
		if err != nil {
			return false, fmt.Sprintf("leader of %s/%d: %v", topic, partition, err)
		}
		leader = int(b.ID())
		return true, ""
	})
	return leader
}

// WaitInSync waits until every partition of topics has a leader and all its
// replicas in sync (after a node came back, its replicas catch up first),
// and fails the test after timeout.
func (c *Cluster) WaitInSync(t testing.TB, topics []string, timeout time.Duration) {
	t.Helper()
	client := c.client(t, c.KafkaBrokers)
	defer func() { _ = client.Close() }()
	Eventually(t, timeout, 200*time.Millisecond, func() (bool, string) {
		if err := client.RefreshMetadata(topics...); err != nil {
			return false, fmt.Sprintf("metadata: %v", err)
		}
		for _, topic := range topics {
			parts, err := client.Partitions(topic)
			if err != nil {
				return false, fmt.Sprintf("partitions of %s: %v", topic, err)
			}
			for _, p := range parts {
				replicas, err := client.Replicas(topic, p)
				if err != nil {
					return false, fmt.Sprintf("replicas of %s/%d: %v", topic, p, err)
				}
				isr, err := client.InSyncReplicas(topic, p)
				if err != nil {
					return false, fmt.Sprintf("in-sync replicas of %s/%d: %v", topic, p, err)
				}
				if len(isr) < len(replicas) {
					return false, fmt.Sprintf("%s/%d: in-sync replicas %v of %v", topic, p, isr, replicas)
				}
				if _, err := client.Leader(topic, p); err != nil {
					return false, fmt.Sprintf("leader of %s/%d: %v", topic, p, err)
				}
			}
		}
		return true, ""
	})
}
