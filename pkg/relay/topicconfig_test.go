package relay

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// TestRetentionMarginIsATenthUpToAnHour: a record is refused once less
// than the smaller of a tenth of its topic's retention and an hour of it
// is left.
func TestRetentionMarginIsATenthUpToAnHour(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		retention, age time.Duration
		refused        bool
	}{
		{24 * time.Hour, 22 * time.Hour, false},
		{24 * time.Hour, 23 * time.Hour, false},
		{24 * time.Hour, 23*time.Hour + time.Second, true},
		{24 * time.Hour, 48 * time.Hour, true},
		{10 * time.Minute, 9 * time.Minute, false},
		{10 * time.Minute, 9*time.Minute + time.Second, true},
		{time.Hour, -time.Hour, false}, // ahead: the broker judges that
	} {
		rec := &router.Record{Topic: "t", EventID: []byte("e"), Timestamp: now.Add(-c.age)}
		err := tooOldForTopic(rec, topicSettings{deletes: true, retention: c.retention}, now)
		var to *kafka.RecordTooOldError
		if (err != nil) != c.refused || (err != nil && !errors.As(err, &to)) {
			t.Errorf("retention %s, age %s: %v; want refused %v", c.retention, c.age, err, c.refused)
		}
	}
	rec := &router.Record{Topic: "t", Timestamp: now.Add(-100 * 24 * time.Hour)}
	if err := tooOldForTopic(rec, topicSettings{retention: time.Hour}, now); err != nil {
		t.Errorf("a topic that does not delete by timestamp: %v", err)
	}
	if err := tooOldForTopic(&router.Record{Topic: "t"}, topicSettings{deletes: true, retention: time.Hour}, now); err != nil {
		t.Errorf("a record without a timestamp: %v", err)
	}
}

// scriptedTopics answers each request at once with the topic's state in
// states, and counts the requests.
type scriptedTopics struct {
	states map[string]kafka.TopicState
	asked  map[string]int
	ch     chan topicResult
}

func (c *scriptedTopics) Request(topic string, _ time.Duration) {
	c.asked[topic]++
	st := c.states[topic]
	st.Topic = topic
	c.ch <- topicResult{Topic: topic, State: st}
}
func (c *scriptedTopics) Results() <-chan topicResult { return c.ch }
func (c *scriptedTopics) Stop()                       {}

func topicState(maxBytes int, retention, tsType string) kafka.TopicState {
	return kafka.TopicState{Partitions: 1, Configs: map[string]string{"max.message.bytes": strconv.Itoa(maxBytes),
		"retention.ms": retention, "message.timestamp.type": tsType, "cleanup.policy": "delete"}}
}

// TestRowPublisherReadsATopicsSettingsAgainBeforeTheyRefuseARecord: the
// settings a record is refused by were read within topicSettingsFresh (a
// limit raised since the topic was first met lets it through); an old
// record is let through by settings read within topicSettingsMaxAge (a
// retention lowered since refuses it); settings that let a current record
// through are not read again.
func TestRowPublisherReadsATopicsSettingsAgainBeforeTheyRefuseARecord(t *testing.T) {
	now := time.Now()
	big := &router.Record{Topic: "t", EventID: []byte("big"), Value: make([]byte, 3000), Timestamp: now}
	old := &router.Record{Topic: "t", EventID: []byte("old"), Value: []byte("{}"), Timestamp: now.Add(-48 * time.Hour)}
	current := &router.Record{Topic: "t", EventID: []byte("now"), Value: []byte("{}"), Timestamp: now}
	for _, c := range []struct {
		name    string
		cached  int           // max.message.bytes
		set     topicSettings // cached, read age ago
		age     time.Duration
		state   kafka.TopicState
		rec     *router.Record
		asked   int
		refused bool
	}{
		{"limit raised", 2000, topicSettings{}, time.Minute, topicState(100000, "-1", "CreateTime"), big, 1, false},
		{"limit as it was", 2000, topicSettings{}, time.Minute, topicState(2000, "-1", "CreateTime"), big, 1, true},
		{"limit read just now", 2000, topicSettings{}, 0, topicState(100000, "-1", "CreateTime"), big, 0, true},
		{"retention raised", 0, topicSettings{deletes: true, retention: time.Hour}, time.Minute, topicState(0, "604800000", "CreateTime"), old, 1, false},
		{"switched to LogAppendTime", 0, topicSettings{deletes: true, retention: time.Hour}, time.Minute, topicState(0, "3600000", "LogAppendTime"), old, 1, false},
		{"retention as it was", 0, topicSettings{deletes: true, retention: time.Hour}, time.Minute, topicState(0, "3600000", "CreateTime"), old, 1, true},
		{"old record, settings read lately", 0, topicSettings{}, time.Minute, topicState(0, "3600000", "CreateTime"), old, 0, false},
		{"old record, settings read long ago", 0, topicSettings{}, time.Hour, topicState(0, "3600000", "CreateTime"), old, 1, true},
		{"current record, settings read long ago", 0, topicSettings{}, time.Hour, topicState(0, "3600000", "CreateTime"), current, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Relay{log: zap.NewNop(), obs: NopObserver{}, clock: realClock{}, cfg: DefaultConfig(), topics: newTopicCache(0)}
			r.cfg.Router.EventTimestampField = "occurred"
			checker := &scriptedTopics{states: map[string]kafka.TopicState{"t": c.state}, asked: map[string]int{}, ch: make(chan topicResult, 4)}
			p := &rowPublisher{r: r, prod: &refusingProducer{acks: make(chan kafka.Ack)}, checker: checker, ctx: context.Background()}
			r.topics.ok["t"] = c.cached
			c.set.read = time.Now().Add(-c.age)
			r.topics.settings = map[string]topicSettings{"t": c.set}
			res := []rowResult{{outcome: rowHeld, rec: *c.rec}}
			if err := p.rereadTopics(res); err != nil {
				t.Fatal(err)
			}
			err := p.sendable(&res[0].rec)
			if checker.asked["t"] != c.asked || (err != nil) != c.refused || (err != nil && !kafka.IsPoison(err)) {
				t.Fatalf("asked %d times, sendable: %v; want asked %d, refused %v", checker.asked["t"], err, c.asked, c.refused)
			}
			// Judged again at once: by the settings just read.
			if err := p.rereadTopics(res); err != nil || checker.asked["t"] != c.asked {
				t.Fatalf("asked again (%d times, %v)", checker.asked["t"], err)
			}
		})
	}
}
