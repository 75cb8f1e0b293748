package testenv

import (
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestClusterTopicsHaveThreeReplicasAndMinISRTwo: the cluster has three
// nodes, its topics get three replicas and min.insync.replicas=2 unless the
// test says otherwise, and records go round it with acks=all.
func TestClusterTopicsHaveThreeReplicasAndMinISRTwo(t *testing.T) {
	c := RequireCluster(t)
	if len(c.Nodes) != 3 || len(c.KafkaBrokers) != 3 {
		t.Fatalf("cluster nodes %v, brokers %v: want three", c.Nodes, c.KafkaBrokers)
	}
	topic, loose := UniqueName(t, "topic"), UniqueName(t, "loose")
	c.CreateTopic(t, topic, 3)
	c.CreateTopicWith(t, loose, TopicSpec{Partitions: 1, Configs: map[string]string{"min.insync.replicas": "1"}})

	admin, err := sarama.NewClusterAdmin(c.KafkaBrokers, newSaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close() }()
	md, err := admin.DescribeTopics([]string{topic})
	if err != nil || len(md) != 1 || len(md[0].Partitions) != 3 {
		t.Fatalf("describe %s: %+v, %v", topic, md, err)
	}
	for _, p := range md[0].Partitions {
		if len(p.Replicas) != 3 {
			t.Errorf("%s/%d has replicas %v, want 3", topic, p.ID, p.Replicas)
		}
	}
	for name, want := range map[string]string{topic: "2", loose: "1"} {
		entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: name, ConfigNames: []string{"min.insync.replicas"}})
		if err != nil || len(entries) != 1 || entries[0].Value != want {
			t.Errorf("%s: min.insync.replicas %+v (%v), want %s", name, entries, err, want)
		}
	}
	if n := c.Leader(t, topic, 0); !slices.Contains(c.Nodes, n) {
		t.Errorf("leader of %s/0 is node %d, not one of %v", topic, n, c.Nodes)
	}
	c.WaitInSync(t, []string{topic}, time.Minute)

	cons := c.NewConsumer(t, []string{topic})
	produce(t, c.Env, topic, "k", "v")
	if msgs := cons.WaitFor(t, 1, 30*time.Second); string(msgs[0].Value) != "v" {
		t.Errorf("read back %+v", msgs)
	}
}
