package checkpoint

import (
	"errors"
	"testing"
)

// modelTxn is one transaction as the model sees it.
type modelTxn struct {
	end       LSN
	records   int
	acked     int
	committed bool
	aborted   bool
}

func (tx modelTxn) complete() bool {
	return tx.aborted || (tx.committed && tx.acked == tx.records)
}

// model is a deliberately naive tracker: it keeps every transaction it ever
// saw and recomputes everything by scanning from the first one, so that its
// correctness can be checked by reading it. Only what cannot be derived
// from the transactions is stored: the start or last idle position, and the
// failure stop.
type model struct {
	base   LSN // start position, or the last idle WAL end adopted
	txns   []modelTxn
	failed bool
	failAt int // index of the first txn that may never be confirmed
}

// prefix returns how many leading transactions are complete and not behind
// the failure stop.
func (m *model) prefix() int {
	for i, tx := range m.txns {
		if (m.failed && i >= m.failAt) || !tx.complete() {
			return i
		}
	}
	return len(m.txns)
}

func (m *model) confirmed() LSN {
	c := m.base
	for _, tx := range m.txns[:m.prefix()] {
		if tx.committed && tx.end > c {
			c = tx.end
		}
	}
	return c
}

func (m *model) open() bool {
	if len(m.txns) == 0 {
		return false
	}
	last := m.txns[len(m.txns)-1]
	return !last.committed && !last.aborted
}

func (m *model) inFlight() int {
	n := 0
	for _, tx := range m.txns {
		n += tx.records - tx.acked
	}
	return n
}

func (m *model) pending() int {
	n := 0
	for _, tx := range m.txns[m.prefix():] {
		if !tx.aborted {
			n++
		}
	}
	return n
}

// lastEnd returns the highest commit end so far and whether there was one.
func (m *model) lastEnd() (LSN, bool) {
	var end LSN
	var any bool
	for _, tx := range m.txns {
		if tx.committed && (!any || tx.end > end) {
			end, any = tx.end, true
		}
	}
	return end, any
}

func (m *model) begin() (TxnID, error) {
	if m.open() {
		return 0, ErrTxnOpen
	}
	m.txns = append(m.txns, modelTxn{})
	return TxnID(len(m.txns)), nil
}

func (m *model) add(n int) error {
	if !m.open() {
		return ErrNoOpenTxn
	}
	if n < 1 {
		return ErrInvalidCount
	}
	m.txns[len(m.txns)-1].records += n
	return nil
}

func (m *model) commit(end LSN) error {
	if !m.open() {
		return ErrNoOpenTxn
	}
	last, any := m.lastEnd()
	if end < m.confirmed() || (any && end <= last) {
		return ErrLSNOrder
	}
	tx := &m.txns[len(m.txns)-1]
	tx.committed, tx.end = true, end
	return nil
}

func (m *model) abort() error {
	if !m.open() {
		return ErrNoOpenTxn
	}
	tx := &m.txns[len(m.txns)-1]
	if tx.acked < tx.records {
		return ErrInFlight
	}
	tx.aborted = true
	return nil
}

func (m *model) ack(id TxnID) error {
	if id == 0 || id > TxnID(len(m.txns)) {
		return ErrUnknownTxn
	}
	tx := &m.txns[id-1]
	if tx.acked >= tx.records {
		return ErrTooManyAcks
	}
	tx.acked++
	return nil
}

func (m *model) fail(id TxnID) {
	p := m.prefix()
	at := int(id) - 1
	if id == 0 || at >= len(m.txns) || at < p {
		// Already confirmed or never assigned: stop where we are.
		at = p
	}
	if !m.failed || at < m.failAt {
		m.failAt = at
	}
	m.failed = true
}

func (m *model) idle(walEnd LSN) bool {
	c := m.confirmed()
	if m.open() || m.inFlight() > 0 || m.prefix() < len(m.txns) || m.failed || walEnd <= c {
		return false
	}
	m.base = walEnd
	return true
}

// opReader hands out the fuzz input byte by byte, then zeros.
type opReader struct {
	data []byte
}

func (r *opReader) more() bool { return len(r.data) > 0 }

func (r *opReader) next() byte {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[0]
	r.data = r.data[1:]
	return b
}

// offset returns base moved by a small signed amount taken from the input,
// clamped at zero, so that generated LSNs land near the interesting bounds.
func offset(base LSN, b byte, below int) LSN {
	d := int64(b) - int64(below)
	if d < 0 && LSN(-d) > base {
		return 0
	}
	return LSN(int64(base) + d)
}

// maxFuzzOps bounds the bytes of fuzz input that are decoded.
const maxFuzzOps = 256

// FuzzTrackerMatchesModel decodes the input into a sequence of tracker
// operations, applies each to a Tracker and to the naive model, and checks
// after every operation that both agree on results, errors and state, and
// that the confirmed position never moves backwards.
func FuzzTrackerMatchesModel(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x10, 0, 3, 2, 5, 20, 7, 0, 7, 0})
	f.Add([]byte{1, 0, 3, 3, 5, 9, 0, 3, 1, 5, 9, 8, 1, 8, 0, 9, 0, 12, 40})
	f.Add([]byte{0, 0, 3, 1, 14, 3, 1, 0, 3, 2, 5, 30, 7, 1, 7, 0, 7, 0, 12, 50})
	f.Add([]byte{0, 13, 0, 3, 1, 13, 7, 0, 13, 0, 5, 20, 11, 1, 11, 9, 12, 10})
	f.Add([]byte{0x40, 0, 5, 2, 0, 3, 4, 5, 1, 12, 200, 0, 0, 3, 0, 5, 3, 6, 0})

	f.Fuzz(func(t *testing.T, data []byte) { checkAgainstModel(t, data) })
}

// checkAgainstModel runs the operations encoded in data on a Tracker and on
// the model and fails t at the first disagreement.
func checkAgainstModel(t testing.TB, data []byte) {
	t.Helper()
	// The model rescans every transaction on every step, so an input
	// costs time quadratic in its length, and the fuzzer's minimization
	// of a new input tries a number of candidates quadratic in its length
	// too. Long inputs stalled the workers for tens of seconds each while
	// 256 bytes already reach queues of 80 transactions, well past the
	// ring's first growth.
	if len(data) > maxFuzzOps {
		data = data[:maxFuzzOps]
	}
	r := &opReader{data: data}
	start := LSN(r.next()) * 16
	tr := New(start)
	m := &model{base: start}
	prev := start

	for step := 0; r.more(); step++ {
		var got, want error
		var desc string
		switch op := r.next() % 16; {
		case op <= 2:
			desc = "begin"
			gotID, gotErr := tr.Begin()
			wantID, wantErr := m.begin()
			if gotID != wantID {
				t.Fatalf("step %d: Begin = %d, model %d", step, gotID, wantID)
			}
			got, want = gotErr, wantErr
		case op <= 4:
			n := int(r.next()%8) - 1
			desc = "add"
			got, want = tr.Add(n), m.add(n)
		case op <= 6:
			// Commit near the larger of the last commit end and the
			// confirmed position, mostly after it.
			base := m.confirmed()
			if last, ok := m.lastEnd(); ok && last > base {
				base = last
			}
			end := offset(base, r.next(), 8)
			desc = "commit " + end.String()
			got, want = tr.Commit(end), m.commit(end)
		case op <= 10:
			// Ack a record that is really in flight, when there is one.
			var inFlight []TxnID
			for i, tx := range m.txns {
				if tx.acked < tx.records {
					inFlight = append(inFlight, TxnID(i+1))
				}
			}
			b := r.next()
			id := TxnID(int(b) % (len(m.txns) + 2))
			if len(inFlight) > 0 {
				id = inFlight[int(b)%len(inFlight)]
			}
			desc = "ack in flight"
			got, want = tr.Ack(id), m.ack(id)
		case op == 11:
			id := TxnID(int(r.next()) % (len(m.txns) + 2))
			desc = "ack any"
			got, want = tr.Ack(id), m.ack(id)
		case op == 12:
			walEnd := offset(m.confirmed(), r.next(), 4)
			desc = "idle " + walEnd.String()
			gotMoved, wantMoved := tr.Idle(walEnd), m.idle(walEnd)
			if gotMoved != wantMoved {
				t.Fatalf("step %d: Idle(%s) = %v, model %v", step, walEnd, gotMoved, wantMoved)
			}
		case op == 13:
			desc = "abort"
			got, want = tr.Abort(), m.abort()
		case op == 14:
			// Failing ends all progress, so keep it rare enough for
			// most inputs to explore the unfailed state for a while.
			b := r.next()
			if b < 0xE0 {
				desc = "no-op"
				break
			}
			id := TxnID(int(b) % (len(m.txns) + 2))
			desc = "fail"
			tr.Fail(id)
			m.fail(id)
		default:
			// A complete well-formed transaction in one step, so that
			// short inputs reach long queues.
			desc = "txn"
			n := int(r.next() % 4)
			ops := func(begin func() (TxnID, error), add func(int) error, commit func(LSN) error, end LSN) error {
				if _, err := begin(); err != nil {
					return err
				}
				if n > 0 {
					if err := add(n); err != nil {
						return err
					}
				}
				return commit(end)
			}
			base := m.confirmed()
			if last, ok := m.lastEnd(); ok && last > base {
				base = last
			}
			end := base + 1 + LSN(r.next()%32)
			got = ops(tr.Begin, tr.Add, tr.Commit, end)
			want = ops(m.begin, m.add, m.commit, end)
		}

		if (got == nil) != (want == nil) || (want != nil && !errors.Is(got, want)) {
			t.Fatalf("step %d (%s): error %v, model %v", step, desc, got, want)
		}
		c := tr.Confirmed()
		if wc := m.confirmed(); c != wc {
			t.Fatalf("step %d (%s): Confirmed = %s, model %s", step, desc, c, wc)
		}
		if c < prev {
			t.Fatalf("step %d (%s): Confirmed moved back from %s to %s", step, desc, prev, c)
		}
		prev = c
		if g, w := tr.InFlight(), m.inFlight(); g != w {
			t.Fatalf("step %d (%s): InFlight = %d, model %d", step, desc, g, w)
		}
		if g, w := tr.Pending(), m.pending(); g != w {
			t.Fatalf("step %d (%s): Pending = %d, model %d", step, desc, g, w)
		}
		if g, w := tr.Open(), m.open(); g != w {
			t.Fatalf("step %d (%s): Open = %v, model %v", step, desc, g, w)
		}
		if g, w := tr.Failed(), m.failed; g != w {
			t.Fatalf("step %d (%s): Failed = %v, model %v", step, desc, g, w)
		}
	}
}
