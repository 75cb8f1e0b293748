package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// newDatabaseEncoded returns the DSN of a fresh database in encoding (and
// the C locale, which every encoding accepts), dropped at the end of the
// test with its slots.
func newDatabaseEncoded(t *testing.T, encoding string) string {
	t.Helper()
	env := testenv.Require(t)
	name := strings.ToLower(testenv.UniqueName(t, "enc"))
	super := connect(t, env.PGDSN)
	mustExec(t, super, fmt.Sprintf("CREATE DATABASE %s ENCODING '%s' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0", pgx.Identifier{name}.Sanitize(), encoding))
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), env.PGDSN)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1", name)
		if _, err := c.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	u, err := url.Parse(env.PGDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

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
	dsn := newDatabaseEncoded(t, "LATIN1")
	admin := connect(t, dsn)
	createOutboxTable(t, admin, "public.outbox")
	createSlot(t, admin, "public.outbox", "outbox_pub", "s")
	w := mustWriter(t, Config{Mode: ModeMessage})
	if clientEncoding == "UTF8" {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("client_encoding", "UTF8")
		u.RawQuery = q.Encode()
		dsn = u.String()
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
