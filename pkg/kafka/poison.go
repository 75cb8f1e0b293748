package kafka

import (
	"errors"

	"github.com/IBM/sarama"
)

// IsPoison reports whether a produce error is about the record itself or
// its topic, so that sending it again cannot succeed: it is larger than the
// producer or the broker accepts, its topic does not exist or is invalid
// or lacks the partition it is placed on, or the credentials may not write
// to it. Broker outages, leader changes and
// timeouts are retriable and never poison.
func IsPoison(err error) bool {
	if err == nil {
		return false
	}
	var tl *RecordTooLargeError
	if errors.Is(err, ErrTopicMissing) || errors.As(err, &tl) || errors.Is(err, sarama.ErrInvalidPartition) {
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
