// Package kafka writes pgoutbox's records to Kafka. It is the only package
// that imports sarama.
//
// # The producer
//
// [New] starts sarama's async producer configured for a relay that must
// never confirm a WAL position Kafka has not durably taken:
//
//   - idempotent, acks=all, one open request per broker connection (what
//     idempotence needs to keep per-partition order across retries), and
//     retries with a capped exponential backoff long enough to ride out a
//     broker restart;
//   - Java's murmur2 partitioner for keyed records, so keys land on the same
//     partitions as Debezium and every Java client put them, while an
//     explicit [router.Record] Partition is honoured;
//   - Successes and Errors both returned, and both drained.
//
// [Producer.Send] turns a record into a sarama message (one allocation: the
// message carries the caller's ref and event ID back in its Metadata) and
// queues it for sarama. Every Send yields exactly one [Ack] on
// [Producer.Acks], success or failure.
//
// # The goroutines
//
// The Producer owns two goroutines, started by New:
//
//   - the pump takes the records Send queued and hands them to sarama's
//     input, in order. The queue holds Config.AckBuffer records, so Send never
//     waits; the pump does when sarama's channels are full, as when a
//     partition's broker stops answering. sarama's channels stay small (256):
//     it makes one per topic and one per partition, and the garbage collector
//     scans each in every cycle.
//   - the drain reads sarama's Successes and Errors channels (sarama
//     deadlocks if either is left unread) and turns each message into an Ack
//     on the Acks channel. It returns after sarama closes both channels,
//     closing Acks as it goes.
//
// [Producer.Close] closes the queue; the pump hands sarama what is left and
// calls sarama's AsyncClose, which lets every in-flight record finish
// (including its retries). Close waits for both goroutines to return and
// then closes the connections; the acks delivered stay readable.
//
// The Acks channel is buffered with capacity Config.AckBuffer, and the
// caller must never have more records sent and unacknowledged than that. The
// drain can then always deliver an ack without waiting for the caller, so
// sarama is always drained, and the queue always has room for a Send.
//
// # Errors stop the relay
//
// An Ack with a non-nil Err is final for that record: sarama has given up on
// it (retries exhausted, a non-retriable broker error, a record over
// MaxMessageBytes, a missing topic). The idempotent producer then bumps its
// epoch and keeps sending the records behind it, to the same partition too,
// so acknowledgements keep arriving for later records although an earlier
// one is missing from the log. Those later acks do not mean "everything up
// to here is in Kafka". A relay must therefore treat any error Ack as a
// stop: confirm no LSN at or after the failed record's transaction, close
// the producer and restart from the replication slot, which resends the
// unconfirmed transactions (duplicates, never gaps).
//
// The sarama section of the project's field notes lists the library facts
// this package relies on.
package kafka
