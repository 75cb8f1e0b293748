package kafka

import (
	"encoding/binary"
	"errors"
	"time"
	"unsafe"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/router"
)

// inlineHeaders is how many headers fit in a message without a separate
// allocation. The outbox router's records carry the event id and at most a
// traceparent unless more fields are placed in headers; every inline slot
// costs 48 bytes of every record in flight, used or not (four slots made a
// message 480 bytes, two make it 384).
const inlineHeaders = 2

// message is everything sarama needs for one record, in one allocation:
// the ProducerMessage, our reference (its Metadata points back here), the
// key and value encoders and the first few headers.
type message struct {
	pm      sarama.ProducerMessage
	meta    Meta
	bytes   int // key, value and header bytes, reported back in the Ack
	sent    time.Time
	eventID []byte
	key     bytesEncoder
	value   bytesEncoder
	headers [inlineHeaders]sarama.RecordHeader
}

// bytesEncoder is sarama.ByteEncoder with a pointer receiver: a pointer into
// message fits an interface without allocating, a slice header does not.
type bytesEncoder []byte

func (b *bytesEncoder) Encode() ([]byte, error) { return *b, nil }
func (b *bytesEncoder) Length() int             { return len(*b) }

// emptyBytes is a non-nil empty slice: Kafka header keys are non-null strings.
var emptyBytes = []byte{}

// newMessage builds the sarama message for rec. It copies rec's fields, not
// the bytes they point to: Key, Value, EventID and header values alias the
// caller's memory, which the caller keeps alive and unchanged until the ack.
func newMessage(rec *router.Record, meta Meta) *message {
	m := &message{meta: meta, eventID: rec.EventID, bytes: len(rec.Key) + len(rec.Value)}
	pm := &m.pm
	pm.Topic = rec.Topic
	pm.Timestamp = rec.Timestamp
	pm.Metadata = m
	// -1 asks the partitioner to hash the key; see partitioner.
	pm.Partition = -1
	if rec.Partition >= 0 {
		pm.Partition = rec.Partition
	}
	if rec.Key != nil {
		m.key = rec.Key
		pm.Key = &m.key
	}
	if rec.Value != nil { // nil stays nil: a tombstone
		m.value = rec.Value
		pm.Value = &m.value
	}
	if n := len(rec.Headers); n > 0 {
		hs := m.headers[:0]
		if n > inlineHeaders {
			hs = make([]sarama.RecordHeader, 0, n)
		}
		for _, h := range rec.Headers {
			hs = append(hs, sarama.RecordHeader{Key: stringBytes(h.Key), Value: h.Value})
			m.bytes += len(h.Key) + len(h.Value)
		}
		pm.Headers = hs
	}
	return m
}

// stringBytes returns the bytes of s without copying them. sarama only reads
// header keys (to size and encode them), never writes them, so sharing the
// immutable string's memory is safe and saves an allocation per header.
func stringBytes(s string) []byte {
	if s == "" {
		return emptyBytes
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// ack builds the Ack for a message sarama returned, with err nil on success.
func ack(pm *sarama.ProducerMessage, err error) Ack {
	a := Ack{Topic: pm.Topic, Partition: pm.Partition, Offset: pm.Offset}
	if m, ok := pm.Metadata.(*message); ok {
		a.Meta = m.meta
		a.EventID = m.eventID
		a.Bytes = m.bytes
		a.Size = pm.ByteSize(2)
		a.Sent = m.sent
	}
	if err != nil {
		a.Offset = -1
		if errors.Is(err, sarama.ErrInvalidTimestamp) {
			err = &TimestampRefusedError{Topic: pm.Topic, Timestamp: pm.Timestamp, Err: err}
		}
		a.Err = &ProduceError{Topic: pm.Topic, Partition: pm.Partition, Err: err}
		// A failed record's bytes come back so that it can be dead-lettered.
		if m, ok := pm.Metadata.(*message); ok {
			a.Key, a.Value = m.key, m.value
		}
	}
	return a
}

// RecordSize is the size of rec as the producer counts it against
// max.message.bytes (sarama's ProducerMessage.ByteSize for record batches):
// key, value and headers plus the most a record's framing can take.
func RecordSize(rec *router.Record) int {
	n := maxRecordOverhead + len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen32
	}
	return n
}

// maxRecordOverhead is the framing of one record in a v2 batch at its
// largest (length, attributes, timestamp and offset deltas, key and value
// lengths, header count).
const maxRecordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1
