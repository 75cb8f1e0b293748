package main

import (
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
)

// TestValidateWarnsOfATopicThatDeletesOldEventTimestamps: with the
// timestamp column configured (in the router section or a table's routes),
// a topic that deletes CreateTime records after a finite retention is
// warned of, with the ways on; LogAppendTime, retention.ms=-1, compaction
// alone, unknown settings or no timestamp column give nothing.
func TestValidateWarnsOfATopicThatDeletesOldEventTimestamps(t *testing.T) {
	state := func(retention, tsType, policy string) kafka.TopicState {
		return kafka.TopicState{Topic: "orders", Partitions: 1, Configs: map[string]string{
			"retention.ms": retention, "message.timestamp.type": tsType, "cleanup.policy": policy}}
	}
	stamped := defaultFileConfig()
	stamped.Router.EventTimestampField = "occurred"
	routed := defaultFileConfig()
	routed.Routes = map[string]map[string]string{"public.outbox": {"table.field.event.timestamp": "occurred"}}
	for _, c := range []struct {
		name  string
		cfg   fileConfig
		state kafka.TopicState
		warn  bool
	}{
		{"finite retention", stamped, state("604800000", "CreateTime", "delete"), true},
		{"finite retention, a table's timestamp column", routed, state("604800000", "CreateTime", "delete"), true},
		{"no timestamp column", defaultFileConfig(), state("604800000", "CreateTime", "delete"), false},
		{"LogAppendTime", stamped, state("604800000", "LogAppendTime", "delete"), false},
		{"kept for ever", stamped, state("-1", "CreateTime", "delete"), false},
		{"compacted", stamped, state("604800000", "CreateTime", "compact"), false},
		{"unknown", stamped, kafka.TopicState{Topic: "orders", Partitions: 1}, false},
	} {
		got := checkTopicRetention(c.state, c.cfg, []string{"b:9092"})
		if (len(got) > 0) != c.warn {
			t.Errorf("%s: %v; want a warning: %v", c.name, got, c.warn)
			continue
		}
		if c.warn {
			r := got[0]
			if r.Status != checkWarn || !strings.Contains(r.Detail, "retention.ms=604800000") ||
				!strings.Contains(r.Fix, "message.timestamp.type=LogAppendTime") || !strings.Contains(r.Fix, "table.field.event.timestamp") {
				t.Errorf("%s: %+v", c.name, r)
			}
		}
	}
}
