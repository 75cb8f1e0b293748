package relay

import (
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// topicSettings is what a topic's settings say about the timestamps of the
// records it keeps, and when the topic's settings (these, and its
// max.message.bytes in topicCache.ok) were read.
//
// Settings are read when a topic is first met, and read again before they
// are trusted for a decision that a stale copy gets wrong at an event's
// cost (stale): an operator raises a topic's max.message.bytes or
// retention.ms after a record was refused, and records between the old and
// the new limit were refused (dead-lettered) until a restart; or lowers its
// retention.ms, or turns a LogAppendTime topic to CreateTime, and old
// records let through by the settings read at the start are deleted. A time
// limit on every cached setting would leave both open for as long as the
// limit, and make every record wait for a read at each expiry; reading
// again before such a decision costs nothing while records go through, and
// at most one read per topic per topicSettingsFresh (refusals) or
// topicSettingsMaxAge (old records) otherwise. A read's answer is dated
// when it arrives; like any read, it may miss a change made a moment later.
type topicSettings struct {
	// deletes: the topic deletes records by their own timestamps once
	// older than retention (kafka.TopicState.TimestampRetention); false
	// when it does not, or the settings are not known.
	deletes   bool
	retention time.Duration
	// read is when they were read; zero when not known.
	read time.Time
}

// topicSettingsFresh is how recently a topic's settings must have been read
// for a record to be refused by them (too large for the topic, too old for
// its retention): read longer ago, they are read again first, and the
// record, with the records of its topic behind it, waits for them (a round
// trip to the cluster). Records released by a read are judged by it at
// once, well within a second; and a second bounds the reads of a topic
// whose records are refused one after another to one a second.
const topicSettingsFresh = time.Second

// topicSettingsMaxAge is how long a topic's settings are trusted to let
// through a record whose timestamp is older than topicSettingsMaxAge too:
// it would be deleted only by a retention lowered since (or a switch to
// CreateTime) to about that age, which no topic of events has. Records
// without an old timestamp (without table.field.event.timestamp a record
// carries the time it is relayed) never wait for a read.
const topicSettingsMaxAge = 5 * time.Minute

// retentionMargin is how much of its topic's retention a record must have
// left to be sent: the smaller of a tenth of the retention and an hour. A
// record with less is deleted soon after it is confirmed: the broker checks
// retention every log.retention.check.interval.ms (5 minutes by default),
// the brokers' clocks may differ from the database's that stamped it, and
// consumers a little behind would never see it. An hour is many times the
// check interval and more than any sane clock skew, and leaves consumers
// time to read it; a larger margin would refuse records of an ordinary
// backlog (an outage shorter than the retention) that can still be read
// for hours. A tenth keeps topics with short retentions (minutes: live
// traffic only, tests) usable, where an hour would refuse every record.
func retentionMargin(retention time.Duration) time.Duration {
	return min(retention/10, time.Hour)
}

// stale says whether s (read at s.read) is too old to judge rec by at now:
// to refuse rec (refused: their verdict) they must have been read within
// topicSettingsFresh; to let a record with an old timestamp through,
// within topicSettingsMaxAge.
func (s topicSettings) stale(rec *router.Record, refused error, now time.Time) bool {
	age := now.Sub(s.read)
	if refused != nil {
		return age > topicSettingsFresh
	}
	return age > topicSettingsMaxAge && !rec.Timestamp.IsZero() && now.Sub(rec.Timestamp) > topicSettingsMaxAge
}

// learnSettings records the settings in st, the topic checker's answer for
// a topic that exists, read now. With the timestamp column configured, a
// topic whose retention settings could not be read is warned of, once: its
// records are not checked against its retention.
func (r *Relay) learnSettings(st kafka.TopicState) {
	c := r.topics
	if c.settings == nil {
		c.settings = map[string]topicSettings{}
	}
	retention, deletes, known := st.TimestampRetention()
	c.settings[st.Topic] = topicSettings{deletes: deletes, retention: retention, read: r.clock.Now()}
	if !known && !c.settingsWarned[st.Topic] && r.cfg.UsesEventTimestamp() {
		if c.settingsWarned == nil {
			c.settingsWarned = map[string]bool{}
		}
		c.settingsWarned[st.Topic] = true
		r.log.Warn("cannot read the topic's retention.ms and message.timestamp.type (may this client describe its configs?): records stamped with table.field.event.timestamp are not checked against its retention, and one older than that would be deleted by the topic soon after it is relayed",
			zap.String("topic", st.Topic))
	}
}

// knownSettings records the settings of topics checked at start-up, as
// read long ago: they are read again before a record is judged by them
// (only the dead-letter topic is checked at start-up, and its records
// carry the time they are sent).
func (c *topicCache) knownSettings(st kafka.TopicState) {
	if c.settings == nil {
		c.settings = map[string]topicSettings{}
	}
	retention, deletes, _ := st.TimestampRetention()
	c.settings[st.Topic] = topicSettings{deletes: deletes, retention: retention}
}

// topicRefuses says why rec's topic can never take rec (now), if it
// cannot: it is larger than the topic's max.message.bytes (limit; see
// overTopicLimit), or too old for the topic's retention (tooOldForTopic).
func (r *Relay) topicRefuses(rec *router.Record, limit int, s topicSettings, now time.Time) error {
	if err := r.overTopicLimit(rec, limit); err != nil {
		return err
	}
	return tooOldForTopic(rec, s, now)
}

// tooOldForTopic says whether rec's timestamp (table.field.event.timestamp's
// value) is older than its topic's retention less retentionMargin, on a
// topic that deletes records by their timestamps (CreateTime, a finite
// retention.ms, a cleanup.policy with delete). The broker accepts such a
// record, and its next retention check deletes it: the event would be lost
// with its position confirmed. So it is poison (*kafka.RecordTooOldError):
// dead-lettered, with the time it is dead-lettered as the dead-letter
// record's timestamp (deadLetter, deadLetterRecord), or stopped on, per
// relay.poison.policy.
func tooOldForTopic(rec *router.Record, s topicSettings, now time.Time) error {
	if !s.deletes || rec.Timestamp.IsZero() {
		return nil
	}
	margin := retentionMargin(s.retention)
	if now.Sub(rec.Timestamp) <= s.retention-margin {
		return nil
	}
	return &kafka.RecordTooOldError{Topic: rec.Topic, EventID: rec.EventID, Timestamp: rec.Timestamp,
		Retention: s.retention, Margin: margin, At: now}
}

// judge decides, for the topic gate, about rec for a topic known to exist
// whose max.message.bytes is limit: it is parked while the topic's
// settings are read again (they are stale for it, or records of the topic
// wait for them already), or refused by them (err), or neither, and then
// sent. Released after the read, it is judged by settings just read.
func (g *topicGate) judge(rec *router.Record, m kafka.Meta, limit int) (parked bool, err error) {
	s, cache, topic := g.s, g.s.r.topics, rec.Topic
	if _, waiting := g.parked[topic]; !waiting {
		now := s.clock.Now()
		set := cache.settings[topic]
		err = s.r.topicRefuses(rec, limit, set, now)
		if !set.stale(rec, err, now) {
			return false, err
		}
		g.checker.Request(topic, cache.ttl)
	}
	p := parkedRecord{rec: *rec, meta: m}
	p.rec.Headers = slices.Clone(rec.Headers) // the router reuses rec's headers
	g.parked[topic] = append(g.parked[topic], p)
	return true, nil
}

// rereadTopics has the settings of the topics of res's records to be sent
// read again, where they are stale for one of them (topicSettings.stale),
// and waits for them: each record is then judged (sendable) by settings
// read just now.
func (p *rowPublisher) rereadTopics(res []rowResult) error {
	cache := p.r.topics
	if p.r.cfg.Kafka.AutoCreateTopics {
		return nil
	}
	now := p.r.clock.Now()
	waiting := map[string]bool{}
	for i := range res {
		rec := &res[i].rec
		limit, ok := cache.ok[rec.Topic]
		if res[i].outcome != rowHeld || !ok || waiting[rec.Topic] {
			continue
		}
		set := cache.settings[rec.Topic]
		if set.stale(rec, p.r.topicRefuses(rec, limit, set, now), now) {
			waiting[rec.Topic] = true
			p.checker.Request(rec.Topic, cache.ttl)
		}
	}
	return p.awaitTopics(waiting)
}
