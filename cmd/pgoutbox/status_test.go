package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/replication"
)

func TestStatusPrintsSlotAndPublicationAsTableAndJSON(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	// WAL after the slot's confirmed position: lag.
	f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), 'order', '1', 'created', '{}')`)
	env := f.environ(withPassword(t, f.dsn, ""))

	r := invoke(cmdStatus, []string{"--format", "json"}, env)
	if r.code != exitOK {
		t.Fatalf("want exit 0:\n%s", r)
	}
	assertNoSecret(t, r)
	var st struct {
		Server struct {
			Address       string `json:"address"`
			Database      string `json:"database"`
			User          string `json:"user"`
			Version       string `json:"version"`
			VersionNum    int    `json:"version_num"`
			InRecovery    bool   `json:"in_recovery"`
			CurrentWALLSN string `json:"current_wal_lsn"`
		} `json:"server"`
		Slot        map[string]any `json:"slot"`
		Publication struct {
			Name            string   `json:"name"`
			Exists          bool     `json:"exists"`
			PublishesInsert bool     `json:"publishes_insert"`
			AllTables       bool     `json:"all_tables"`
			Tables          []string `json:"tables"`
		} `json:"publication"`
		History  map[string]any `json:"history"`
		Problems []string       `json:"problems"`
	}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("stdout is not the status JSON: %v\n%s", err, r)
	}
	if !strings.HasPrefix(st.Server.Address, "127.0.0.1:") || !strings.HasPrefix(st.Server.Database, "db_") ||
		st.Server.User != "postgres" || st.Server.VersionNum < 140000 || st.Server.Version == "" ||
		st.Server.InRecovery || st.Server.CurrentWALLSN == "" {
		t.Errorf("server: %+v", st.Server)
	}
	wantKeys := []string{"name", "exists", "plugin", "slot_type", "database", "active", "active_pid",
		"confirmed_flush_lsn", "restart_lsn", "lag_bytes", "retained_wal_bytes", "wal_status", "safe_wal_size",
		"failover", "invalidation_reason"}
	if len(st.Slot) != len(wantKeys) {
		t.Errorf("slot has keys %v, want %v", st.Slot, wantKeys)
	}
	for _, k := range wantKeys {
		if _, ok := st.Slot[k]; !ok {
			t.Errorf("slot lacks %q: %v", k, st.Slot)
		}
	}
	var wantFailover any // null: PostgreSQL 17 added failover slots
	if st.Server.VersionNum >= 170000 {
		wantFailover = false
	}
	for k, want := range map[string]any{
		"name": f.slot, "exists": true, "plugin": "pgoutput", "slot_type": "logical",
		"database": st.Server.Database, "active": false, "active_pid": nil,
		"wal_status": "reserved", "safe_wal_size": nil, // max_slot_wal_keep_size = -1
		"invalidation_reason": nil, "failover": wantFailover,
	} {
		if st.Slot[k] != want {
			t.Errorf("slot.%s = %#v, want %#v", k, st.Slot[k], want)
		}
	}
	if lag, ok := st.Slot["lag_bytes"].(float64); !ok || lag <= 0 {
		t.Errorf("slot.lag_bytes = %#v, want > 0 after an insert", st.Slot["lag_bytes"])
	}
	for _, k := range []string{"confirmed_flush_lsn", "restart_lsn"} {
		if s, ok := st.Slot[k].(string); !ok || !strings.Contains(s, "/") {
			t.Errorf("slot.%s = %#v, want an LSN", k, st.Slot[k])
		}
	}
	p := st.Publication
	if p.Name != f.publication || !p.Exists || !p.PublishesInsert || p.AllTables || len(p.Tables) != 1 || p.Tables[0] != "public.outbox" {
		t.Errorf("publication: %+v", p)
	}

	r = invoke(cmdStatus, nil, env)
	if r.code != exitOK {
		t.Fatalf("want exit 0:\n%s", r)
	}
	assertNoSecret(t, r)
	for _, re := range []string{
		`^server$`,
		`^  address +127\.0\.0\.1:\d+$`,
		`^  version +1\d`,
		`^slot$`,
		`^  name +` + f.slot + `$`,
		`^  exists +true$`,
		`^  plugin +pgoutput$`,
		`^  active +false$`,
		`^  active_pid +-$`,
		`^  confirmed_flush_lsn +[0-9A-F]+/[0-9A-F]+$`,
		`^  lag_bytes +\d+`,
		`^  wal_status +reserved$`,
		`^  safe_wal_size +unlimited$`,
		`^  failover +(false|-)$`,
		`^  invalidation_reason +-$`,
		`^publication$`,
		`^  name +` + f.publication + `$`,
		`^  publishes_insert +true$`,
		`^  all_tables +false$`,
		`^  tables +public\.outbox$`,
	} {
		wantLine(t, r, re)
	}
	// Aligned: every value of a section starts in the same column.
	col := -1
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if !strings.HasPrefix(line, "  ") {
			continue
		}
		key := strings.Fields(line)[0]
		at := strings.Index(line[2+len(key):], strings.Fields(line[2+len(key):])[0]) + 2 + len(key)
		if col < 0 {
			col = at
		}
		if at != col {
			t.Fatalf("values not aligned at column %d: %q\n%s", col, line, r)
		}
	}
}

func TestStatusOfMissingSlotExits1(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, format := range []string{"table", "json"} {
		r := invoke(cmdStatus, []string{"--format", format}, f.environ(f.dsn))
		if r.code != exitRuntime {
			t.Fatalf("%s: want exit 1:\n%s", format, r)
		}
		wantLine(t, r, fmt.Sprintf(`^pgoutbox: replication slot "%s" does not exist on 127\.0\.0\.1:\d+/db_\w+ as postgres`, f.slot))
		if format == "json" {
			var st statusReport
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Slot.Exists || st.Slot.Name != f.slot || st.Publication.Exists {
				t.Fatalf("JSON %+v, %v:\n%s", st, err, r)
			}
			if !strings.Contains(r.stdout, `"plugin": null`) {
				t.Fatalf("a missing slot's fields are null:\n%s", r)
			}
		} else {
			wantLine(t, r, `^  exists +false$`)
		}
	}
}

func TestStatusUnreachableExits3WithOneLineAndNoPassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:" + testSecret + "@127.0.0.1:1/appdb?connect_timeout=5",
		"host=127.0.0.1 port=1 user=app dbname=appdb password=" + testSecret,
	} {
		r := invoke(cmdStatus, nil, []string{"PGOUTBOX_POSTGRES_DSN=" + dsn})
		if r.code != exitStartup {
			t.Fatalf("want exit 3:\n%s", r)
		}
		assertNoSecret(t, r)
		if r.stdout != "" || strings.Count(r.stderr, "\n") != 1 ||
			!strings.HasPrefix(r.stderr, "pgoutbox: replication: connect to PostgreSQL at 127.0.0.1:1/appdb as app: 127.0.0.1:1 (127.0.0.1): dial error: ") || !strings.Contains(r.stderr, "check that PostgreSQL runs and listens on 127.0.0.1:1") ||
			strings.Count(r.stderr, "connection refused") != 1 {
			t.Fatalf("want one line on stderr:\n%s", r)
		}
	}
	r := invoke(cmdStatus, nil, []string{"PGOUTBOX_POSTGRES_DSN=postgres://app:" + testSecret + "@127.0.0.1:notaport/appdb"})
	assertNoSecret(t, r)
	if r.code != exitConfig || !strings.Contains(r.stderr, "not a valid connection string") {
		t.Fatalf("unparsable DSN: want exit 2:\n%s", r)
	}
}

func TestStatusBadFlagsExit2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--format", "yaml", "--dsn", "postgres://x@127.0.0.1:1/db"},
		{"--slot", "Bad-Name", "--dsn", "postgres://x@127.0.0.1:1/db"},
		{"--dsn", ""},
		{"extra"},
	} {
		if r := invoke(cmdStatus, args, nil); r.code != exitConfig {
			t.Errorf("%q: want exit 2:\n%s", args, r)
		}
	}
	if r := invoke(cmdStatus, []string{"--help"}, nil); r.code != exitOK || !strings.Contains(r.stderr, "--format") {
		t.Errorf("--help:\n%s", r)
	}
}

// The connection error itself, before any scrubbing, carries no password.
func TestStatusConnectErrorNamesTargetWithoutPassword(t *testing.T) {
	t.Parallel()
	rc := replication.DefaultConfig()
	rc.DSN = "postgres://app:" + testSecret + "@127.0.0.1:1/appdb?connect_timeout=5"
	_, target, err := connectPG(t.Context(), rc)
	var ce *replication.ConnectError
	if !errors.As(err, &ce) || ce.Refused() {
		t.Fatalf("want an unreachable *pgConnectError, got %v", err)
	}
	if target.String() != "127.0.0.1:1/appdb as app" {
		t.Errorf("target %q", target)
	}
	if strings.Contains(err.Error(), testSecret) || strings.Contains(fmt.Sprintf("%+v", err), testSecret) {
		t.Fatalf("error shows the password: %v", err)
	}
	rc.DSN = "postgres://app:" + testSecret + "@127.0.0.1:notaport/appdb"
	if _, _, err := connectPG(t.Context(), rc); !errors.Is(err, errBadDSN) {
		t.Fatalf("unparsable DSN: got %v", err)
	}
}

func TestStatusScrubsThePasswordFromOutput(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:" + testSecret + "@h/db",
		"host=h user=app password=" + testSecret,
		"postgres://app@h/db?password=" + testSecret,
	} {
		var b bytes.Buffer
		w := scrubSecrets(&b, dsn)
		fmt.Fprintf(w, "a %s b\n", testSecret)
		if b.String() != "a xxxxx b\n" {
			t.Errorf("%s: wrote %q", dsn, b.String())
		}
	}
	var b bytes.Buffer
	if w := scrubSecrets(&b, "postgres://app:pw@h/db"); w != &b {
		t.Error("a password shorter than 4 bytes is not scrubbed (it would garble the output)")
	}
}

func TestStatusByteCount(t *testing.T) {
	t.Parallel()
	n := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		in   *int64
		want string
	}{
		{nil, "-"},
		{n(0), "0"},
		{n(1023), "1023"},
		{n(1536), "1536 (1.5 KiB)"},
		{n(3 << 30), "3221225472 (3.0 GiB)"},
	} {
		if got := byteCount(c.in); got != c.want {
			t.Errorf("byteCount(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestStatusNamesWhatKeepsEventsFromBeingRelayed: a slot of another plugin
// and a row filter on the outbox table are problems status reports (and
// exits 1 for), where it used to print them as if all was well.
func TestStatusNamesWhatKeepsEventsFromBeingRelayed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR TABLE public.outbox WHERE (aggregatetype <> 'x') WITH (publish = 'insert')")
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", f.slot)
	r := invoke(cmdStatus, []string{"--format", "json"}, f.environ(f.dsn))
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	var st struct {
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r)
	}
	for _, want := range []string{`uses plugin "test_decoding"`, "row filter"} {
		found := false
		for _, p := range st.Problems {
			found = found || strings.Contains(p, want)
		}
		if !found {
			t.Errorf("no problem says %q: %q", want, st.Problems)
		}
	}
}
