package kafka

import (
	"fmt"

	"github.com/IBM/sarama"
)

// partitioner honours an explicit partition and otherwise places a record
// as the Java client's default partitioner does: (murmur2(key) & 0x7fffffff)
// % partitions, so keys land where Debezium and every Java producer put
// them. Records with neither key nor partition go to a random writable
// partition.
//
// Send stores the explicit partition (or -1) in ProducerMessage.Partition,
// which sarama reads only here: it partitions a message once, before its
// first attempt, and overwrites the field with the result.
type partitioner struct {
	murmur2 sarama.Partitioner
}

func newPartitioner(topic string) sarama.Partitioner {
	return &partitioner{murmur2: sarama.NewMurmur2Partitioner(topic)}
}

// Partition returns an index into the topic's sorted partition IDs. When
// consistency is required sarama passes all partitions, so the index is the
// partition ID.
func (p *partitioner) Partition(msg *sarama.ProducerMessage, numPartitions int32) (int32, error) {
	if msg.Partition >= 0 {
		if msg.Partition >= numPartitions {
			return -1, fmt.Errorf("kafka: partition %d does not exist: topic %q has %d partitions: %w",
				msg.Partition, msg.Topic, numPartitions, sarama.ErrInvalidPartition)
		}
		return msg.Partition, nil
	}
	return p.murmur2.Partition(msg, numPartitions)
}

// RequiresConsistency reports true: a keyed or explicitly placed record must
// go to its partition even while that partition has no leader.
func (p *partitioner) RequiresConsistency() bool { return true }

// MessageRequiresConsistency lets records with neither key nor explicit
// partition choose among the partitions that have a leader.
func (p *partitioner) MessageRequiresConsistency(msg *sarama.ProducerMessage) bool {
	return msg.Partition >= 0 || msg.Key != nil
}
