package checkpoint

import "testing"

// BenchmarkTrackerTxn measures the relay's steady state: one transaction of
// ten records begun, committed and acknowledged per iteration.
func BenchmarkTrackerTxn(b *testing.B) {
	tr := New(0)
	var end LSN
	b.ReportAllocs()
	for b.Loop() {
		end += 0x100
		if err := trackTxn(tr, end, 10); err != nil {
			b.Fatal(err)
		}
	}
	if tr.Pending() != 0 {
		b.Fatalf("Pending = %d after the run, want 0", tr.Pending())
	}
}

// BenchmarkTrackerBacklog measures acks arriving out of order behind a
// backlog of 1024 committed transactions, as when one partition lags.
func BenchmarkTrackerBacklog(b *testing.B) {
	const backlog = 1024
	tr := New(0)
	var end LSN
	ids := make([]TxnID, backlog)
	b.ReportAllocs()
	for b.Loop() {
		for i := range ids {
			id, _ := tr.Begin()
			_ = tr.Add(1)
			end += 0x100
			_ = tr.Commit(end)
			ids[i] = id
		}
		for i := len(ids) - 1; i >= 0; i-- {
			if err := tr.Ack(ids[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	if tr.Confirmed() != end {
		b.Fatalf("Confirmed = %s after the run, want %s", tr.Confirmed(), end)
	}
}
