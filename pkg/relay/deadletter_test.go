package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// TestDeadLetterRecordFitsTheSmallerOfTheProducersAndTheTopicsLimit: a
// dead-letter record is cut to what both the producer and the dead-letter
// topic take (compressed or not), as large as that allows; one that fits
// is left whole; one whose key and headers alone are too large is poison,
// named with its event and both topics.
func TestDeadLetterRecordFitsTheSmallerOfTheProducersAndTheTopicsLimit(t *testing.T) {
	const dlq = "dlq"
	// Random bytes: gzip does not make them smaller.
	value := make([]byte, 5000)
	rand.New(rand.NewSource(1)).Read(value)
	cases := []struct {
		name        string
		own, topic  int // kafka.max.message.bytes; the topic's max.message.bytes (0: not known)
		compression string
		key         int // key bytes
		cut, fails  bool
	}{
		{"fits both", 1 << 20, 1 << 20, "none", 1, false, false},
		{"topic smaller than the producer", 1 << 20, 1500, "none", 1, true, false},
		{"topic smaller, compressed", 1 << 20, 1500, "gzip", 1, true, false},
		{"producer smaller than the topic", 2000, 1 << 20, "none", 1, true, false},
		{"topic not known", 3000, 0, "none", 1, true, false},
		{"key and headers alone too large", 1 << 20, 1500, "none", 2000, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Kafka.MaxMessageBytes, cfg.Kafka.Compression = c.own, c.compression
			r := &Relay{cfg: cfg, topics: newTopicCache(0)}
			if c.topic > 0 {
				r.topics.ok[dlq] = c.topic
			}
			rec := router.Record{Topic: dlq, Key: bytes.Repeat([]byte("k"), c.key), Value: value, EventID: []byte("e-1"), Partition: -1,
				Headers: []router.Header{{Key: "id", Value: []byte("e-1")}, {Key: "pgoutbox.error.reason", Value: []byte(strings.Repeat("r", 200))}}}
			err := r.fitDeadLetter(&rec, "events")
			if c.fails {
				if !kafka.IsPoison(err) || !strings.Contains(err.Error(), `"events"`) || !strings.Contains(err.Error(), `"dlq"`) || !strings.Contains(err.Error(), "e-1") {
					t.Fatalf("want a poison error naming e-1, events and dlq; got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			from := ""
			for _, h := range rec.Headers {
				if h.Key == "pgoutbox.truncated.from" {
					from = string(h.Value)
				}
			}
			if !c.cut {
				if !bytes.Equal(rec.Value, value) || from != "" {
					t.Fatalf("a record that fits was cut (%d bytes, truncated.from %q)", len(rec.Value), from)
				}
				return
			}
			var v struct {
				Truncated bool   `json:"pgoutbox.truncated"`
				Size      int    `json:"size"`
				Head      []byte `json:"head_base64"`
			}
			if from != "5000" || json.Unmarshal(rec.Value, &v) != nil || !v.Truncated || v.Size != 5000 || !bytes.Equal(v.Head, value[:len(v.Head)]) {
				t.Fatalf("cut record: truncated.from %q, value %.200s", from, rec.Value)
			}
			size := kafka.RecordSize(&rec)
			if size > c.own || r.overTopicLimit(&rec, c.topic) != nil {
				t.Fatalf("cut record of %d bytes does not fit (producer %d, topic %d)", size, c.own, c.topic)
			}
			// As large as it may be: three more bytes of head (a base64
			// group) would not fit.
			limit := c.own
			if c.topic > 0 {
				limit = min(limit, c.topic-kafka.BatchOverhead)
				if kafka.Compresses(c.compression) {
					limit -= c.topic/64 + 64
				}
			}
			if room := limit - size; room >= 4 {
				t.Fatalf("cut record of %d bytes leaves %d bytes unused (limit %d)", size, room, limit)
			}
			var tl *kafka.RecordTooLargeError
			if errors.As(r.overTopicLimit(&rec, c.topic), &tl) {
				t.Fatal(tl)
			}
		})
	}
}
