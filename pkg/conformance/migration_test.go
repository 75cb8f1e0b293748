package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestMigratesInPlaceFromDebezium moves one slot and publication from
// Debezium to pgoutbox and back with the same connector JSON: Debezium
// relays, stops cleanly; pgoutbox starts on its slot; pgoutbox stops;
// Debezium starts again, its offsets removed. Events are written in every
// phase, also while nothing runs. Nothing may be lost; the duplicates are
// counted and must be exactly the events Debezium had produced past the
// slot's confirmed position when it stopped (Debezium confirms the slot
// only when Kafka Connect flushes offsets).
func TestMigratesInPlaceFromDebezium(t *testing.T) {
	libs := testenv.DebeziumLibs(t)
	e := testenv.Require(t)
	// A clean stop commits Debezium's offsets and confirms its slot; a
	// killed worker leaves the slot where the last periodic offset flush
	// put it, up to offset.flush.interval.ms behind what it produced.
	t.Run("clean stop", func(t *testing.T) { migrate(t, e, libs, false) })
	t.Run("worker killed", func(t *testing.T) { migrate(t, e, libs, true) })
}

func migrate(t *testing.T, e *testenv.Env, libs string, kill bool) {
	ctx := context.Background()
	dsn := e.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tok := token(t)
	slot := "mig_" + tok
	for _, sql := range []string{
		`CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255), aggregateid varchar(255), type varchar(255), payload jsonb)`,
		`CREATE PUBLICATION mig_pub FOR TABLE outbox`,
		`SELECT pg_create_logical_replication_slot('` + slot + `', 'pgoutput')`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot)
	})
	topic := "outbox.event.Mig" + tok
	e.CreateTopic(t, topic, topicPartitions)

	dir := keptDir(t, "pgoutbox-migration-")
	c := confCase{name: "migration"}
	cfg := c.connector(connEnv{pgPort: e.PGPort, dbname: dbName(t, dsn), tok: tok}, slot)
	cfg["publication.name"] = "mig_pub"
	cfg["table.include.list"] = `public\.outbox`
	path := filepath.Join(dir, "connector.json")
	if err := os.WriteFile(path, connectorJSON("orders-outbox", cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	// walAfter[i] is pg_current_wal_lsn() read after event i's commit (one
	// event per transaction): its commit ends after walAfter[i-1] and at
	// or before walAfter[i].
	n := 0
	walAfter := []string{currentLSN(t, conn)}
	write := func(count int) {
		t.Helper()
		for range count {
			n++
			if _, err := conn.Exec(ctx, `INSERT INTO outbox VALUES ($1, $2, $3, 'Created', $4)`,
				eventID(n), "Mig"+tok, fmt.Sprintf("k%d", n%5), fmt.Sprintf(`{"n": %d}`, n)); err != nil {
				t.Fatal(err)
			}
			walAfter = append(walAfter, currentLSN(t, conn))
		}
	}
	// resent bounds how many of events 1..upto PostgreSQL sends again from
	// a slot confirmed at lsn: those whose commit ends after it.
	resent := func(lsn string, upto int) (atLeast, atMost int) {
		for i := 1; i <= upto; i++ {
			if lsnLess(t, conn, lsn, walAfter[i-1]) || lsn == walAfter[i-1] {
				atLeast++
			}
			if lsnLess(t, conn, lsn, walAfter[i]) {
				atMost++
			}
		}
		return atLeast, atMost
	}
	// seen counts each event id's records in the topic.
	seen := func() map[string]int {
		out := map[string]int{}
		for _, r := range fetchAll(t, e.KafkaBrokers, []string{topic}, nil) {
			id, _ := r.header("id")
			out[string(id)]++
		}
		return out
	}
	var worker *testenv.Connect
	waitAll := func(who string) map[string]int {
		t.Helper()
		var s map[string]int
		testenv.Eventually(t, runTimeout, 500*time.Millisecond, func() (bool, string) {
			s = seen()
			status := ""
			if worker != nil {
				st, err := worker.Status("orders-outbox")
				status = fmt.Sprintf("; connector %+v %v", st, err)
			}
			return len(s) == n, fmt.Sprintf("%s: %d of %d events in %s%s", who, len(s), n, topic, status)
		})
		return s
	}
	confirmed := func() string {
		var lsn string
		if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	dups := func(s map[string]int) int {
		d := 0
		for _, k := range s {
			d += k - 1
		}
		return d
	}

	// 1. Debezium relays the first events, with Kafka Connect's default
	// offset flush interval (60 s), and stops cleanly.
	worker = e.StartConnect(t, testenv.ConnectConfig{Libs: libs, Dir: filepath.Join(dir, "connect"), Connectors: []string{path}})
	write(40)
	waitAll("Debezium")
	lsnBeforeStop := confirmed()
	stop := "a clean stop"
	if kill {
		worker.Kill(t)
		stop = "SIGKILL"
	} else {
		worker.Stop(t)
	}
	lsnAfterDebezium := confirmed()
	worker = nil
	write(30) // nobody runs

	// 2. pgoutbox with the same connector JSON, on the same slot.
	bin := buildPgoutbox(t)
	write(30)
	end := currentLSN(t, conn)
	if reason := runPgoutbox(t, bin, path, e.KafkaBrokers, nil, filepath.Join(dir, "pgoutbox.log"), func() bool {
		return confirmedPast(t, conn, slot, end)
	}); reason != "" {
		t.Fatalf("pgoutbox stopped: %s", reason)
	}
	sPgoutbox := waitAll("pgoutbox")
	toPgoutbox := dups(sPgoutbox)
	atLeast, atMost := resent(lsnAfterDebezium, 40)
	for id, k := range sPgoutbox {
		if k > 1 && id > eventID(40) {
			t.Errorf("event %s, written after Debezium stopped, is in Kafka %d times", id, k)
		}
	}
	if toPgoutbox < atLeast || toPgoutbox > atMost {
		t.Errorf("Debezium to pgoutbox: %d duplicates; the events Debezium relayed whose commits end after the slot's confirmed_flush_lsn %s are %d to %d",
			toPgoutbox, lsnAfterDebezium, atLeast, atMost)
	}
	lsnAfterPgoutbox := confirmed()
	write(30) // nobody runs

	// 3. Debezium again. Its stored offsets are older than the slot: once
	// pgoutbox's confirmations have moved the slot's restart_lsn past
	// them, Debezium's task fails ("the connector is trying to read change
	// stream starting at ..., but this is no longer available on the
	// server"). So, as the README's procedure says, its offsets are removed
	// first (standalone: the offset file; distributed: DELETE
	// /connectors/NAME/offsets on the stopped connector), and it streams
	// from the slot's confirmed position.
	// (A worker killed before its first flush left none.)
	if err := os.Remove(filepath.Join(dir, "connect", "offsets")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	worker = e.StartConnect(t, testenv.ConnectConfig{Libs: libs, Dir: filepath.Join(dir, "connect"), Connectors: []string{path}})
	write(30)
	sBack := waitAll("Debezium again")
	st, err := worker.Status("orders-outbox")
	if err == nil && st.Failed() != "" {
		t.Fatalf("Debezium failed on restart: %s", firstLines(st.Failed(), 3))
	}
	worker.Stop(t)
	backToDebezium := dups(sBack) - toPgoutbox

	report := fmt.Sprintf("| step | events written | distinct events in Kafka | duplicates | slot confirmed_flush_lsn |\n|---|---|---|---|---|\n"+
		"| Debezium relays (offset.flush.interval.ms 60 s), then %s | 40 | 40 | 0 | %s before the stop, %s after |\n"+
		"| pgoutbox, same connector JSON, same slot | +60 | %d | %d (expected %d to %d: relayed by Debezium, commit after the slot's position) | %s |\n"+
		"| Debezium again, its offsets removed | +60 | %d | %d | — |\n",
		stop, lsnBeforeStop, lsnAfterDebezium, len(sPgoutbox), toPgoutbox, atLeast, atMost, lsnAfterPgoutbox, len(sBack), backToDebezium)
	t.Log("\n" + report)
	if p := os.Getenv("PGOUTBOX_CONFORMANCE_REPORT"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, _ = f.WriteString("\nIn-place migration, Debezium → pgoutbox → Debezium:\n\n" + report)
			_ = f.Close()
		}
	}
	for id, k := range sBack {
		if k > 2 {
			t.Errorf("event %s is in Kafka %d times", id, k)
		}
	}
	if len(sBack) != n {
		t.Errorf("%d of %d events in Kafka", len(sBack), n)
	}
	if backToDebezium != 0 {
		t.Errorf("back to Debezium: %d duplicates; pgoutbox confirmed what it relayed, so Debezium should repeat none", backToDebezium)
	}
}

func currentLSN(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var lsn string
	if err := conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

func lsnLess(t *testing.T, conn *pgx.Conn, a, b string) bool {
	t.Helper()
	var less bool
	if err := conn.QueryRow(context.Background(), "SELECT $1::pg_lsn < $2::pg_lsn", a, b).Scan(&less); err != nil {
		t.Fatal(err)
	}
	return less
}

func dbName(t *testing.T, dsn string) string {
	t.Helper()
	i := strings.LastIndex(dsn, "/")
	name := dsn[i+1:]
	if q := strings.IndexByte(name, '?'); q >= 0 {
		name = name[:q]
	}
	return name
}
