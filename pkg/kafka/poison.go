package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// IsPoison reports whether a produce error is about the record itself or
// its topic, so that sending it again cannot succeed: it is larger than the
// producer or the broker accepts, its timestamp is one the broker refuses
// or so old that its topic would delete it at once, its topic does not
// exist or is invalid or lacks the partition it is placed on, or the
// credentials may not write to it. Broker outages, leader changes and
// timeouts are retriable and never poison.
func IsPoison(err error) bool {
	if err == nil {
		return false
	}
	var tl *RecordTooLargeError
	var to *RecordTooOldError
	if errors.Is(err, ErrTopicMissing) || errors.As(err, &tl) || errors.As(err, &to) || errors.Is(err, sarama.ErrInvalidPartition) {
		return true
	}
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) {
		// sarama refuses a record above Producer.MaxMessageBytes this way.
		return true
	}
	var ke sarama.KError
	if errors.As(err, &ke) {
		switch ke {
		case sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidTopic, sarama.ErrInvalidTimestamp,
			sarama.ErrTopicAuthorizationFailed, sarama.ErrInvalidRecord, sarama.ErrUnknownTopicOrPartition:
			return true
		}
	}
	return false
}

// MayBeStaleMetadata reports whether a produce error may come from the
// producer's view of the cluster rather than from the record: sarama
// checks an explicit partition against the partition count it cached
// (refreshed every Metadata.RefreshFrequency, 10 minutes), so a partition
// added since is "missing", and a topic whose metadata it just dropped
// (a leader move) is unknown. Such a record is poison only if a producer
// with fresh metadata refuses it too.
func MayBeStaleMetadata(err error) bool {
	return errors.Is(err, sarama.ErrInvalidPartition) || errors.Is(err, sarama.ErrUnknownTopicOrPartition)
}

// IsBatchRefused reports whether the broker refused a whole batch for what
// a record in it is: too large (the broker limits whole batches by the
// topic's max.message.bytes), a timestamp out of the topic's range, or a
// record the topic does not take (a null key on a compacted topic). sarama
// then fails every record of the batch, so the others may be good: only a
// record sent in a batch of its own, and refused, is poison.
func IsBatchRefused(err error) bool {
	for _, k := range []sarama.KError{sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge,
		sarama.ErrInvalidTimestamp, sarama.ErrInvalidRecord} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// timestampWaysOn is what to do about a record whose timestamp its topic
// refuses or would delete: the ways of relaying it.
const timestampWaysOn = "set the topic's message.timestamp.type=LogAppendTime (the broker stamps the time it appends), or leave " +
	"table.field.event.timestamp unset (records carry the time they are relayed)"

// RecordTooOldError is a record whose timestamp is so old that its topic
// would delete it (almost) at once: the topic deletes records by the
// timestamps they carry (message.timestamp.type=CreateTime) once they are
// older than its retention.ms, and the broker accepts a record already that
// old, so delivered and confirmed it would be lost without a word. It is
// poison: sending it again cannot help.
type RecordTooOldError struct {
	Topic     string
	EventID   []byte
	Timestamp time.Time     // the record's
	Retention time.Duration // the topic's retention.ms
	// Margin is the least time of the retention the record must have left
	// when it is judged (At).
	Margin time.Duration
	At     time.Time
}

func (e *RecordTooOldError) Error() string {
	return fmt.Sprintf("kafka: record of event %s for topic %q has the timestamp %s (%s old), older than the topic's retention.ms=%d (%s) less a margin of %s: "+
		"the topic (message.timestamp.type=CreateTime) would delete it at its next retention check, so it is not relayed there; to relay it, raise the topic's retention.ms (to more than the record's age and an hour), or "+timestampWaysOn,
		e.EventID, e.Topic, e.Timestamp.UTC().Format(time.RFC3339Nano), e.At.Sub(e.Timestamp).Round(time.Second), e.Retention.Milliseconds(), e.Retention, e.Margin)
}

// TimestampRefusedError is the broker's INVALID_TIMESTAMP for a record,
// with the timestamp the record carried. A broker refuses, on a topic with
// message.timestamp.type=CreateTime, a timestamp further ahead of its clock
// than message.timestamp.after.max.ms (Kafka 4: one hour by default) or
// further behind than message.timestamp.before.max.ms; it refuses the
// whole batch the record was in.
type TimestampRefusedError struct {
	Topic string
	// Timestamp is the record's; zero when it had none (the producer
	// stamped its own clock's time).
	Timestamp time.Time
	Err       error // sarama.ErrInvalidTimestamp
}

func (e *TimestampRefusedError) Error() string {
	ts := "the producer's time"
	if !e.Timestamp.IsZero() {
		ts = e.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("kafka: the broker refused, for a timestamp, a batch for topic %q holding this record, stamped %s (%v): "+
		"a CreateTime topic accepts only timestamps within message.timestamp.before.max.ms before and message.timestamp.after.max.ms after the broker's clock "+
		"(Kafka 4 refuses by default a timestamp more than 1 hour ahead); check the timestamp column's values and the clocks of the database and the brokers, "+
		"raise those two settings of the topic, or "+timestampWaysOn, e.Topic, ts, e.Err)
}

func (e *TimestampRefusedError) Unwrap() error { return e.Err }
