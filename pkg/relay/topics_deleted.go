package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
)

// A topic deleted while the relay runs: Kafka answers its records with
// UNKNOWN_TOPIC_OR_PARTITION (kafka.IsUnknownTopic), which sarama gives
// only after asking for the topic's metadata for as long as its retries
// (or kafka.metadata.timeout) last. The topic cache knew it to exist, so
// its records would go to the producer again and again: forget drops it,
// and marks it deleted in topicCache.failed, with an answer that stands no
// longer (until is the record's send), so that its next record waits for
// the topic checker. The gate has the checker ask for what is left of
// kafka.topic.missing.timeout since that send (missingFor), and its
// "missing" is then poison that says the topic was deleted
// (deletedResult). A topic found again is known again. The poll source
// (rowPublisher) does the same: deliver forgets, knowTopics asks for
// missingFor before a claim's rows are sent, noteTopic applies
// deletedResult.

// deletedTopicError is a topic Kafka stopped knowing while the relay ran:
// in topicCache.failed, the mark of forget; in a checker's answer, the
// topic still missing.
type deletedTopicError struct {
	topic string
	since time.Time // the send of the record Kafka refused
	err   error     // the checker's answer (kafka.ErrTopicMissing); nil in the mark
}

func (e *deletedTopicError) Error() string {
	msg := fmt.Sprintf("topic %q was deleted while the relay ran: Kafka answered UNKNOWN_TOPIC_OR_PARTITION to a record sent at %s",
		e.topic, e.since.UTC().Format(time.RFC3339))
	if e.err != nil {
		msg += ", and does not know the topic since: " + e.err.Error()
	}
	return msg
}

func (e *deletedTopicError) Unwrap() error { return e.err }

// forget drops topic from the topics known to exist after Kafka refused a
// record for it, sent at since, as unknown.
func (c *topicCache) forget(topic string, since, now time.Time) {
	delete(c.ok, topic)
	if _, ok := c.deletedSince(topic); ok {
		return
	}
	if since.IsZero() || since.After(now) {
		since = now
	}
	c.failed[topic] = failedTopic{err: &deletedTopicError{topic: topic, since: since}, until: since}
}

// deletedSince says whether topic is marked deleted by forget, and since
// when.
func (c *topicCache) deletedSince(topic string) (time.Time, bool) {
	f, ok := c.failed[topic]
	if !ok {
		return time.Time{}, false
	}
	var d *deletedTopicError
	if !errors.As(f.err, &d) {
		return time.Time{}, false
	}
	return d.since, true
}

// missingFor is how long the topic checker asks about topic before its
// "missing" stands: kafka.topic.missing.timeout, or for a topic marked
// deleted what is left of it since Kafka refused its record (sarama asked
// for its metadata in between).
func (c *topicCache) missingFor(topic string, now time.Time) time.Duration {
	if since, ok := c.deletedSince(topic); ok {
		return min(c.ttl, max(c.ttl-now.Sub(since), 0))
	}
	return c.ttl
}

// deletedResult makes a checker's "missing" for a topic marked deleted
// say so.
func (c *topicCache) deletedResult(res topicResult) topicResult {
	if since, ok := c.deletedSince(res.Topic); ok && errors.Is(res.State.Err, kafka.ErrTopicMissing) {
		res.State.Err = &deletedTopicError{topic: res.Topic, since: since, err: res.State.Err}
	}
	return res
}

// refusedAgain is the error of a record Kafka refused after the session
// restarted once with fresh metadata for it (staleRetried): refused as of
// an unknown topic again, with kafka.auto.create.topics (the topic
// checker asks otherwise), the topic was deleted and the brokers did not
// create it again, and the error says so; any other error is a.Err.
func refusedAgain(a kafka.Ack) error {
	if kafka.IsUnknownTopic(a.Err) {
		return &deletedTopicError{topic: a.Topic, since: a.Sent, err: a.Err}
	}
	return a.Err
}
