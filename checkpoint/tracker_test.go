package checkpoint

import (
	"errors"
	"testing"
)

// action is one call on a Tracker in a scripted test.
type action int

const (
	doBegin  action = iota // Begin; arg is the wanted ID, 0 for any
	doAdd                  // Add(int(arg))
	doCommit               // Commit(LSN(arg))
	doAbort                // Abort()
	doAck                  // Ack(TxnID(arg))
	doFail                 // Fail(TxnID(arg))
	doIdle                 // Idle(LSN(arg)); moved is the wanted result
)

// step is one scripted call and what must hold after it.
type step struct {
	do        action
	arg       uint64
	err       error // wanted error, matched with errors.Is; nil for none
	moved     bool  // wanted result of Idle
	confirmed LSN   // wanted Confirmed after the call
}

func (s step) run(t *testing.T, i int, tr *Tracker) {
	t.Helper()
	var err error
	switch s.do {
	case doBegin:
		var id TxnID
		id, err = tr.Begin()
		if err == nil && s.arg != 0 && id != TxnID(s.arg) {
			t.Fatalf("step %d: Begin = %d, want %d", i, id, s.arg)
		}
	case doAdd:
		err = tr.Add(int(s.arg))
	case doCommit:
		err = tr.Commit(LSN(s.arg))
	case doAbort:
		err = tr.Abort()
	case doAck:
		err = tr.Ack(TxnID(s.arg))
	case doFail:
		tr.Fail(TxnID(s.arg))
	case doIdle:
		if moved := tr.Idle(LSN(s.arg)); moved != s.moved {
			t.Fatalf("step %d: Idle(%s) = %v, want %v", i, LSN(s.arg), moved, s.moved)
		}
	}
	switch {
	case s.err == nil && err != nil:
		t.Fatalf("step %d: unexpected error: %v", i, err)
	case s.err != nil && !errors.Is(err, s.err):
		t.Fatalf("step %d: error = %v, want %v", i, err, s.err)
	}
	if got := tr.Confirmed(); got != s.confirmed {
		t.Fatalf("step %d: Confirmed = %s, want %s", i, got, s.confirmed)
	}
}

type script struct {
	name  string
	start LSN
	steps []step
}

func runScripts(t *testing.T, scripts []script) {
	t.Helper()
	for _, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) {
			tr := New(sc.start)
			for i, s := range sc.steps {
				s.run(t, i, tr)
			}
		})
	}
}

// txnSteps begins a transaction, adds records and commits it at end,
// leaving confirmed as it was (all records stay unacknowledged).
func txnSteps(id TxnID, records int, end, confirmed LSN) []step {
	s := []step{{do: doBegin, arg: uint64(id), confirmed: confirmed}}
	if records > 0 {
		s = append(s, step{do: doAdd, arg: uint64(records), confirmed: confirmed})
	}
	return append(s, step{do: doCommit, arg: uint64(end), confirmed: confirmed})
}

func join(parts ...[]step) []step {
	var all []step
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func TestConfirmsOnlyAfterEveryEarlierTxnIsAcked(t *testing.T) {
	three := join(
		txnSteps(1, 1, 0x100, 0x10),
		txnSteps(2, 2, 0x200, 0x10),
		txnSteps(3, 1, 0x300, 0x10),
	)
	runScripts(t, []script{
		{name: "acks in reverse order", start: 0x10, steps: join(three, []step{
			{do: doAck, arg: 3, confirmed: 0x10},
			{do: doAck, arg: 2, confirmed: 0x10},
			{do: doAck, arg: 2, confirmed: 0x10},
			{do: doAck, arg: 1, confirmed: 0x300},
		})},
		{name: "acks in commit order", start: 0x10, steps: join(three, []step{
			{do: doAck, arg: 1, confirmed: 0x100},
			{do: doAck, arg: 2, confirmed: 0x100},
			{do: doAck, arg: 2, confirmed: 0x200},
			{do: doAck, arg: 3, confirmed: 0x300},
		})},
		{name: "a gap in the middle holds back later txns", start: 0x10, steps: join(three, []step{
			{do: doAck, arg: 1, confirmed: 0x100},
			{do: doAck, arg: 3, confirmed: 0x100},
			{do: doAck, arg: 2, confirmed: 0x100},
			{do: doAck, arg: 2, confirmed: 0x300},
		})},
	})
}

func TestOpenTxnBlocksItsOwnConfirmation(t *testing.T) {
	runScripts(t, []script{
		{name: "acks before commit count", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAdd, arg: 2},
			{do: doAck, arg: 1},
			{do: doAck, arg: 1},
			{do: doCommit, arg: 0x500, confirmed: 0x500},
		}},
		{name: "records added after early acks keep it pending", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAdd, arg: 1},
			{do: doAck, arg: 1},
			{do: doAdd, arg: 1},
			{do: doCommit, arg: 0x500},
			{do: doAck, arg: 1, confirmed: 0x500},
		}},
		{name: "earlier txn confirms while a later one is open", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doBegin, arg: 2},
				{do: doAdd, arg: 1},
				{do: doAck, arg: 2},
				{do: doAck, arg: 1, confirmed: 0x100},
				{do: doCommit, arg: 0x200, confirmed: 0x200},
			},
		)},
	})
}

func TestEmptyTxnIsCompleteAtCommit(t *testing.T) {
	runScripts(t, []script{
		{name: "alone", start: 0x10, steps: []step{
			{do: doBegin, arg: 1, confirmed: 0x10},
			{do: doCommit, arg: 0x20, confirmed: 0x20},
		}},
		{name: "behind an unacked txn", steps: join(
			txnSteps(1, 1, 0x100, 0),
			txnSteps(2, 0, 0x200, 0),
			[]step{{do: doAck, arg: 1, confirmed: 0x200}},
		)},
		{name: "commit at the start position", start: 0x20, steps: []step{
			{do: doBegin, arg: 1, confirmed: 0x20},
			{do: doCommit, arg: 0x20, confirmed: 0x20},
		}},
	})
}

func TestAbortDiscardsOpenTxn(t *testing.T) {
	runScripts(t, []script{
		{name: "empty txn", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAbort},
			{do: doBegin, arg: 2},
			{do: doCommit, arg: 0x100, confirmed: 0x100},
		}},
		{name: "txn whose records are all acked", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAdd, arg: 1},
			{do: doAck, arg: 1},
			{do: doAbort},
			{do: doAck, arg: 1, err: ErrTooManyAcks},
		}},
		{name: "aborted txn behind a pending one is skipped", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doBegin, arg: 2},
				{do: doAbort},
				{do: doAck, arg: 2, err: ErrTooManyAcks},
			},
			txnSteps(3, 1, 0x300, 0),
			[]step{
				{do: doAck, arg: 3},
				{do: doAck, arg: 1, confirmed: 0x300},
			},
		)},
		{name: "abort with records in flight is refused", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAdd, arg: 2},
			{do: doAck, arg: 1},
			{do: doAbort, err: ErrInFlight},
			{do: doAck, arg: 1},
			{do: doCommit, arg: 0x100, confirmed: 0x100},
		}},
	})
}

func TestIdleMovesOnlyWhenNothingIsPending(t *testing.T) {
	runScripts(t, []script{
		{name: "fresh tracker", start: 0x10, steps: []step{
			{do: doIdle, arg: 0x50, moved: true, confirmed: 0x50},
			{do: doIdle, arg: 0x60, moved: true, confirmed: 0x60},
		}},
		{name: "never backwards", start: 0x10, steps: []step{
			{do: doIdle, arg: 0x10, confirmed: 0x10},
			{do: doIdle, arg: 0x5, confirmed: 0x10},
		}},
		{name: "after every txn is confirmed", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doAck, arg: 1, confirmed: 0x100},
				{do: doIdle, arg: 0x180, moved: true, confirmed: 0x180},
			},
		)},
		{name: "later commits must not go below the idle position", steps: []step{
			{do: doIdle, arg: 0x100, moved: true, confirmed: 0x100},
			{do: doBegin, arg: 1, confirmed: 0x100},
			{do: doCommit, arg: 0x80, err: ErrLSNOrder, confirmed: 0x100},
			{do: doCommit, arg: 0x100, confirmed: 0x100},
		}},
	})
}

func TestIdleDoesNotMoveWithTxnInFlight(t *testing.T) {
	runScripts(t, []script{
		{name: "open empty txn", steps: []step{
			{do: doBegin, arg: 1},
			{do: doIdle, arg: 0x100},
		}},
		{name: "open txn with acked records", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAdd, arg: 1},
			{do: doAck, arg: 1},
			{do: doIdle, arg: 0x100},
		}},
		{name: "committed txn with records in flight", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doIdle, arg: 0x200},
				{do: doAck, arg: 1, confirmed: 0x100},
				{do: doIdle, arg: 0x200, moved: true, confirmed: 0x200},
			},
		)},
		{name: "later txn acked, earlier one not", steps: join(
			txnSteps(1, 1, 0x100, 0),
			txnSteps(2, 1, 0x200, 0),
			[]step{
				{do: doAck, arg: 2},
				{do: doIdle, arg: 0x300},
			},
		)},
	})
}

func TestFailStopsConfirmation(t *testing.T) {
	three := join(
		txnSteps(1, 1, 0x100, 0),
		txnSteps(2, 2, 0x200, 0),
		txnSteps(3, 1, 0x300, 0),
	)
	runScripts(t, []script{
		{name: "later acks do not pass the failed txn", steps: join(three, []step{
			{do: doFail, arg: 2},
			{do: doAck, arg: 3},
			{do: doAck, arg: 2},
			{do: doAck, arg: 1, confirmed: 0x100},
			{do: doAck, arg: 2, confirmed: 0x100},
			{do: doIdle, arg: 0x400, confirmed: 0x100},
		})},
		{name: "failing the first txn freezes at start", start: 0x10, steps: join(
			txnSteps(1, 1, 0x100, 0x10),
			[]step{
				{do: doFail, arg: 1, confirmed: 0x10},
				{do: doAck, arg: 1, confirmed: 0x10},
			},
		)},
		{name: "a later fail does not lift an earlier one", steps: join(three, []step{
			{do: doFail, arg: 2},
			{do: doFail, arg: 3},
			{do: doAck, arg: 1, confirmed: 0x100},
			{do: doAck, arg: 2, confirmed: 0x100},
			{do: doAck, arg: 2, confirmed: 0x100},
			{do: doAck, arg: 3, confirmed: 0x100},
		})},
		{name: "an earlier fail moves the stop back", steps: join(three, []step{
			{do: doFail, arg: 3},
			{do: doFail, arg: 1},
			{do: doAck, arg: 1},
			{do: doAck, arg: 2},
			{do: doAck, arg: 2},
		})},
		{name: "failing a confirmed txn freezes where it is", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{{do: doAck, arg: 1, confirmed: 0x100}},
			txnSteps(2, 1, 0x200, 0x100),
			[]step{
				{do: doFail, arg: 1, confirmed: 0x100},
				{do: doAck, arg: 2, confirmed: 0x100},
			},
		)},
		{name: "failing an unknown txn freezes where it is", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doFail, arg: 9},
				{do: doAck, arg: 1},
				{do: doIdle, arg: 0x200},
			},
		)},
		{name: "failing the open txn", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doBegin, arg: 2},
				{do: doAdd, arg: 1},
				{do: doFail, arg: 2},
				{do: doAck, arg: 2},
				{do: doCommit, arg: 0x200},
				{do: doAck, arg: 1, confirmed: 0x100},
			},
		)},
	})
}

func TestRejectsMisuse(t *testing.T) {
	runScripts(t, []script{
		{name: "begin while open", steps: []step{
			{do: doBegin, arg: 1},
			{do: doBegin, err: ErrTxnOpen},
			{do: doCommit, arg: 0x10, confirmed: 0x10},
			{do: doBegin, arg: 2, confirmed: 0x10},
		}},
		{name: "add without open txn", steps: []step{
			{do: doAdd, arg: 1, err: ErrNoOpenTxn},
		}},
		{name: "add zero records", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAdd, arg: 0, err: ErrInvalidCount},
		}},
		{name: "commit without open txn", steps: []step{
			{do: doCommit, arg: 0x10, err: ErrNoOpenTxn},
		}},
		{name: "abort without open txn", steps: []step{
			{do: doAbort, err: ErrNoOpenTxn},
		}},
		{name: "commit end equal to previous", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doBegin, arg: 2},
				{do: doCommit, arg: 0x100, err: ErrLSNOrder},
				{do: doCommit, arg: 0x101},
			},
		)},
		{name: "commit end below previous", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doBegin, arg: 2},
				{do: doCommit, arg: 0x50, err: ErrLSNOrder},
			},
		)},
		{name: "commit end below start", start: 0x100, steps: []step{
			{do: doBegin, arg: 1, confirmed: 0x100},
			{do: doCommit, arg: 0xff, err: ErrLSNOrder, confirmed: 0x100},
		}},
		{name: "ack of txn zero", steps: []step{
			{do: doAck, arg: 0, err: ErrUnknownTxn},
		}},
		{name: "ack of an ID never assigned", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAck, arg: 2, err: ErrUnknownTxn},
		}},
		{name: "more acks than records", steps: join(
			txnSteps(1, 1, 0x100, 0),
			txnSteps(2, 1, 0x200, 0),
			[]step{
				{do: doAck, arg: 2},
				{do: doAck, arg: 2, err: ErrTooManyAcks},
			},
		)},
		{name: "ack of an empty open txn", steps: []step{
			{do: doBegin, arg: 1},
			{do: doAck, arg: 1, err: ErrTooManyAcks},
		}},
		{name: "ack of a confirmed txn", steps: join(
			txnSteps(1, 1, 0x100, 0),
			[]step{
				{do: doAck, arg: 1, confirmed: 0x100},
				{do: doAck, arg: 1, err: ErrTooManyAcks, confirmed: 0x100},
			},
		)},
	})
}

func TestCountsInFlightAndPending(t *testing.T) {
	tr := New(0)
	check := func(inFlight, pending int, open bool) {
		t.Helper()
		if got := tr.InFlight(); got != inFlight {
			t.Fatalf("InFlight = %d, want %d", got, inFlight)
		}
		if got := tr.Pending(); got != pending {
			t.Fatalf("Pending = %d, want %d", got, pending)
		}
		if got := tr.Open(); got != open {
			t.Fatalf("Open = %v, want %v", got, open)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	check(0, 0, false)
	id1, _ := tr.Begin()
	check(0, 1, true)
	must(tr.Add(3))
	check(3, 1, true)
	must(tr.Commit(0x100))
	check(3, 1, false)
	id2, _ := tr.Begin()
	must(tr.Add(2))
	check(5, 2, true)
	must(tr.Ack(id2))
	check(4, 2, true)
	if err := tr.Abort(); !errors.Is(err, ErrInFlight) {
		t.Fatalf("Abort with a record in flight: %v, want ErrInFlight", err)
	}
	check(4, 2, true)
	must(tr.Ack(id2))
	check(3, 2, true)
	must(tr.Abort())
	check(3, 1, false)
	for range 3 {
		must(tr.Ack(id1))
	}
	check(0, 0, false)
	if got := tr.Confirmed(); got != 0x100 {
		t.Fatalf("Confirmed = %s, want 0/100", got)
	}
	if tr.Failed() {
		t.Fatal("Failed before Fail")
	}
	tr.Fail(id1)
	if !tr.Failed() {
		t.Fatal("not Failed after Fail")
	}
}

// TestQueueGrowsPastInitialCapacity keeps many more transactions pending
// than the initial ring holds, with the head in the middle of the ring when
// it grows, and checks that IDs still find their transactions.
func TestQueueGrowsPastInitialCapacity(t *testing.T) {
	tr := New(0)
	var end LSN
	commit := func(records int) TxnID {
		t.Helper()
		id, err := tr.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Add(records); err != nil {
			t.Fatal(err)
		}
		end += 0x10
		if err := tr.Commit(end); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// Move the head off slot 0 first.
	for range 5 {
		id := commit(1)
		if err := tr.Ack(id); err != nil {
			t.Fatal(err)
		}
	}
	var ids []TxnID
	for i := range 1000 {
		ids = append(ids, commit(1+i%3))
	}
	// Ack newest first so nothing confirms until the oldest is done.
	for i := len(ids) - 1; i >= 0; i-- {
		for range 1 + i%3 {
			if err := tr.Ack(ids[i]); err != nil {
				t.Fatalf("ack %d: %v", ids[i], err)
			}
		}
		want := LSN(0x50)
		if i == 0 {
			want = end
		}
		if got := tr.Confirmed(); got != want {
			t.Fatalf("after acking %d: Confirmed = %s, want %s", ids[i], got, want)
		}
	}
	if tr.Pending() != 0 || tr.InFlight() != 0 {
		t.Fatalf("Pending = %d, InFlight = %d, want 0, 0", tr.Pending(), tr.InFlight())
	}
}

func TestLSNStringMatchesPostgreSQL(t *testing.T) {
	for _, tc := range []struct {
		lsn  LSN
		want string
	}{
		{0, "0/0"},
		{0x16B374D848, "16/B374D848"},
		{0x1000000, "0/1000000"},
		{1 << 32, "1/0"},
		{^LSN(0), "FFFFFFFF/FFFFFFFF"},
	} {
		if got := tc.lsn.String(); got != tc.want {
			t.Errorf("LSN(%#x).String() = %q, want %q", uint64(tc.lsn), got, tc.want)
		}
	}
}

func TestErrorsCarryTheirData(t *testing.T) {
	tr := New(0x10)
	if _, err := tr.Begin(); err != nil {
		t.Fatal(err)
	}
	err := tr.Commit(0x5)
	var order *LSNOrderError
	if !errors.As(err, &order) {
		t.Fatalf("Commit error %T is not *LSNOrderError", err)
	}
	if order.End != 0x5 || order.Confirmed != 0x10 || order.LastCommit != 0 {
		t.Fatalf("LSNOrderError = %+v", *order)
	}
	if want := "checkpoint: commit end 0/5 out of order: last commit end 0/0, confirmed 0/10"; err.Error() != want {
		t.Fatalf("error text = %q, want %q", err.Error(), want)
	}

	err = tr.Ack(7)
	var txnErr *TxnError
	if !errors.As(err, &txnErr) {
		t.Fatalf("Ack error %T is not *TxnError", err)
	}
	if txnErr.Op != "ack" || txnErr.ID != 7 || txnErr.Err != ErrUnknownTxn {
		t.Fatalf("TxnError = %+v", *txnErr)
	}
	if want := "checkpoint: ack txn 7: unknown transaction"; err.Error() != want {
		t.Fatalf("error text = %q, want %q", err.Error(), want)
	}

	for _, s := range []error{ErrTxnOpen, ErrNoOpenTxn, ErrInvalidCount, ErrLSNOrder, ErrInFlight, ErrUnknownTxn, ErrTooManyAcks} {
		if msg := s.Error(); len(msg) < len("checkpoint: ") || msg[:len("checkpoint: ")] != "checkpoint: " {
			t.Errorf("sentinel %q lacks the package prefix", msg)
		}
	}
}

// trackTxn runs one transaction of records records through tr the way the
// relay does in steady state: begin, add, commit, then one ack per record.
func trackTxn(tr *Tracker, end LSN, records int) error {
	id, err := tr.Begin()
	if err != nil {
		return err
	}
	if err := tr.Add(records); err != nil {
		return err
	}
	if err := tr.Commit(end); err != nil {
		return err
	}
	for range records {
		if err := tr.Ack(id); err != nil {
			return err
		}
	}
	return nil
}

func TestTrackerSteadyStateAllocatesNothing(t *testing.T) {
	tr := New(0)
	var end LSN
	// Warm up: keep a backlog of pending transactions so the ring grows
	// to its working size before measuring.
	var backlog []TxnID
	for range 64 {
		id, _ := tr.Begin()
		_ = tr.Add(1)
		end += 0x100
		_ = tr.Commit(end)
		backlog = append(backlog, id)
	}
	for _, id := range backlog {
		if err := tr.Ack(id); err != nil {
			t.Fatal(err)
		}
	}
	var failed error
	allocs := testing.AllocsPerRun(1000, func() {
		end += 0x100
		if err := trackTxn(tr, end, 10); err != nil {
			failed = err
		}
		// An out-of-order pair: the later txn is acked first.
		id1, _ := tr.Begin()
		_ = tr.Add(1)
		end += 0x100
		_ = tr.Commit(end)
		id2, _ := tr.Begin()
		_ = tr.Add(1)
		end += 0x100
		_ = tr.Commit(end)
		_ = tr.Ack(id2)
		_ = tr.Ack(id1)
		tr.Idle(end + 1)
		end++
	})
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs != 0 {
		t.Fatalf("steady state allocates %.1f times per run, want 0", allocs)
	}
	if tr.Confirmed() != end || tr.Pending() != 0 {
		t.Fatalf("Confirmed = %s, Pending = %d after run; want %s, 0", tr.Confirmed(), tr.Pending(), end)
	}
}
