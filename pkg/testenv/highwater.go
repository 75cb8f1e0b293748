package testenv

import (
	"fmt"
	"testing"

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
			off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				t.Fatalf("testenv: high-water mark of %s/%d: %v", topic, p, err)
			}
			out[fmt.Sprintf("%s/%d", topic, p)] = off
		}
	}
	return out
}
