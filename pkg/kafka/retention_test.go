package kafka

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestTimestampRetentionSaysWhetherATopicDeletesByTimestamp: only a topic
// that deletes by time (cleanup.policy with delete) a CreateTime record
// after a finite retention.ms deletes records by the timestamps they carry.
func TestTimestampRetentionSaysWhetherATopicDeletesByTimestamp(t *testing.T) {
	for _, c := range []struct {
		configs          map[string]string
		retention        time.Duration
		deletes, unknown bool
	}{
		{map[string]string{"retention.ms": "86400000", "message.timestamp.type": "CreateTime", "cleanup.policy": "delete"}, 24 * time.Hour, true, false},
		{map[string]string{"retention.ms": "600000", "message.timestamp.type": "CreateTime", "cleanup.policy": "compact,delete"}, 10 * time.Minute, true, false},
		{map[string]string{"retention.ms": "600000", "message.timestamp.type": "CreateTime"}, 10 * time.Minute, true, false},
		{map[string]string{"retention.ms": "-1", "message.timestamp.type": "CreateTime", "cleanup.policy": "delete"}, 0, false, false},
		{map[string]string{"retention.ms": "86400000", "message.timestamp.type": "LogAppendTime", "cleanup.policy": "delete"}, 0, false, false},
		{map[string]string{"retention.ms": "86400000", "message.timestamp.type": "CreateTime", "cleanup.policy": "compact"}, 0, false, false},
		{map[string]string{"retention.ms": "86400000", "message.timestamp.type": "CreateTime", "cleanup.policy": ""}, 0, false, false},
		{map[string]string{"retention.ms": "9223372036854775807", "message.timestamp.type": "CreateTime"}, 0, false, false},
		{map[string]string{"message.timestamp.type": "CreateTime"}, 0, false, true},
		{map[string]string{"retention.ms": "86400000"}, 0, false, true},
		{nil, 0, false, true},
	} {
		retention, deletes, known := TopicState{Configs: c.configs}.TimestampRetention()
		if retention != c.retention || deletes != c.deletes || known == c.unknown {
			t.Errorf("%v: retention %s, deletes %v, known %v; want %s, %v, %v", c.configs, retention, deletes, known, c.retention, c.deletes, !c.unknown)
		}
	}
}

// TestTimestampErrorsArePoisonAndSayWhatToDo: a record too old for its
// topic's retention is poison, and the broker's INVALID_TIMESTAMP names
// the record's timestamp and the ways on, and stays poison and a batch
// refusal.
func TestTimestampErrorsArePoisonAndSayWhatToDo(t *testing.T) {
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	old := &ProduceError{Topic: "t", Err: &RecordTooOldError{Topic: "t", EventID: []byte("e1"), Timestamp: at, Retention: 24 * time.Hour, Margin: time.Hour, At: at.Add(48 * time.Hour)}}
	if !IsPoison(old) || IsBatchRefused(old) {
		t.Fatalf("too old: poison %v, batch refused %v", IsPoison(old), IsBatchRefused(old))
	}
	for _, w := range []string{"e1", `"t"`, "2025-03-04T05:06:07Z", "48h0m0s old", "retention.ms=86400000", "raise the topic's retention.ms", "LogAppendTime", "table.field.event.timestamp"} {
		if !strings.Contains(old.Error(), w) {
			t.Errorf("too old: %q does not say %q", old, w)
		}
	}
	a := ack(&sarama.ProducerMessage{Topic: "t", Timestamp: at}, sarama.ErrInvalidTimestamp)
	if !IsPoison(a.Err) || !IsBatchRefused(a.Err) || !errors.Is(a.Err, sarama.ErrInvalidTimestamp) {
		t.Fatalf("refused timestamp: poison %v, batch refused %v", IsPoison(a.Err), IsBatchRefused(a.Err))
	}
	for _, w := range []string{"2025-03-04T05:06:07Z", "message.timestamp.after.max.ms", "LogAppendTime", "table.field.event.timestamp"} {
		if !strings.Contains(a.Err.Error(), w) {
			t.Errorf("refused timestamp: %q does not say %q", a.Err, w)
		}
	}
}
