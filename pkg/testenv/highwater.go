package testenv

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// HighWater returns each partition's high-water offset (the offset the next
// record will get) for topics, keyed "topic/partition".
func (e *Env) HighWater(t testing.TB, topics []string) map[string]int64 {
	t.Helper()
	client, err := sarama.NewClient(e.KafkaBrokers, newSaramaConfig())
	if err != nil {
		t.Fatalf("testenv: connect to Kafka: %v", err)
	}
	defer client.Close()
	out := map[string]int64{}
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if err != nil {
			t.Fatalf("testenv: partitions of %s: %v", topic, err)
		}
		for _, p := range parts {
			// Just after a leader election (the cluster tests kill brokers)
			// the new leader answers OFFSET_NOT_AVAILABLE until its
			// high-water mark caught up, or a stale leader NOT_LEADER: asked
			// again, with fresh metadata, until it answers.
			deadline := time.Now().Add(time.Minute)
			for {
				off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
				if err == nil {
					out[fmt.Sprintf("%s/%d", topic, p)] = off
					break
				}
				if !retriableOffsetError(err) || time.Now().After(deadline) {
					t.Fatalf("testenv: high-water mark of %s/%d: %v", topic, p, err)
				}
				_ = client.RefreshMetadata(topic)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	return out
}

// retriableOffsetError says whether a ListOffsets error is one that a
// leader election causes for a while.
func retriableOffsetError(err error) bool {
	for _, k := range []sarama.KError{sarama.ErrOffsetNotAvailable, sarama.ErrLeaderNotAvailable,
		sarama.ErrNotLeaderForPartition, sarama.ErrFencedLeaderEpoch, sarama.ErrUnknownLeaderEpoch} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}
