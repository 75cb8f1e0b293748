package router

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
	"unicode/utf8"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// testNow is the processing time passed to Route in tests.
var testNow = time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)

const eventID = "406c07f3-26f0-4eea-a50c-109940064b8f"

// outbox returns the contract's worked-example row on the default outbox
// table, changed by mods.
func outbox(mods ...func(*Row)) *Row {
	r := &Row{
		Table: "public.outbox",
		Op:    OpInsert,
		Names: []string{"id", "aggregatetype", "aggregateid", "type", "payload"},
		Types: []uint32{2950, 1043, 1043, 1043, 3802},
		Values: [][]byte{
			[]byte(eventID),
			[]byte("Order"),
			[]byte("1"),
			[]byte("OrderCreated"),
			[]byte(`{"total":12}`),
		},
	}
	for _, m := range mods {
		m(r)
	}
	return r
}

// set replaces column name's type and value, or appends the column. A nil
// value is SQL NULL.
func set(name string, oid uint32, value any) func(*Row) {
	return func(r *Row) {
		var v []byte
		switch x := value.(type) {
		case nil:
		case string:
			v = []byte(x)
		case []byte:
			v = x
		default:
			panic("bad test value")
		}
		if i := slices.Index(r.Names, name); i >= 0 {
			r.Types[i], r.Values[i] = oid, v
			return
		}
		r.Names = append(r.Names, name)
		r.Types = append(r.Types, oid)
		r.Values = append(r.Values, v)
	}
}

// val replaces column name's value, keeping its type.
func val(name string, value any) func(*Row) {
	return func(r *Row) {
		set(name, r.Types[slices.Index(r.Names, name)], value)(r)
	}
}

// del removes column name.
func del(name string) func(*Row) {
	return func(r *Row) {
		i := slices.Index(r.Names, name)
		r.Names = slices.Delete(r.Names, i, i+1)
		r.Types = slices.Delete(r.Types, i, i+1)
		r.Values = slices.Delete(r.Values, i, i+1)
	}
}

func op(o Op) func(*Row) { return func(r *Row) { r.Op = o } }

// opts returns DefaultOptions changed by Set calls (name, value pairs).
func opts(t testing.TB, kv ...string) Options {
	t.Helper()
	o := DefaultOptions()
	for i := 0; i < len(kv); i += 2 {
		if err := o.Set(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// goldenResult is what a golden file holds for one Route call.
type goldenResult struct {
	Action string        `json:"action,omitempty"`
	Record *goldenRecord `json:"record,omitempty"`
	Error  *goldenError  `json:"error,omitempty"`
}

type goldenRecord struct {
	Topic     string         `json:"topic"`
	Key       any            `json:"key"`
	Value     any            `json:"value"`
	Headers   []goldenHeader `json:"headers"`
	Partition int32          `json:"partition"`
	Timestamp string         `json:"timestamp"`
	EventID   any            `json:"eventID"`
	Reason    string         `json:"reason,omitempty"`
}

type goldenHeader struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

type goldenError struct {
	Class   string `json:"class"`
	Table   string `json:"table"`
	Column  string `json:"column"`
	EventID string `json:"eventID"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// goldenBytes shows bytes as null (nil), a string (UTF-8) or {"hex": ...}.
// An empty non-nil slice is "" so that it differs from a tombstone's null.
func goldenBytes(b []byte) any {
	switch {
	case b == nil:
		return nil
	case utf8.Valid(b):
		return string(b)
	}
	return map[string]string{"hex": hex.EncodeToString(b)}
}

func toGolden(a Action, rec *Record, err error) goldenResult {
	if err != nil {
		g := &goldenError{Message: err.Error()}
		var re *RowError
		if errors.As(err, &re) {
			g.Class, g.Table, g.Column, g.EventID, g.Reason = re.Err.Error(), re.Table, re.Column, re.EventID, re.Reason
		}
		return goldenResult{Error: g}
	}
	g := &goldenRecord{
		Topic:     rec.Topic,
		Key:       goldenBytes(rec.Key),
		Value:     goldenBytes(rec.Value),
		Headers:   []goldenHeader{},
		Partition: rec.Partition,
		EventID:   goldenBytes(rec.EventID),
		Reason:    rec.Reason,
	}
	if !rec.Timestamp.IsZero() {
		g.Timestamp = rec.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	for _, h := range rec.Headers {
		g.Headers = append(g.Headers, goldenHeader{Key: h.Key, Value: goldenBytes(h.Value)})
	}
	return goldenResult{Action: a.String(), Record: g}
}

// checkGolden compares got with testdata/golden/name.json, or rewrites the
// file with -update.
func checkGolden(t *testing.T, name string, got goldenResult) {
	t.Helper()
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", "golden", name+".json")
	if *update {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./router -update to create it)", err)
	}
	if !bytes.Equal(b, want) {
		t.Errorf("result differs from %s (go test ./router -update rewrites it)\n got: %s\nwant: %s", path, b, want)
	}
}
