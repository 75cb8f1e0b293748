package conformance

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// record is a Kafka record as fetched, with what the consumer API hides:
// the batch's timestamp type.
type record struct {
	Topic      string
	Partition  int32
	Offset     int64
	Key, Value []byte // nil for null
	Headers    []header
	Timestamp  time.Time
	LogAppend  bool // the batch's timestamp type is LogAppendTime (else CreateTime)
}

type header struct {
	Key   string
	Value []byte // nil for a null value
}

func (r *record) header(name string) ([]byte, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V4_0_0_0
	c.ClientID = "pgoutbox-conformance"
	c.Metadata.Retry.Max = 20
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	return c
}

// offsets returns each partition's high-water offset of topics, keyed
// "topic/partition"; a topic that does not exist has none.
func offsets(t testing.TB, brokers []string, topics []string) map[string]int64 {
	t.Helper()
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("connect to Kafka: %v", err)
	}
	defer client.Close()
	out := map[string]int64{}
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if err != nil {
			continue
		}
		for _, p := range parts {
			// A topic Debezium or pgoutbox has just created may have no
			// leader the client knows yet (NOT_LEADER_OR_FOLLOWER, once in
			// CI): ask again with fresh metadata.
			testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
				off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
				if err != nil {
					_ = client.RefreshMetadata(topic)
					return false, fmt.Sprintf("high-water mark of %s/%d: %v", topic, p, err)
				}
				out[fmt.Sprintf("%s/%d", topic, p)] = off
				return true, ""
			})
		}
	}
	return out
}

// fetchAll reads every record of topics from the offsets in from (0 where
// absent) to the partitions' high-water marks, with raw fetch requests so
// that each record's batch attributes are seen. Records come partition by
// partition in offset order.
func fetchAll(t testing.TB, brokers []string, topics []string, from map[string]int64) []record {
	t.Helper()
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("connect to Kafka: %v", err)
	}
	defer client.Close()
	var out []record
	sorted := append([]string(nil), topics...)
	sort.Strings(sorted)
	for _, topic := range sorted {
		parts, err := client.Partitions(topic)
		if err != nil {
			continue // never created: nothing was written to it
		}
		for _, p := range parts {
			out = append(out, fetchPartition(t, client, topic, p, from[fmt.Sprintf("%s/%d", topic, p)])...)
		}
	}
	return out
}

func fetchPartition(t testing.TB, client sarama.Client, topic string, p int32, offset int64) []record {
	t.Helper()
	hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		t.Fatalf("high-water mark of %s/%d: %v", topic, p, err)
	}
	var out []record
	deadline := time.Now().Add(60 * time.Second)
	for offset < hw {
		if time.Now().After(deadline) {
			t.Fatalf("fetch %s/%d: stuck at offset %d of %d", topic, p, offset, hw)
		}
		broker, err := client.Leader(topic, p)
		if err != nil {
			t.Fatalf("leader of %s/%d: %v", topic, p, err)
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 500, MinBytes: 1, MaxBytes: 64 << 20, Isolation: sarama.ReadUncommitted}
		req.AddBlock(topic, p, offset, 32<<20, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			t.Fatalf("fetch %s/%d at %d: %v", topic, p, offset, err)
		}
		block := resp.GetBlock(topic, p)
		if block == nil || block.Err != sarama.ErrNoError {
			t.Fatalf("fetch %s/%d at %d: %v", topic, p, offset, block)
		}
		before := offset
		for _, rs := range block.RecordsSet {
			b := rs.RecordBatch
			if b == nil {
				t.Fatalf("fetch %s/%d: a legacy message set", topic, p)
			}
			for _, r := range b.Records {
				off := b.FirstOffset + r.OffsetDelta
				if off < offset {
					continue
				}
				rec := record{Topic: topic, Partition: p, Offset: off, Key: r.Key, Value: r.Value,
					LogAppend: b.LogAppendTime}
				if b.LogAppendTime {
					rec.Timestamp = b.MaxTimestamp
				} else {
					rec.Timestamp = b.FirstTimestamp.Add(r.TimestampDelta)
				}
				for _, h := range r.Headers {
					rec.Headers = append(rec.Headers, header{Key: string(h.Key), Value: h.Value})
				}
				out = append(out, rec)
				offset = off + 1
			}
			if b.Control || len(b.Records) == 0 {
				if next := b.FirstOffset + int64(b.LastOffsetDelta) + 1; next > offset {
					offset = next
				}
			}
		}
		if offset == before {
			time.Sleep(50 * time.Millisecond) // nothing new in this response: ask again
		}
	}
	return out
}
