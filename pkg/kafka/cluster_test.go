package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestProducerStartsWhileABrokerOfTheListIsDown: with one node of the
// three-node cluster killed (and, for its session timeout, still in the
// cluster's metadata), a producer given all three addresses starts every
// time, and delivers; the dead address first in the list. sarama asks its
// first seed for a producer ID, shuffles the seeds, and retried a dead
// first seed until it gave up: one start in three failed.
func TestProducerStartsWhileABrokerOfTheListIsDown(t *testing.T) {
	c := testenv.RequireClusterExclusive(t)
	topic := testenv.UniqueName(t, "topic")
	c.CreateTopic(t, topic, 3)
	dead := c.Nodes[0]
	c.Stop(t, dead, "KILL")
	cfg := Config{Brokers: c.KafkaBrokers, RetryBackoffMax: 200 * time.Millisecond}
	for i := 0; i < 12; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		start := time.Now()
		p, err := New(ctx, cfg, zap.NewNop())
		cancel()
		if err != nil {
			t.Fatalf("start %d with node %d (%s) down: %v", i, dead, c.Addr(dead), err)
		}
		// A bound against retrying the dead seed until giving up (what
		// sarama did), not a speed measurement: on a loaded 2-core CI
		// machine the first start after the kill once took 4.0 s.
		if d := time.Since(start); d > 15*time.Second {
			t.Errorf("start %d with node %d down took %s", i, dead, d)
		} else if i == 0 {
			t.Logf("first start with node %d down took %s", dead, d.Round(time.Millisecond))
		}
		if i%4 == 0 {
			// Records go to the partitions the dead node led once the
			// controller has moved them.
			var order []sent
			for k := 0; k < 30; k++ {
				order = append(order, sent{key: fmt.Sprint(k), value: fmt.Sprintf("%d-%d", i, k)})
			}
			produceAndCheck(t, p, topic, order, nil)
		}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := p.Close(cctx); err != nil {
			t.Errorf("close: %v", err)
		}
		cancel()
	}
}
