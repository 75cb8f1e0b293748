package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/router"
)

// topicPartitions is every test topic's partition count: enough for the
// murmur2 partitioner's choice to be seen.
const topicPartitions = 3

// runTimeout bounds each system's wait for the end of the workload.
const runTimeout = 4 * time.Minute

// side is what one system produced for one configuration.
type side struct {
	records []record
	// deadLettered are the records pgoutbox produced to its dead-letter
	// topic (with errors.tolerance=all).
	deadLettered []record
	// confirmed is pgoutbox's slot's confirmed_flush_lsn when it ended.
	confirmed string
	// failure is why the system stopped before the end of the workload
	// (Debezium's task trace, pgoutbox's exit reason), "" when it did not.
	failure string
}

// TestMatchesDebezium runs every configuration of confCases through the real
// Debezium on Kafka Connect and through the pgoutbox binary with the same
// connector JSON, on the same rows, and compares every record.
func TestMatchesDebezium(t *testing.T) {
	libs := testenv.DebeziumLibs(t)
	e := testenv.Require(t)
	start := time.Now()
	ctx := context.Background()
	dsn := e.NewDatabase(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, schemaSQL); err != nil {
		t.Fatal(err)
	}
	tok := token(t)
	dir := keptDir(t, "pgoutbox-conformance-")
	env := connEnv{pgPort: e.PGPort, dbname: strings.TrimPrefix(u.Path, "/"), tok: tok, secrets: filepath.Join(dir, "db.properties")}
	if err := os.WriteFile(env.secrets, []byte("# as a mounted secret\nuser = postgres\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	providerVars := []string{providerEnv + "=" + env.dbname}
	cases := confCases()
	checkSlotRoom(t, conn, len(cases)+2)

	// One slot, then a copy per system and configuration: all start at the
	// same LSN. The origin is never streamed from.
	origin := "conf_origin_" + tok
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", origin); err != nil {
		t.Fatal(err)
	}
	dropSlot := func(name string) {
		_, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", name)
	}
	t.Cleanup(func() { dropSlot(origin) })
	dbzSlot := func(i int) string { return fmt.Sprintf("conf_dbz_%02d_%s", i, tok) }
	pgoSlot := func(i int) string { return fmt.Sprintf("conf_pgo_%02d_%s", i, tok) }
	for i := range cases {
		if _, err := conn.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", origin, dbzSlot(i)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dropSlot(dbzSlot(i)) })
	}

	w := newWorkload(tok)
	nw := nullWorkload(tok, w.n+1000)
	mw := messageWorkload(tok, nw.n+1000)
	w.write(t, conn)
	nw.write(t, conn)
	mw.write(t, conn)
	rows := map[string]row{}
	for _, wl := range []*workload{w, nw, mw} {
		for _, tx := range wl.txns {
			for _, r := range tx.events() {
				if id, ok := r["id"].(string); ok {
					rows[id] = r
				}
			}
		}
	}
	// The end of each configuration's stream is its sentinel's commit.
	// pgoutbox has relayed everything once it confirmed the LSN read after
	// the sentinel's commit (it confirms only what Kafka acknowledged, and
	// idle keepalives, never inside a transaction).
	wl := func(c confCase) *workload {
		if c.null {
			return nw
		}
		if c.messages || c.rawMessages {
			return mw
		}
		return w
	}

	// Debezium: every configuration at once in one worker.
	var files []string
	for i, c := range cases {
		p := filepath.Join(dir, "dbz-"+c.name+".json")
		if err := os.WriteFile(p, connectorJSON("dbz-"+c.name, c.debeziumConnector(env, dbzSlot(i))), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	t.Cleanup(func() { deleteTopics(t, e.KafkaBrokers, "dbz"+tok+".") })
	dbzStart := time.Now()
	worker := e.StartConnect(t, testenv.ConnectConfig{Libs: libs, Dir: filepath.Join(dir, "connect"), Connectors: files,
		OffsetFlushInterval: time.Second, Worker: providerWorker, Env: providerVars})
	// A configuration is done when its task failed or its sentinel (the
	// only event routed to its topic) arrived; the worker's clean stop then
	// flushes what is still in flight.
	dbz := make([]side, len(cases))
	done := make([]bool, len(cases))
	testenv.Eventually(t, runTimeout, 500*time.Millisecond, func() (bool, string) {
		var pending []string
		for i, c := range cases {
			if done[i] {
				continue
			}
			st, err := worker.Status("dbz-" + c.name)
			if err == nil {
				if trace := st.Failed(); trace != "" {
					dbz[i].failure = firstLines(trace, 3)
					done[i] = true
					continue
				}
			}
			if arrived(t, e.KafkaBrokers, c.debeziumPrefix(tok)+sentinelTopic(t, c, wl(c).sentinel)) {
				done[i] = true
				continue
			}
			pending = append(pending, c.name)
		}
		return len(pending) == 0, fmt.Sprintf("Debezium has not reached the end for %v; worker log %s", pending, worker.LogPath())
	})
	worker.Stop(t)
	dbzTime := time.Since(dbzStart)
	for i, c := range cases {
		prefix := c.debeziumPrefix(tok)
		topics := topicsWithPrefix(t, e.KafkaBrokers, prefix)
		dbz[i].records = fetchAll(t, e.KafkaBrokers, topics, nil)
		for j := range dbz[i].records {
			dbz[i].records[j].Topic = strings.TrimPrefix(dbz[i].records[j].Topic, prefix)
		}
	}

	// pgoutbox: each configuration in turn, from its own copy of the slot,
	// with the connector JSON Debezium was given (less the test's topic
	// prefix).
	bin := buildPgoutbox(t)
	dlq := "conformance.dead-letter." + tok
	e.CreateTopic(t, dlq, 1)
	created := map[string]bool{}
	pgo := make([]side, len(cases))
	pgoStart := time.Now()
	for i, c := range cases {
		topics := routedTopics(t, c, rows, dbz[i].records)
		for _, topic := range topics {
			if !created[topic] {
				e.CreateTopic(t, topic, topicPartitions)
				created[topic] = true
			}
		}
		slot := pgoSlot(i)
		if _, err := conn.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", origin, slot); err != nil {
			t.Fatal(err)
		}
		from := offsets(t, e.KafkaBrokers, append(topics, dlq))
		p := filepath.Join(dir, "pgoutbox-"+c.name+".json")
		if err := os.WriteFile(p, connectorJSON("pgoutbox-"+c.name, c.connector(env, slot)), 0o644); err != nil {
			t.Fatal(err)
		}
		pgo[i].failure = runPgoutbox(t, bin, p, e.KafkaBrokers, append(providerVars, providerPgoutbox, "PGOUTBOX_RELAY_DEAD_LETTER_TOPIC="+dlq),
			filepath.Join(dir, "pgoutbox-"+c.name+".log"), func() bool {
				return confirmedPast(t, conn, slot, wl(c).afterSentinel)
			})
		pgo[i].records = fetchAll(t, e.KafkaBrokers, topics, from)
		pgo[i].deadLettered = fetchAll(t, e.KafkaBrokers, []string{dlq}, from)
		if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pgo[i].confirmed); err != nil {
			t.Fatal(err)
		}
		dropSlot(slot)
	}
	pgoTime := time.Since(pgoStart)

	// Compare.
	var report strings.Builder
	report.WriteString("| configuration | records from Debezium | records from pgoutbox | identical | different | only Debezium | only pgoutbox | deliberate | dead-lettered by pgoutbox, skipped by Debezium | unconfirmed at pgoutbox's stop | Debezium failure | pgoutbox stop |\n")
	report.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var problems, notes []string
	for i, c := range cases {
		res := compare(c, dbz[i], pgo[i], rows, func(id string) bool {
			// pgoutbox stopped and never confirmed the event's transaction:
			// PostgreSQL sends it again when pgoutbox restarts.
			before := wl(c).before[id]
			return pgo[i].failure != "" && before != "" && !lsnLess(t, conn, before, pgo[i].confirmed)
		})
		fmt.Fprintf(&report, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n", c.name, len(dbz[i].records), len(pgo[i].records),
			res.identical, len(res.different), len(res.onlyDebezium), len(res.onlyPgoutbox), len(res.deliberate), len(pgo[i].deadLettered),
			res.unconfirmed, cell(dbz[i].failure), cell(pgo[i].failure))
		notes = append(notes, groupNotes(c.name, res.deliberate)...)
		for _, d := range res.different {
			problems = append(problems, c.name+": "+d)
		}
		for _, d := range res.onlyDebezium {
			problems = append(problems, c.name+": only Debezium: "+d)
		}
		for _, d := range res.onlyPgoutbox {
			problems = append(problems, c.name+": only pgoutbox: "+d)
		}
		for _, d := range res.order {
			problems = append(problems, c.name+": order: "+d)
		}
	}
	if len(notes) > 0 {
		report.WriteString("\nDeliberate differences (see README, Migrating from Debezium):\n")
		for _, n := range notes {
			report.WriteString("- " + n + "\n")
		}
	}
	fmt.Fprintf(&report, "\nDebezium (all configurations in one worker): %s; pgoutbox (one configuration after another): %s; whole test %s\n",
		dbzTime.Round(time.Second), pgoTime.Round(time.Second), time.Since(start).Round(time.Second))
	t.Log("\n" + report.String())
	if p := os.Getenv("PGOUTBOX_CONFORMANCE_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(report.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	if len(problems) > 0 {
		t.Errorf("%d differences:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

// keptDir makes a directory for the test's files, removed at the end unless
// the test failed.
func keptDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept %s (connector files, Kafka Connect's and pgoutbox's logs)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

func cell(s string) string {
	if s == "" {
		return "—"
	}
	s = strings.ReplaceAll(s, "|", "\\|")
	return strings.ReplaceAll(s, "\n", " ")
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	var keep []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "at ") || strings.HasPrefix(l, "...") {
			continue
		}
		keep = append(keep, l)
		if len(keep) == n {
			break
		}
	}
	return strings.Join(keep, " / ")
}

func token(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// checkSlotRoom fails the test early when the server cannot hold the
// slots it needs.
func checkSlotRoom(t *testing.T, conn *pgx.Conn, need int) {
	t.Helper()
	var free int
	if err := conn.QueryRow(context.Background(),
		"SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)").Scan(&free); err != nil {
		t.Fatal(err)
	}
	if free < need {
		t.Fatalf("the server has room for %d more replication slots and the suite needs %d: raise max_replication_slots", free, need)
	}
}

// sentinelTopic is the topic configuration c routes the sentinel row to.
func sentinelTopic(t *testing.T, c confCase, sentinel row) string {
	t.Helper()
	topics := routedTopics(t, c, map[string]row{"": sentinel}, nil)
	if len(topics) != 1 {
		t.Fatalf("%s: the sentinel routes to %v", c.name, topics)
	}
	return topics[0]
}

// arrived reports whether topic exists and holds a record.
func arrived(t *testing.T, brokers []string, topic string) bool {
	t.Helper()
	for _, off := range offsets(t, brokers, []string{topic}) {
		if off > 0 {
			return true
		}
	}
	return false
}

// confirmedPast reports whether slot's confirmed_flush_lsn is at or past lsn.
func confirmedPast(t *testing.T, conn *pgx.Conn, slot, lsn string) bool {
	t.Helper()
	var past *bool
	err := conn.QueryRow(context.Background(),
		"SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", slot, lsn).Scan(&past)
	if err != nil {
		t.Fatalf("read slot %s: %v", slot, err)
	}
	return past != nil && *past
}

func topicsWithPrefix(t *testing.T, brokers []string, prefix string) []string {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	all, err := admin.ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for name := range all {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func deleteTopics(t *testing.T, brokers []string, prefix string) {
	if t.Failed() {
		return // keep them for inspection
	}
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		return
	}
	defer admin.Close()
	all, err := admin.ListTopics()
	if err != nil {
		return
	}
	for name := range all {
		if strings.HasPrefix(name, prefix) {
			_ = admin.DeleteTopic(name)
		}
	}
}

// routedTopics is the topics pgoutbox must find for configuration c: those
// Debezium wrote to, and those pgoutbox's router computes for the rows'
// routing values (created up front: pgoutbox creates no topics).
func routedTopics(t *testing.T, c confCase, rows map[string]row, dbz []record) []string {
	t.Helper()
	set := map[string]bool{}
	for _, r := range dbz {
		set[r.Topic] = true
	}
	opts := router.DefaultOptions()
	for k, v := range c.conn {
		if opt, ok := strings.CutPrefix(k, "transforms.outbox."); ok && strings.HasPrefix(opt, "route.") {
			if err := opts.Set(opt, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	rt, err := router.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		v, ok := r[opts.RouteByField].(string)
		if !ok {
			continue
		}
		var rec router.Record
		row := &router.Row{Table: "public." + r["table"].(string), Op: router.OpInsert,
			Names: []string{"id", opts.RouteByField, "payload"}, Values: [][]byte{[]byte("x"), []byte(v), []byte("{}")}}
		if opts.RouteByField == "payload" {
			row.Names, row.Values = row.Names[:2], row.Values[:2]
		}
		if a, err := rt.Route(row, time.Now(), &rec); err == nil && a.Emits() {
			set[rec.Topic] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// buildPgoutbox builds the binary from this repository.
func buildPgoutbox(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "pgoutbox")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/pgoutbox")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pgoutbox: %v\n%s", err, out)
	}
	return bin
}

// runPgoutbox runs `pgoutbox run --connector file` (with environ added to
// its environment) until done reports true
// (then stops it with SIGTERM) or it exits by itself; it returns the exit
// reason when pgoutbox stopped on its own, "" otherwise.
func runPgoutbox(t *testing.T, bin, connector string, brokers []string, environ []string, logPath string, done func() bool) string {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "run", "--connector", connector, "--brokers", strings.Join(brokers, ","), "--log-format", "json")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(append(os.Environ(), "GOMAXPROCS=1"), environ...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	reason := ""
	deadline := time.After(runTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case err := <-exited:
			reason = fmt.Sprintf("exit %v: %s", err, lastLine(logPath))
			return reason
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("pgoutbox (%s) did not reach the end of the workload in %s; log %s", connector, runTimeout, logPath)
		case <-tick.C:
			if done() {
				break loop
			}
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("pgoutbox (%s) stopped with %v after SIGTERM; log %s", connector, err, logPath)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("pgoutbox (%s) did not stop within 60 s of SIGTERM", connector)
	}
	return ""
}

func lastLine(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

var uuidText = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// result is the comparison of one configuration.
type result struct {
	identical                  int
	different                  []string
	onlyDebezium, onlyPgoutbox []string
	order                      []string
	// deliberate are the documented differences: pgoutbox's refusal of a
	// NULL event id (Debezium delivers it with a null id header), the
	// trace context pgoutbox forwards where Debezium without OpenTelemetry
	// writes none, and the member order of merged arrays of objects, which
	// in Debezium follows hash codes that change from one JVM to the next.
	deliberate []string
	// unconfirmed counts the events Debezium produced that pgoutbox, having
	// stopped on a poison row, had not delivered and never confirmed: they
	// are sent again when it restarts, so nothing is lost.
	unconfirmed int
}

// identity names a record: its event id, or for a NULL id its key.
func identity(r *record) string {
	if id, ok := r.header("id"); ok && id != nil {
		return string(id)
	}
	if strings.HasSuffix(r.Topic, ".message") {
		// Debezium's record of a logical decoding message: named by the
		// message's LSN.
		var v struct {
			Source struct {
				LSN json.Number `json:"lsn"`
			} `json:"source"`
		}
		if json.Unmarshal(r.Value, &v) == nil && v.Source.LSN != "" {
			return "message at LSN " + string(v.Source.LSN)
		}
	}
	return "key " + fmt.Sprintf("%q", r.Key)
}

func compare(c confCase, dbzSide, pgoSide side, rows map[string]row, unconfirmed func(id string) bool) result {
	var res result
	dbz, pgo := dbzSide.records, pgoSide.records
	index := func(recs []record) (map[string]*record, []string) {
		m := map[string]*record{}
		var dups []string
		for i := range recs {
			id := identity(&recs[i])
			if _, dup := m[id]; dup {
				dups = append(dups, id)
			}
			m[id] = &recs[i]
		}
		return m, dups
	}
	dm, ddup := index(dbz)
	pm, pdup := index(pgo)
	// What pgoutbox dead-letters (errors.tolerance=all) is what Debezium
	// skips: never a record Debezium produced.
	for i := range pgoSide.deadLettered {
		if id := identity(&pgoSide.deadLettered[i]); dm[id] != nil {
			res.different = append(res.different, "pgoutbox dead-lettered event "+id+", which Debezium produced")
		}
	}
	for _, id := range ddup {
		res.different = append(res.different, "Debezium wrote event "+id+" twice")
	}
	for _, id := range pdup {
		res.different = append(res.different, "pgoutbox wrote event "+id+" twice")
	}
	for _, id := range slices.Sorted(maps.Keys(dm)) {
		d := dm[id]
		p, ok := pm[id]
		if !ok {
			if unconfirmed(id) {
				res.unconfirmed++
				continue
			}
			if why, ok := rows[id]["deliberate"].(string); ok {
				res.deliberate = append(res.deliberate, describe(d)+": "+why)
				continue
			}
			if c.null && strings.Contains(pgoSide.failure, "event id is NULL") {
				res.deliberate = append(res.deliberate, describe(d)+": pgoutbox stopped at the NULL event id (poison), Debezium delivered it with a null id header")
				continue
			}
			res.onlyDebezium = append(res.onlyDebezium, describe(d))
			continue
		}
		pc := *p
		if c.forwardsTrace {
			// Debezium writes tracing headers only with OpenTelemetry on
			// its class path, and then for a span of its own; pgoutbox
			// forwards the application's context.
			var kept []header
			for _, h := range pc.Headers {
				if h.Key == "traceparent" || h.Key == "tracestate" {
					res.deliberate = append(res.deliberate, fmt.Sprintf("event %s: pgoutbox forwards header %s=%s", id, h.Key, h.Value))
					continue
				}
				kept = append(kept, h)
			}
			pc.Headers = kept
		}
		// Debezium gives a column's field its DEFAULT as the schema's
		// default, and Kafka Connect's Struct.get returns that default for
		// a NULL: an explicit NULL in such a column (note) comes out as
		// the default ('the default'; for a function default such as
		// now() or gen_random_uuid(), a placeholder such as 1970-01-01 or
		// the zero UUID). pgoutbox writes the NULL that was inserted.
		pc.Headers = slices.Clone(pc.Headers)
		for i, h := range pc.Headers {
			if h.Key == defaultedColumn && h.Value == nil && i < len(d.Headers) && d.Headers[i].Key == h.Key &&
				(string(d.Headers[i].Value) == defaultedValue || string(d.Headers[i].Value) == `"`+defaultedValue+`"`) {
				res.deliberate = append(res.deliberate, fmt.Sprintf("event %s: header %s null where Debezium writes the column's default %s", id, h.Key, show(d.Headers[i].Value)))
				pc.Headers[i].Value = d.Headers[i].Value
			}
			if h.Key == defaultedColumn && string(h.Value) == "null" && i < len(d.Headers) && string(d.Headers[i].Value) == `"`+defaultedValue+`"` {
				res.deliberate = append(res.deliberate, fmt.Sprintf("event %s: header %s null where Debezium writes the column's default %s", id, h.Key, show(d.Headers[i].Value)))
				pc.Headers[i].Value = d.Headers[i].Value
			}
		}
		if nullField, dflt := []byte(`,"`+defaultedColumn+`":null`), []byte(`,"`+defaultedColumn+`":"`+defaultedValue+`"`); bytes.Contains(pc.Value, nullField) && bytes.Contains(d.Value, dflt) &&
			bytesEqual(d.Value, bytes.Replace(pc.Value, nullField, dflt, 1)) {
			res.deliberate = append(res.deliberate, fmt.Sprintf("event %s: envelope field %s null where Debezium writes the column's default", id, defaultedColumn))
			pc.Value = d.Value
		}
		if c.conn["transforms.outbox.table.expand.json.payload"] == "true" && !bytesEqual(d.Value, pc.Value) && sameJSONIgnoringMemberOrder(d.Value, pc.Value) {
			res.deliberate = append(res.deliberate, fmt.Sprintf("event %s: the same JSON with members in another order: Debezium %s, pgoutbox %s", id, show(d.Value), show(pc.Value)))
			pc.Value = d.Value
		}
		if envelopeTime.Match(d.Value) && envelopeTime.Match(pc.Value) {
			// A message record's envelope ts_ms is each system's clock
			// when it made the record.
			pc.Value = envelopeTime.ReplaceAll(pc.Value, envelopeTime.Find(d.Value))
		}
		if diffs := diffRecords(c, d, &pc, rows[id]); len(diffs) > 0 {
			res.different = append(res.different, "event "+id+": "+strings.Join(diffs, "; "))
		} else {
			res.identical++
		}
	}
	for id, p := range pm {
		if _, ok := dm[id]; !ok {
			res.onlyPgoutbox = append(res.onlyPgoutbox, describe(p))
		}
	}
	sort.Strings(res.onlyPgoutbox)
	// Order within each partition, over the events both wrote there.
	seq := func(recs []record, other map[string]*record) map[string][]string {
		out := map[string][]string{}
		for i := range recs {
			r := &recs[i]
			id := identity(r)
			if o, ok := other[id]; ok && o.Topic == r.Topic && o.Partition == r.Partition {
				k := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
				out[k] = append(out[k], id)
			}
		}
		return out
	}
	ds, ps := seq(dbz, pm), seq(pgo, dm)
	for k, d := range ds {
		if strings.Join(d, ",") != strings.Join(ps[k], ",") {
			res.order = append(res.order, fmt.Sprintf("%s: Debezium %v, pgoutbox %v", k, d, ps[k]))
		}
	}
	return res
}

// groupNotes lists a configuration's deliberate differences once per kind:
// notes that differ only in their event id are counted as one.
func groupNotes(config string, notes []string) []string {
	eventID := regexp.MustCompile(`^event "?[0-9a-f-]+"?: `)
	var order []string
	count := map[string]int{}
	for _, n := range notes {
		k := eventID.ReplaceAllString(n, "")
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	var out []string
	for _, k := range order {
		if count[k] == 1 {
			k0 := k
			for _, n := range notes { // the one note, with its event id
				if eventID.ReplaceAllString(n, "") == k0 {
					k = n
				}
			}
			out = append(out, config+": "+k)
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s (%d events)", config, k, count[k]))
	}
	return out
}

// defaultedColumn is the outbox tables' column with a DEFAULT that every
// row sets to NULL, and defaultedValue its default (rows_test.go).
const defaultedColumn, defaultedValue = "note", "the default"

// envelopeTime is the start of a Debezium message record's value, up to
// its envelope's ts_ms.
var envelopeTime = regexp.MustCompile(`^\{"op":"m","ts_ms":[0-9]+,`)

func describe(r *record) string {
	return fmt.Sprintf("event %s (topic %s, key %q, value %.120q)", identity(r), r.Topic, r.Key, r.Value)
}

// diffRecords lists how two records of one event differ. The run id of
// Debezium's context headers is a fresh UUID per run of either system: it
// is compared by its form.
func diffRecords(c confCase, d, p *record, r row) []string {
	var out []string
	if d.Topic != p.Topic {
		out = append(out, fmt.Sprintf("topic %q vs %q", d.Topic, p.Topic))
	}
	if d.Key != nil && d.Partition != p.Partition {
		out = append(out, fmt.Sprintf("partition %d vs %d", d.Partition, p.Partition))
	}
	if !bytesEqual(d.Key, p.Key) {
		out = append(out, fmt.Sprintf("key %s vs %s", show(d.Key), show(p.Key)))
	}
	if !bytesEqual(d.Value, p.Value) {
		out = append(out, fmt.Sprintf("value %s vs %s", show(d.Value), show(p.Value)))
	}
	if len(d.Headers) != len(p.Headers) {
		out = append(out, fmt.Sprintf("headers %s vs %s", showHeaders(d.Headers), showHeaders(p.Headers)))
	} else {
		for i := range d.Headers {
			dh, ph := d.Headers[i], p.Headers[i]
			switch {
			case dh.Key != ph.Key:
				out = append(out, fmt.Sprintf("header %d %q vs %q", i, dh.Key, ph.Key))
			case dh.Key == "__debezium.context.runId":
				if !uuidText.Match(unquote(dh.Value)) || !uuidText.Match(unquote(ph.Value)) || (dh.Value[0] == '"') != (ph.Value[0] == '"') {
					out = append(out, fmt.Sprintf("header runId %s vs %s", show(dh.Value), show(ph.Value)))
				}
			case !bytesEqual(dh.Value, ph.Value):
				out = append(out, fmt.Sprintf("header %q %s vs %s", dh.Key, show(dh.Value), show(ph.Value)))
			}
		}
	}
	if d.LogAppend != p.LogAppend {
		out = append(out, fmt.Sprintf("timestamp type LogAppendTime=%v vs %v", d.LogAppend, p.LogAppend))
	}
	if c.timestampColumn && r != nil && r["ts"] != nil && !d.Timestamp.Equal(p.Timestamp) {
		out = append(out, fmt.Sprintf("timestamp %s vs %s", d.Timestamp.UTC().Format(time.RFC3339Nano), p.Timestamp.UTC().Format(time.RFC3339Nano)))
	}
	return out
}

// sameJSONIgnoringMemberOrder reports whether a and b are JSON documents
// equal up to the order of object members, which is all that may differ in
// an expanded array of objects whose elements have different members.
func sameJSONIgnoringMemberOrder(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func unquote(b []byte) []byte { return bytes.Trim(b, `"`) }

func bytesEqual(a, b []byte) bool {
	return (a == nil) == (b == nil) && bytes.Equal(a, b)
}

func show(b []byte) string {
	if b == nil {
		return "null"
	}
	if len(b) > 200 {
		return fmt.Sprintf("%q…(%d bytes)", b[:200], len(b))
	}
	return fmt.Sprintf("%q", b)
}

func showHeaders(hs []header) string {
	var parts []string
	for _, h := range hs {
		parts = append(parts, h.Key+"="+show(h.Value))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
