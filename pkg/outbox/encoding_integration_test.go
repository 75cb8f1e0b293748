package outbox

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// In a database whose encoding is not UTF-8, a message's content must still
// reach the WAL as the UTF-8 JSON the relay reads: with client_encoding
// UTF8 (which lib/pq and JDBC always set, and pgx when the DSN says so) the
// text variant of pg_logical_emit_message converted it to LATIN1 first, and
// the relay then turned the key Müller into M\ufffdller (another partition)
// and sent the payload as LATIN1 bytes.
func TestMessageModeWritesUTF8InADatabaseOfAnotherEncoding(t *testing.T) {
	for _, drv := range drivers {
		for _, clientEncoding := range []string{"UTF8", "the database's"} {
			t.Run(drv.name+"/"+clientEncoding, func(t *testing.T) {
				testMessageModeWritesUTF8(t, drv, clientEncoding)
			})
		}
	}
}

func testMessageModeWritesUTF8(t *testing.T, drv dbDriver, clientEncoding string) {
	ctx := testContext(t)
	dsn := testenv.Require(t).NewDatabaseEncoded(t, "LATIN1")
	admin := connect(t, dsn)
	createOutboxTable(t, admin, "public.outbox")
	createSlot(t, admin, "public.outbox", "outbox_pub", "s")
	w := mustWriter(t, Config{Mode: ModeMessage})
	if clientEncoding == "UTF8" {
		dsn = withUTF8(t, dsn)
	}
	conn := drv.open(t, dsn)
	tx, err := conn.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev := Event{ID: "0192c0de-0000-7000-8000-000000000001", AggregateType: "Bestellung", AggregateID: "Müller", Type: "Größe", Payload: json.RawMessage(`{"n":"Ä"}`)}
	if _, err := tx.write(ctx, w, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := `{"id":"0192c0de-0000-7000-8000-000000000001","aggregatetype":"Bestellung","aggregateid":"Müller","type":"Größe","payload":{"n":"Ä"}}`
	var got []string
	for _, it := range peekWAL(t, admin, "s", "outbox_pub") {
		if it.Kind == 'M' {
			got = append(got, string(it.Content))
		}
	}
	if len(got) != 1 || got[0] != want || !utf8.ValidString(got[0]) {
		t.Fatalf("message contents in the WAL = %q, want the UTF-8 %q", got, want)
	}
}

// In a database whose encoding is not UTF-8, pgx takes the database's
// encoding as the session's client_encoding (it sets none), and the server
// read the UTF-8 text of a table-mode event as LATIN1: Müller was stored,
// and relayed, as MÃ¼ller. Write refuses such a connection, and the
// transaction fails; with client_encoding=UTF8 in the DSN the row holds
// what was written. WriteSQL, whose transaction does not show the setting,
// checks it in its INSERT.
func TestTableModeRefusesAConnectionThatWouldMisreadItsText(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) { testTableModeRefusesMisreadText(t, drv) })
	}
}

func testTableModeRefusesMisreadText(t *testing.T, drv dbDriver) {
	ctx := testContext(t)
	dsn := testenv.Require(t).NewDatabaseEncoded(t, "LATIN1")
	admin := connect(t, dsn)
	createOutboxTable(t, admin, "public.outbox")
	for _, mode := range []Mode{ModeTable, ModeTableDeleteAfterInsert} {
		w := mustWriter(t, Config{Mode: mode, AssumeSlot: true})
		ev := Event{ID: "0192c0de-0000-7000-8000-000000000002", AggregateType: "Bestellung", AggregateID: "Müller", Type: "Größe", Payload: json.RawMessage(`{"n":"Ä"}`)}
		conn := drv.open(t, dsn)
		tx, err := conn.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.write(ctx, w, ev); err == nil || !strings.Contains(err.Error(), "client_encoding is LATIN1") {
			t.Fatalf("%s: Write on a LATIN1 session: %v; want a refusal naming client_encoding", mode, err)
		}
		if err := tx.commit(ctx); err == nil {
			t.Fatalf("%s: Commit after the refused Write succeeded", mode)
		}
	}
	var rows int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM public.outbox").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("rows committed by the refused writes: %d, %v; want 0", rows, err)
	}
	utf8DSN := withUTF8(t, dsn)
	conn := drv.open(t, utf8DSN)
	tx, err := conn.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := mustWriter(t, Config{})
	if _, err := tx.write(ctx, w, Event{ID: "0192c0de-0000-7000-8000-000000000003", AggregateType: "Bestellung", AggregateID: "Müller", Type: "Größe", Payload: json.RawMessage(`{"n":"Ä"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := connect(t, utf8DSN).QueryRow(ctx, "SELECT aggregateid FROM public.outbox").Scan(&got); err != nil || got != "Müller" {
		t.Fatalf("aggregateid stored through a UTF8 session: %q, %v; want Müller", got, err)
	}
}

// withUTF8 returns dsn with client_encoding=UTF8.
func withUTF8(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("client_encoding", "UTF8")
	u.RawQuery = q.Encode()
	return u.String()
}
