package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestUserTypesArePlacedAsDebeziumDoesOrArePoison places columns of user
// types into headers through SimpleHeaderConverter, on each path a row
// reaches the router by: the stream (where a RELATION names the types by
// OID), the poll source and the initial snapshot (where a query's row
// description does). An enum is its label and a citext its text, as
// Debezium writes them (the enum is confirmed by the conformance suite's
// mood column). An array of an enum, a domain over one and an hstore are
// values Debezium makes Connect values of that pgoutbox does not reproduce
// (Debezium: ["happy","sad"] for the array, checked once by hand; JSON for
// the hstore): before, pgoutbox wrote their text there, other bytes than
// Debezium's without a word. Each is now a poison row, dead-lettered with
// the reason, and the rows after it are published.
func TestUserTypesArePlacedAsDebeziumDoesOrArePoison(t *testing.T) {
	env := testenv.Require(t)
	const (
		good, arr, domArr, hst, after = "406c07f3-0000-4000-8000-0000000000e1", "406c07f3-0000-4000-8000-0000000000e2",
			"406c07f3-0000-4000-8000-0000000000e3", "406c07f3-0000-4000-8000-0000000000e4", "406c07f3-0000-4000-8000-0000000000e5"
	)
	const schema = `CREATE EXTENSION IF NOT EXISTS citext; CREATE EXTENSION IF NOT EXISTS hstore;
		CREATE TYPE mood_t AS ENUM ('happy', 'sad'); CREATE DOMAIN moods_d AS mood_t[];
		ALTER TABLE outbox ADD COLUMN mood mood_t, ADD COLUMN email citext, ADD COLUMN moods mood_t[],
			ADD COLUMN dmoods moods_d, ADD COLUMN tags hstore`
	const rows = `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, mood, email) VALUES
			('` + good + `', '$P', 'k1', 'T', '{}', 'sad', 'Ann@Example.COM');
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, moods) VALUES ('` + arr + `', '$P', 'k2', 'T', '{}', '{happy,sad}');
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, dmoods) VALUES ('` + domArr + `', '$P', 'k3', 'T', '{}', '{sad}');
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tags) VALUES ('` + hst + `', '$P', 'k4', 'T', '{}', 'a=>1');
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, mood) VALUES ('` + after + `', '$P', 'k2', 'T', '{}', 'happy')`
	for _, path := range []string{"stream", "poll", "snapshot"} {
		t.Run(path, func(t *testing.T) {
			var f *fixture
			if path == "poll" {
				f = newPollFixture(t, env, 1)
			} else {
				f = newFixture(t, env, 1)
			}
			ctx := context.Background()
			exec := func(sql string) {
				t.Helper()
				if _, err := f.conn.Exec(ctx, strings.ReplaceAll(sql, "$P", f.slot)); err != nil {
					t.Fatal(err)
				}
			}
			exec(schema)
			cfg := f.config()
			if path == "poll" {
				cfg = f.pollConfig()
				cfg.Poll.MaxAttempts = 1
			}
			topic, dlq := "outbox.event."+f.slot, f.poisonPolicy(t, &cfg, "dead-letter")
			env.CreateTopic(t, topic, 1)
			cfg.Router.AdditionalPlacement = "mood:header,email:header,moods:header,dmoods:header,tags:header"
			cfg.Router.HeaderConverter = "org.apache.kafka.connect.storage.SimpleHeaderConverter"
			if path == "snapshot" {
				exec(rows)
				cfg.Snapshot.Mode = relay.SnapshotInitial
			}
			done := startPoisonRelay(t, cfg)
			switch path {
			case "stream":
				f.waitStreaming(t)
				exec(rows)
			case "poll":
				exec(rows)
			}
			msgs := env.NewConsumer(t, []string{topic}).WaitFor(t, 2, time.Minute)
			header := func(i int, k string) string {
				v, _ := msgs[i].Header(k)
				return string(v)
			}
			if len(msgs) != 2 || header(0, "id") != good || header(1, "id") != after {
				t.Fatalf("records %d; want the rows %s and %s", len(msgs), good, after)
			}
			if header(0, "mood") != "sad" || header(0, "email") != "Ann@Example.COM" || header(1, "mood") != "happy" {
				t.Errorf("mood %q, email %q, mood %q; want sad, Ann@Example.COM, happy", header(0, "mood"), header(0, "email"), header(1, "mood"))
			}
			dead := env.NewConsumer(t, []string{dlq}).WaitFor(t, 3, time.Minute)
			got := map[string]string{}
			for _, d := range dead {
				id, _ := d.Header("id")
				reason, _ := d.Header("pgoutbox.error.reason")
				got[string(id)] = string(reason)
			}
			for id, col := range map[string]string{arr: "moods", domArr: "dmoods", hst: "tags"} {
				if r := got[id]; !strings.Contains(r, `"`+col+`"`) || !strings.Contains(r, "user-defined type") {
					t.Errorf("dead-letter record of %s (column %s): reason %q", id, col, r)
				}
			}
			requireRunning(t, done)
		})
	}
}
