package checkpoint

import (
	"errors"
	"fmt"
	"strings"
)

// LSN is a PostgreSQL WAL position.
type LSN uint64

// String formats l the way PostgreSQL prints an LSN, as the high and low 32
// bits in upper-case hexadecimal separated by a slash (for example
// "16/B374D848"), so that log lines can be compared with pg_replication_slots.
func (l LSN) String() string {
	return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l))
}

// TxnID identifies a transaction tracked by a [Tracker]. IDs are assigned by
// [Tracker.Begin], starting at 1 and increasing by one per transaction; the
// zero TxnID is never assigned.
type TxnID uint64

// Sentinel errors. Errors that carry data ([*LSNOrderError], [*TxnError])
// unwrap to one of these, so callers test them with errors.Is.
var (
	// ErrTxnOpen is returned by Begin while a transaction is already open:
	// pgoutput protocol v1 delivers whole transactions one after another,
	// so a second Begin means the caller lost track of a commit.
	ErrTxnOpen = errors.New("checkpoint: a transaction is already open")
	// ErrNoOpenTxn is returned by Add, Commit and Abort when no
	// transaction is open.
	ErrNoOpenTxn = errors.New("checkpoint: no transaction is open")
	// ErrInvalidCount is returned by Add for a record count below 1.
	ErrInvalidCount = errors.New("checkpoint: record count must be at least 1")
	// ErrLSNOrder is returned (wrapped in an [*LSNOrderError]) by Commit
	// for a commit end that is not after every earlier commit end or is
	// before the confirmed position.
	ErrLSNOrder = errors.New("checkpoint: commit end LSN out of order")
	// ErrInFlight is returned by Abort when the open transaction has
	// records that Kafka has not acknowledged yet.
	ErrInFlight = errors.New("checkpoint: transaction has records in flight")
	// ErrUnknownTxn is returned (wrapped in a [*TxnError]) by Ack for an ID
	// that Begin never assigned.
	ErrUnknownTxn = errors.New("checkpoint: unknown transaction")
	// ErrTooManyAcks is returned (wrapped in a [*TxnError]) by Ack for a
	// transaction all of whose records are already acknowledged,
	// including one already confirmed or aborted.
	ErrTooManyAcks = errors.New("checkpoint: more acks than records")
)

// LSNOrderError reports a commit end LSN rejected by [Tracker.Commit]. It
// unwraps to [ErrLSNOrder].
type LSNOrderError struct {
	// End is the rejected commit end.
	End LSN
	// LastCommit is the end of the previous commit, or 0 if there was none.
	LastCommit LSN
	// Confirmed is the tracker's confirmed position at the time.
	Confirmed LSN
}

// Error describes the rejected LSN and the bounds it violated.
func (e *LSNOrderError) Error() string {
	return fmt.Sprintf("checkpoint: commit end %s out of order: last commit end %s, confirmed %s",
		e.End, e.LastCommit, e.Confirmed)
}

// Unwrap returns [ErrLSNOrder].
func (e *LSNOrderError) Unwrap() error { return ErrLSNOrder }

// TxnError reports an operation on a transaction ID that the tracker
// rejected. It unwraps to the sentinel in Err.
type TxnError struct {
	// Op is the operation, for example "ack".
	Op string
	// ID is the transaction the operation named.
	ID TxnID
	// Err is the sentinel explaining the rejection.
	Err error
}

// Error describes the operation, the transaction and the reason.
func (e *TxnError) Error() string {
	return fmt.Sprintf("checkpoint: %s txn %d: %s", e.Op, e.ID, strings.TrimPrefix(e.Err.Error(), "checkpoint: "))
}

// Unwrap returns the sentinel in Err.
func (e *TxnError) Unwrap() error { return e.Err }

type txnState uint8

const (
	stateOpen txnState = iota
	stateCommitted
	// stateAborted marks a transaction discarded by Abort. It stays in the
	// queue as a tombstone, so that transaction IDs keep mapping to queue
	// offsets by subtraction and are never reused; it confirms nothing.
	stateAborted
)

// txn is one queued transaction. Its ID is implicit: headID plus its offset
// from the head of the queue.
type txn struct {
	end     LSN // commit end; meaningful once committed
	records int // records added so far
	acked   int // records acknowledged so far, never above records
	state   txnState
}

// minQueue is the queue capacity allocated on first use. It is a power of
// two so that ring indices can be masked instead of divided.
const minQueue = 16

// Tracker tracks transactions from the replication stream and the Kafka
// acknowledgements of their records, and computes the highest LSN that is
// safe to confirm to PostgreSQL.
//
// A Tracker is not safe for concurrent use: it is meant to be owned by one
// goroutine (the relay's event loop), which feeds it the stream's
// transactions and the producer's acknowledgements. It never blocks, and it
// does not allocate once its queue has grown to hold the transactions that
// are unconfirmed at once.
type Tracker struct {
	confirmed LSN

	// lastEnd is the end of the latest commit; committed says whether
	// there was one, since 0 is a valid (if unlikely) bound otherwise.
	lastEnd   LSN
	committed bool

	nextID TxnID // ID the next Begin assigns
	headID TxnID // ID of the transaction at the head; nextID when empty

	// The queue of unconfirmed transactions in commit order, as a ring
	// buffer whose length is a power of two. Confirmed transactions leave
	// from the head, Begin appends at the tail, and the slice is reused so
	// that steady-state tracking allocates nothing.
	buf  []txn
	head int
	n    int

	open     bool // the tail transaction is open
	inFlight int  // records added but not acknowledged, over all txns
	pending  int  // committed or open txns not yet confirmed

	failed bool
	// failAt is the first ID that may never be confirmed; valid when
	// failed. Everything before it still may be.
	failAt TxnID
}

// New returns a tracker whose confirmed position starts at start, the slot's
// confirmed_flush_lsn (which may be 0 for a new slot).
func New(start LSN) *Tracker {
	return &Tracker{confirmed: start, nextID: 1, headID: 1}
}

// Begin opens a transaction whose commit has not been seen yet and returns
// its ID. Records may be added to it, and acknowledged, while it is open.
// Only one transaction can be open at a time; calling Begin while one is
// open returns [ErrTxnOpen].
func (t *Tracker) Begin() (TxnID, error) {
	if t.open {
		return 0, ErrTxnOpen
	}
	t.push(txn{state: stateOpen})
	id := t.nextID
	t.nextID++
	t.open = true
	t.pending++
	return id, nil
}

// Add registers n more records of the open transaction as in flight. It
// returns [ErrNoOpenTxn] if no transaction is open and [ErrInvalidCount] if n
// is below 1.
func (t *Tracker) Add(n int) error {
	if !t.open {
		return ErrNoOpenTxn
	}
	if n < 1 {
		return ErrInvalidCount
	}
	t.tail().records += n
	t.inFlight += n
	return nil
}

// Commit closes the open transaction with its commit end LSN
// (CommitMessage.TransactionEndLSN). The end must be after every earlier
// commit end and not before the confirmed position, or Commit returns an
// [*LSNOrderError] and leaves the transaction open: an end out of order means
// the caller passed a wrong LSN, and accepting it could confirm too far. A
// transaction whose records are all acknowledged, or that has none, is
// complete at once and may move the confirmed position.
func (t *Tracker) Commit(end LSN) error {
	if !t.open {
		return ErrNoOpenTxn
	}
	if end < t.confirmed || (t.committed && end <= t.lastEnd) {
		var last LSN
		if t.committed {
			last = t.lastEnd
		}
		return &LSNOrderError{End: end, LastCommit: last, Confirmed: t.confirmed}
	}
	tx := t.tail()
	tx.end = end
	tx.state = stateCommitted
	t.open = false
	t.lastEnd = end
	t.committed = true
	t.advance()
	return nil
}

// Abort discards the open transaction, for example when the stream broke
// before its commit arrived. It is only legal while none of the
// transaction's records are in flight, else it returns [ErrInFlight]: an
// acknowledgement arriving for a discarded transaction could not be told
// apart from one for a live transaction, so a relay with records in flight
// restarts the whole tracker instead. The aborted transaction's ID is not
// reused; acknowledging it returns [ErrTooManyAcks].
func (t *Tracker) Abort() error {
	if !t.open {
		return ErrNoOpenTxn
	}
	tx := t.tail()
	if tx.acked < tx.records {
		return ErrInFlight
	}
	tx.state = stateAborted
	t.open = false
	t.pending--
	t.advance()
	return nil
}

// Ack records that Kafka acknowledged one record of transaction id.
// Acknowledgements may arrive in any order across transactions, and before
// the transaction's commit. It returns a [*TxnError] wrapping
// [ErrUnknownTxn] if Begin never assigned id, or [ErrTooManyAcks] if every
// record added to it so far is already acknowledged.
func (t *Tracker) Ack(id TxnID) error {
	if id == 0 || id >= t.nextID {
		return &TxnError{Op: "ack", ID: id, Err: ErrUnknownTxn}
	}
	if id < t.headID {
		// Only complete transactions leave the queue.
		return &TxnError{Op: "ack", ID: id, Err: ErrTooManyAcks}
	}
	tx := t.at(int(id - t.headID))
	if tx.acked >= tx.records {
		return &TxnError{Op: "ack", ID: id, Err: ErrTooManyAcks}
	}
	tx.acked++
	t.inFlight--
	if tx.acked == tx.records && id == t.headID {
		// Only completing the head transaction can extend the prefix;
		// skipping the scan otherwise keeps out-of-order acks O(1).
		t.advance()
	}
	return nil
}

// Fail marks the stream as failed because a record of transaction id failed
// for good. From then on the confirmed position never moves past the end of
// the contiguous prefix of complete transactions before id, whatever
// acknowledgements arrive later, and [Tracker.Idle] never moves it. If id
// was already confirmed, or was never assigned, confirmation stops where it
// is: the tracker cannot tell which transactions a bogus ID protects, so it
// protects them all. Failing again can only move the stop earlier.
func (t *Tracker) Fail(id TxnID) {
	at := id
	if id < t.headID || id >= t.nextID {
		at = t.headID
	}
	if !t.failed || at < t.failAt {
		t.failAt = at
	}
	t.failed = true
}

// Failed reports whether [Tracker.Fail] was called.
func (t *Tracker) Failed() bool { return t.failed }

// Idle offers a keepalive's server WAL end. The confirmed position jumps to
// walEnd only if no transaction is open or waiting for acknowledgements, the
// tracker has not failed and walEnd is after the confirmed position; Idle
// reports whether it moved. Confirming idle keepalives is what keeps an idle
// outbox from pinning WAL, and what lets a shutting-down server finish
// waiting for its walsenders.
func (t *Tracker) Idle(walEnd LSN) bool {
	if t.open || t.n > 0 || t.inFlight > 0 || t.failed || walEnd <= t.confirmed {
		return false
	}
	t.confirmed = walEnd
	return true
}

// Confirmed returns the highest LSN that is safe to send as the flush
// position: the commit end of the last transaction of the longest contiguous
// prefix, in commit order, of committed and fully acknowledged transactions,
// or the start or last idle position if that is later.
func (t *Tracker) Confirmed() LSN { return t.confirmed }

// InFlight returns the number of records added but not yet acknowledged,
// over all transactions.
func (t *Tracker) InFlight() int { return t.inFlight }

// Pending returns the number of committed or open transactions not yet
// confirmed.
func (t *Tracker) Pending() int { return t.pending }

// Open reports whether a transaction is open (begun and not yet committed or
// aborted).
func (t *Tracker) Open() bool { return t.open }

// advance pops complete transactions off the head of the queue, moving the
// confirmed position to the end of each committed one, until it meets an
// open or unacknowledged transaction or the failure stop.
func (t *Tracker) advance() {
	for t.n > 0 {
		if t.failed && t.headID >= t.failAt {
			return
		}
		tx := &t.buf[t.head]
		if tx.state == stateOpen || tx.acked < tx.records {
			return
		}
		if tx.state == stateCommitted {
			t.confirmed = tx.end
			t.pending--
		}
		*tx = txn{}
		t.head = (t.head + 1) & (len(t.buf) - 1)
		t.n--
		t.headID++
	}
}

// push appends tx at the tail of the queue, growing the ring when full.
func (t *Tracker) push(tx txn) {
	if t.n == len(t.buf) {
		t.grow()
	}
	t.buf[(t.head+t.n)&(len(t.buf)-1)] = tx
	t.n++
}

// grow doubles the ring, moving the queue to the start of the new slice.
func (t *Tracker) grow() {
	size := 2 * len(t.buf)
	if size < minQueue {
		size = minQueue
	}
	buf := make([]txn, size)
	for i := 0; i < t.n; i++ {
		buf[i] = *t.at(i)
	}
	t.buf = buf
	t.head = 0
}

// at returns the queued transaction i places from the head.
func (t *Tracker) at(i int) *txn {
	return &t.buf[(t.head+i)&(len(t.buf)-1)]
}

// tail returns the most recently begun transaction; the queue must not be
// empty.
func (t *Tracker) tail() *txn {
	return t.at(t.n - 1)
}
