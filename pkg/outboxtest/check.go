package outboxtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
)

// Delivered is one record read back from Kafka.
type Delivered struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	ID        string    // the "id" header
	Timestamp time.Time // the record timestamp (pgoutbox sets the routing time)
}

// Restart describes one (re)start of a relay session: the slot's confirmed
// position it started from and the time it started (records carry their
// routing time, so each delivery belongs to the last session started at or
// before it). A record delivered again after a restart is explained only
// if its transaction ended after the restart's Confirmed position.
type Restart struct {
	Confirmed checkpoint.LSN
	At        time.Time
}

// Report is the checker's verdict.
type Report struct {
	Written     int // committed events
	Verified    int // committed events delivered with the right topic, key, value
	Missing     []string
	Unexpected  []string // rolled back or never written
	Mismatched  []string // wrong topic, key or value
	OutOfOrder  []string // per key, first deliveries not in commit order
	Duplicates  int      // deliveries beyond the first
	Unexplained []string // duplicates no restart explains
}

// OK reports whether nothing is missing, unexpected, mismatched, out of
// order or unexplained.
func (r Report) OK() bool {
	return len(r.Missing)+len(r.Unexpected)+len(r.Mismatched)+len(r.OutOfOrder)+len(r.Unexplained) == 0
}

func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "written %d, verified %d, missing %d, unexpected %d, mismatched %d, out of order %d, duplicates %d (unexplained %d)",
		r.Written, r.Verified, len(r.Missing), len(r.Unexpected), len(r.Mismatched), len(r.OutOfOrder), r.Duplicates, len(r.Unexplained))
	for _, l := range []struct {
		name string
		ids  []string
	}{{"missing", r.Missing}, {"unexpected", r.Unexpected}, {"mismatched", r.Mismatched}, {"out of order", r.OutOfOrder}, {"unexplained", r.Unexplained}} {
		if len(l.ids) > 0 {
			n := min(len(l.ids), 5)
			fmt.Fprintf(&b, "\n  %s (first %d): %s", l.name, n, strings.Join(l.ids[:n], "; "))
		}
	}
	return b.String()
}

// Check verifies delivered against the writer's record. restarts may be nil
// when the relay was never restarted; then any duplicate is unexplained.
func Check(committed []Event, rolledBack map[string]Event, delivered []Delivered, restarts []Restart) Report {
	rep := Report{Written: len(committed)}
	byID := make(map[string]*Event, len(committed))
	for i := range committed {
		byID[committed[i].ID] = &committed[i]
	}
	sorted := append([]Delivered(nil), delivered...)
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	first := map[string]Delivered{}
	firstOrder := map[string][]*Event{} // topic and key → events in first-delivery order
	for _, d := range sorted {
		e, ok := byID[d.ID]
		if !ok {
			if _, rb := rolledBack[d.ID]; rb {
				rep.Unexpected = append(rep.Unexpected, "rolled back "+d.ID)
			} else {
				rep.Unexpected = append(rep.Unexpected, fmt.Sprintf("unknown id %q at %s/%d@%d", d.ID, d.Topic, d.Partition, d.Offset))
			}
			continue
		}
		if f, seen := first[d.ID]; seen {
			rep.Duplicates++
			if !explained(e, f, d, restarts) {
				rep.Unexplained = append(rep.Unexplained, fmt.Sprintf("%s delivered at %s/%d@%d and @%d (txn LSN (%s, %s])", d.ID, d.Topic, d.Partition, f.Offset, d.Offset, e.TxnLow, e.TxnHigh))
			}
			continue
		}
		first[d.ID] = d
		if d.Topic != e.Topic() || string(d.Key) != e.AggregateID || !sameJSON(d.Value, []byte(e.Payload)) {
			rep.Mismatched = append(rep.Mismatched, fmt.Sprintf("%s: got topic %q key %q value %s; want %q %q %s", e.ID, d.Topic, d.Key, d.Value, e.Topic(), e.AggregateID, e.Payload))
			continue
		}
		rep.Verified++
		// Kafka orders records per partition, so order is per topic and key.
		k := e.Topic() + " " + e.AggregateID
		firstOrder[k] = append(firstOrder[k], e)
	}
	for i := range committed {
		if _, ok := first[committed[i].ID]; !ok {
			rep.Missing = append(rep.Missing, committed[i].ID)
		}
	}
	keys := make([]string, 0, len(firstOrder))
	for k := range firstOrder {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		evs := firstOrder[k]
		for i := 1; i < len(evs); i++ {
			if evs[i].Seq < evs[i-1].Seq {
				rep.OutOfOrder = append(rep.OutOfOrder, fmt.Sprintf("key %s: %s (seq %d) delivered after %s (seq %d)", k, evs[i].ID, evs[i].Seq, evs[i-1].ID, evs[i-1].Seq))
			}
		}
	}
	return rep
}

// explained reports whether a redelivery of e (first at f, again at d) is
// covered by a restart between the two whose confirmed position had not
// reached e's transaction.
func explained(e *Event, f, d Delivered, restarts []Restart) bool {
	// By time: the session that delivered d again must have started after
	// f was routed, from a position before e's commit.
	var last *Restart
	for i := range restarts {
		r := &restarts[i]
		if !r.At.IsZero() && !r.At.Truncate(time.Millisecond).After(d.Timestamp) {
			if last == nil || r.At.After(last.At) {
				last = r
			}
		}
	}
	return last != nil && !d.Timestamp.IsZero() && last.At.Truncate(time.Millisecond).After(f.Timestamp) &&
		e.TxnHigh > last.Confirmed
}

func sameJSON(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
