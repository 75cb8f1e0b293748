package relay

import (
	"context"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// The relay's loop talks to the world only through the small interfaces in
// this file. The production implementations (live.go) connect to PostgreSQL
// and Kafka; the deterministic tests (sim_test.go) script a walsender, a
// producer, the topic checks, the catalog checks and the clock, and check
// the loop's invariants after every step.

// stream is one replication session: *replication.Stream.
type stream interface {
	// Receive waits until deadline for the next message; a zero Event
	// means the deadline passed, or Wake was called.
	Receive(ctx context.Context, deadline time.Time) (replication.Event, error)
	// SendStatus confirms confirmed (flush and apply positions).
	SendStatus(ctx context.Context, confirmed checkpoint.LSN, replyRequested bool) error
	// EndStream ends the stream after the final status update.
	EndStream(timeout time.Duration) error
	// Wake makes a waiting Receive return at once; any goroutine may call it.
	Wake()
	Close(ctx context.Context) error
}

// producer sends records to Kafka: *kafka.Producer. Send never blocks on
// the network.
type producer interface {
	Send(rec *router.Record, m kafka.Meta)
	Acks() <-chan kafka.Ack
	// Close waits (until ctx ends) for what is in flight.
	Close(ctx context.Context) error
}

// topicChecker checks, off the loop's goroutine, that topics exist before
// their first records are sent, and posts one result per request.
type topicChecker interface {
	// Request asks for topic to be checked; it never blocks. A topic
	// reported missing is asked about again until missingFor has passed.
	Request(topic string, missingFor time.Duration)
	Results() <-chan topicResult
	// Stop ends the checks and waits for them.
	Stop()
}

type topicResult struct {
	Topic string
	State kafka.TopicState
}

// catalogWatcher reads the catalog off the loop's goroutine: every
// postgres.publication.check.interval, and when asked. It also records the
// confirmed position in the state table now and then.
type catalogWatcher interface {
	// Check asks for a check now; it never blocks.
	Check()
	// See makes the checks from now on see transaction xid (0: none), which
	// the stream carried, before they pass: a commit is sent a moment
	// before it is visible. Their results say so (catalogResult.Saw).
	See(xid uint32)
	Results() <-chan catalogResult
	// Confirmed tells the watcher what the slot was last told, and the end
	// of the last transaction that carried events, for the state record.
	Confirmed(lsn, eventCommit checkpoint.LSN)
	// RaiseFence asks the next check to record, in the state table, that
	// the session may confirm up to at least lsn (the fence); it never
	// blocks. The check's result carries the fence the row then holds.
	RaiseFence(lsn checkpoint.LSN)
	// ReadPrefixes asks a check soon to read, as well, the messages.prefix
	// other slots relay with (replication.RelayedPrefixes); it never
	// blocks. Asks are numbered, and a result says the latest it covers.
	ReadPrefixes(ask uint64)
	// Stop ends the watcher and waits for it; it records the final
	// confirmed position first when it can within ctx, and sent as where
	// the session stopped: the furthest position the process may have
	// confirmed to the slot.
	Stop(ctx context.Context, sent checkpoint.LSN)
}

type catalogResult struct {
	Catalog replication.Catalog
	Err     error
	// ShuttingDown says the server refused the check because it is
	// shutting down.
	ShuttingDown bool
	// Saw is the transaction the check's snapshot was made to see (See).
	Saw uint32
	// Fence, when not 0, is the fence the state row holds after this
	// check raised it: the session may confirm up to it. FenceOff says the
	// state table keeps no fence (one made before stopped_lsn): the
	// session confirms without one.
	Fence    checkpoint.LSN
	FenceOff bool
	// Attached names the partitions attached since the session started
	// that held rows from before (replication.AttachedWithOlderRows).
	Attached []string
	// OtherPrefixes, when not nil, is the messages.prefix other slots
	// relay with, by prefix their names, as this check read them (every
	// otherPrefixesEvery, and when asked). PrefixesFor is the latest
	// ReadPrefixes ask made before the check began, which it answers
	// (OtherPrefixes is nil when it could not read them).
	OtherPrefixes map[string]string
	PrefixesFor   uint64
}

// clock is time for the loop: the real one, or the tests' fake.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

type timer interface {
	C() <-chan time.Time
	Stop() bool
}

// backend opens what a session talks to.
type backend interface {
	// Prepare checks the server, the publication and the slot (see
	// replication.Prepare).
	Prepare(ctx context.Context, cfg replication.Config) (replication.Start, error)
	// RecordSession records in the state table that this instance now
	// holds the slot, before it confirms anything.
	RecordSession(ctx context.Context, cfg replication.Config, st replication.State) error
	Open(ctx context.Context, cfg replication.Config, start checkpoint.LSN) (stream, error)
	// ReadSlot reads the slot as it is now (after Open: the slot is the
	// stream's, and no one else can move it), and the server's clock then.
	ReadSlot(ctx context.Context, cfg replication.Config) (replication.SlotState, time.Time, error)
	NewProducer(ctx context.Context, cfg kafka.Config) (producer, error)
	// NewTxnProducer starts exactly-once mode's producer for the slot: it
	// fences earlier producers of cfg.TransactionalID, then reads the
	// position Kafka committed for the slot.
	NewTxnProducer(ctx context.Context, cfg kafka.Config, id kafka.SlotIdentity) (txnProducer, error)
	// EnsureOffsetsTopic creates exactly-once mode's offsets topic if it
	// does not exist.
	EnsureOffsetsTopic(ctx context.Context, cfg kafka.Config) error
	// WALEnd reads the end of the server's WAL (replication.ReadWALEnd).
	WALEnd(ctx context.Context, cfg replication.Config) (checkpoint.LSN, error)
	// TimelineFork says where timeline from ended in the history of
	// timeline to (see replication.TimelineFork).
	TimelineFork(ctx context.Context, cfg replication.Config, from, to int32) (checkpoint.LSN, bool, error)
	// CheckTopics asks Kafka about topics (start-up checks).
	CheckTopics(ctx context.Context, cfg kafka.Config, topics []string) ([]kafka.TopicState, error)
	// StartTopicChecker and StartCatalogWatcher start the session's
	// checkers; wake is called after each result is posted. start is the
	// catalog the session started with: the partitions attached in it were
	// looked at by the start.
	StartTopicChecker(cfg kafka.Config, wake func()) topicChecker
	StartCatalogWatcher(cfg replication.Config, instance string, start *replication.Catalog, wake func()) catalogWatcher
}

// slotMembership is what a backend that shows the instances on a slot to
// each other implements besides backend (the live one; the deterministic
// tests' relays are alone on their slots, and have none).
type slotMembership interface {
	// JoinSlot shows this instance on the slot, publishing to destination
	// (replication.JoinSlot), on a connection of its own that the member
	// holds until closed (membership.go).
	JoinSlot(ctx context.Context, cfg replication.Config, destination int32) (slotMember, error)
	// SlotMembers reads the instances on the slot (replication.SlotMembers).
	SlotMembers(ctx context.Context, cfg replication.Config) ([]replication.SlotMember, error)
}

// slotMember is this instance's membership of the slot's instances.
type slotMember interface {
	// Alive says whether the member's connection still answers.
	Alive(ctx context.Context) bool
	Close()
}
