// Package checkpoint decides which WAL position pgoutbox may confirm to
// PostgreSQL.
//
// A relay reads transactions from a logical replication slot, turns their
// rows into Kafka records and reports a flush position back to the server.
// Once the server has that position as the slot's confirmed_flush_lsn it may
// recycle the WAL before it, and after a restart it resends only the
// transactions whose commit lies after it. Confirming too far therefore loses
// events for good, while confirming too little only costs duplicates and
// retained WAL. This package exists so that the "too far" case cannot happen.
//
// # The invariant
//
// [Tracker.Confirmed] only ever moves forward, and only to one of:
//
//   - the commit end LSN (pgoutput's CommitMessage.TransactionEndLSN) of the
//     last transaction of the longest contiguous prefix, in commit order, of
//     transactions that are committed and whose every record Kafka
//     acknowledged;
//   - the start position given to [New] (the slot's confirmed_flush_lsn);
//   - a keepalive's WAL end offered to [Tracker.Idle] while nothing at all is
//     open, in flight or waiting.
//
// The commit end is the only safe value inside the stream. PostgreSQL decides
// what to resend by comparing each transaction's commit with the slot's
// confirmed position, and it resends a whole transaction, including changes
// that were written long before the commit. A change LSN or an offset inside
// a transaction would make the server skip a transaction part of which Kafka
// never saw, or resend one part of which it did; the end of a commit is the
// one position that splits the stream cleanly between transactions.
//
// Kafka acknowledges records out of order across partitions, so a later
// transaction may be fully acknowledged before an earlier one. Confirming its
// end would also confirm the earlier transaction, whose commit lies before
// it, so the tracker waits until every earlier transaction is done as well.
// An open transaction (begun, commit not yet seen) has no end LSN yet; it
// blocks confirmation of itself and of everything after it.
//
// Keepalives carry the server's WAL end, which may lie past the commit of a
// transaction that is still being delivered or produced. Adopting it is safe
// only when nothing is open or unacknowledged: then every transaction the
// server sent before the keepalive is in Kafka, and confirming the WAL end is
// what lets an idle outbox release WAL written by other tables (PostgreSQL
// sends nothing at all for transactions that touch no published table).
//
// A record that Kafka refused for good ([Tracker.Fail]) freezes confirmation
// before its transaction. Later acknowledgements may still arrive, because
// the producer keeps sending after a failed batch, but they must not carry
// the confirmed position over the lost record. The relay is expected to stop
// and restart from the slot, which resends everything after the confirmed
// position; the consumers see duplicates, never gaps.
//
// # Shape
//
// The package is a pure state machine in the style of etcd's raft RawNode:
// events go in (a transaction begins, gets records, commits, a record is
// acknowledged or failed, a keepalive arrives), decisions come out
// (Confirmed, Idle's result). It starts no goroutines, reads no clock, does
// no I/O and logs nothing, so it can be tested exhaustively with tables, a
// naive model and fuzzing, and the goroutine that owns it decides how and
// when to act on its answers. Tracking an event allocates nothing once the
// internal queue has grown to hold the most transactions unconfirmed at once.
package checkpoint
