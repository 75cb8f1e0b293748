package kafka

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/router"
)

// TestCloseDoesNotWaitForAMetadataRefreshOfADeletedTopic: a topic deleted
// under the producer keeps sarama's metadata refreshes retrying it (for
// kafka.metadata.timeout, here ten minutes), and sarama's client
// Close waits for its background refresh to end. Close with a context that
// ends must still return within the context and CloseGrace, leaving the
// client's close behind, as a second signal or the stop's budget needs.
func TestCloseDoesNotWaitForAMetadataRefreshOfADeletedTopic(t *testing.T) {
	env := testenv.Require(t)
	topic := testenv.UniqueName(t, "kafka-deleted")
	env.CreateTopic(t, topic, 1)
	cfg := Config{Brokers: env.KafkaBrokers, MetadataTimeout: 10 * time.Minute,
		// The background refresh comes soon after the deletion, as it
		// came ten minutes into the stall the reviewer met.
		metadataRefresh: 50 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := New(ctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	send := func(ref uint64) {
		p.Send(&router.Record{Topic: topic, Key: []byte("k"), Value: []byte("v"), Partition: -1,
			Timestamp: time.Now(), EventID: []byte("e")}, Meta{Ref: ref})
	}
	send(0)
	select {
	case a := <-p.Acks():
		if a.Err != nil {
			t.Fatal(a.Err)
		}
	case <-time.After(time.Minute):
		t.Fatal("no ack for the first record")
	}
	env.DeleteTopic(t, topic)
	send(1)
	// The producer's client has dropped the topic's partitions: a refresh
	// saw it unknown, and retries it from then on, in the background
	// refresh too (it ticks every 50 ms).
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		// Topics reads the cache; Partitions would refresh it.
		topics, err := p.client.Topics()
		return err == nil && !slices.Contains(topics, topic), "the producer's client still knows the deleted topic"
	})
	cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
	defer ccancel()
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- p.Close(cctx) }()
	const bound = time.Second + CloseGrace + 2*time.Second
	select {
	case err := <-closed:
		took := time.Since(start)
		t.Logf("Close returned after %s: %v", took.Round(time.Millisecond), err)
		if !errors.Is(err, ErrCloseTimeout) {
			t.Errorf("Close: %v, want ErrCloseTimeout (a record is still in sarama)", err)
		}
		if took > bound {
			t.Errorf("Close took %s, more than %s", took, bound)
		}
	case <-time.After(bound + 5*time.Second):
		t.Fatalf("Close did not return within %s: it waits for sarama's metadata refresh of the deleted topic", bound+5*time.Second)
	}
}
