// Package poll is pgoutbox's second source, beside replication: it reads
// the outbox table itself, for databases where logical replication is not
// available. It is the only package that runs the poll source's SQL: the
// claim transaction, the bucket locks that share the table between
// instances, the notifications that wake them, the cleanup of published
// rows and the backlog count. It knows nothing of Kafka or the router: the
// relay (pkg/relay) turns the rows of a claim into records, waits for
// Kafka, and hands the outcome back to be recorded.
//
// # The table is the checkpoint
//
// A row is unpublished while its published_at is NULL. [Claimer.Claim]
// begins a transaction and locks the lowest unpublished rows in sequence
// order (SELECT ... ORDER BY seq LIMIT n FOR NO KEY UPDATE SKIP LOCKED, on the
// partial index of unpublished rows); [Batch.Finish] marks those Kafka
// acknowledged (or deletes them), counts the failed attempts, and commits.
// Until that commit nothing is recorded: a relay that dies leaves its rows
// unpublished and unlocked, and they are claimed again. There is no "last
// sequence seen": every claim starts at the lowest unpublished sequence, so
// a row whose transaction commits after rows with higher numbers (a long
// transaction) is claimed as soon as it is visible.
//
// # Order per key across instances
//
// Keys hash into poll.buckets buckets (hashtext of the key column's text,
// computed by the server). An instance claims only rows of the buckets it
// owns, and owns a bucket while it holds the bucket's session-level
// advisory lock; see [Membership]. Since the lock outlives every claim
// transaction of its session, the next owner's first claim begins after
// the last owner's last claim ended: one key is published by one instance
// at a time, in sequence order.
//
// # Concurrency
//
// A [Claimer], its [Batch]es and a [Membership] belong to the goroutine
// that owns their connection (pgx connections are not safe for concurrent
// use); the relay uses one connection for all three, so that the bucket
// locks and the claims share a session. A [Listener] owns a goroutine and
// a connection of its own; its Wake channel may be read from any
// goroutine, and Stop waits for the goroutine. [Cleanup], [ReadBacklog],
// [Members] and the mark functions run on the caller's goroutine and
// connection.
package poll
