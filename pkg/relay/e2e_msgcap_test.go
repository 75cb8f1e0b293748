package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestMessageOverTheReceiveCapStopsTheRelayNamingIt writes a row larger
// than postgres.receive.max.message.bytes between two small ones, for a
// row and a logical decoding message. A row too large for the process's
// memory used to get it OOM-killed, and the standby after it, in a loop
// that named nothing. Now the relay stops (fatal) before reading it,
// naming its transaction and size; the slot is not confirmed past it; and
// a start with the cap raised delivers it and everything after it (real
// PostgreSQL and Kafka).
func TestMessageOverTheReceiveCapStopsTheRelayNamingIt(t *testing.T) {
	env := testenv.Require(t)
	const pad = 100_000 // bytes of payload: over the 64 KiB cap
	for _, kind := range []string{"row", "message"} {
		t.Run(kind, func(t *testing.T) {
			f := newFixture(t, env, 1)
			ctx := context.Background()
			topic := "outbox.event." + f.slot
			env.CreateTopic(t, topic, 1)
			cfg := f.config()
			cfg.Messages.Prefix = "outbox"
			cfg.Postgres.ReceiveMaxMessageBytes = 64 << 10
			done := startPoisonRelay(t, cfg)
			f.waitStreaming(t)

			id := func(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }
			row := func(n int, payload string) string {
				return `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + id(n) + `', '` + f.slot + `', 'k', 'T', ` + payload + `)`
			}
			exec := func(sql string) {
				t.Helper()
				if _, err := f.conn.Exec(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}
			exec(row(1, `'{"n": 1}'`))
			got := env.NewConsumer(t, []string{topic})
			got.WaitFor(t, 1, time.Minute)

			tx, err := f.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var xid int64
			if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
				t.Fatal(err)
			}
			big := fmt.Sprintf(`json_build_object('pad', repeat('x', %d))`, pad)
			if kind == "row" {
				_, err = tx.Exec(ctx, row(2, big))
			} else {
				_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', '%s', 'aggregatetype', '%s', 'aggregateid', 'k', 'type', 'T', 'payload', %s)::text)`, id(2), f.slot, big))
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, row(3, `'{"n": 3}'`)); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var end string
			if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&end); err != nil {
				t.Fatal(err)
			}
			exec(row(4, `'{"n": 4}'`))

			err = waitPoisonStop(t, done)
			var fe *relay.FatalError
			var tl *replication.MessageTooLargeError
			if !errors.As(err, &fe) || !errors.As(err, &tl) || tl.Size < pad || tl.Cap.Bytes != 64<<10 ||
				!strings.Contains(err.Error(), fmt.Sprintf("in transaction %d, committed at ", xid)) ||
				!strings.Contains(err.Error(), "postgres.receive.max.message.bytes") {
				t.Fatalf("want a fatal error naming the transaction %d, the size and the setting, got %v", xid, err)
			}
			t.Logf("stopped: %v", err)
			commit, perr := parseLSN(strings.TrimSuffix(strings.Fields(strings.SplitN(err.Error(), "committed at ", 2)[1])[0], ","))
			endLSN, _ := parseLSN(end)
			if perr != nil || commit > endLSN {
				t.Fatalf("commit LSN in the error: %v (the transaction ended before %s)", perr, end)
			}
			if confirmed, _ := f.slotState(t); confirmed > commit {
				t.Fatalf("slot confirmed %s, past the transaction %s the relay could not read", confirmed, commit)
			}
			if n := env.HighWater(t, []string{topic})[topic+"/0"]; n != 1 {
				t.Fatalf("%d records on %s after the stop, want the first row's alone", n, topic)
			}

			// The way on: a cap the message fits under.
			cfg.Postgres.ReceiveMaxMessageBytes = 0
			stop := runRelay(t, cfg)
			defer stop()
			// The first row's transaction may come again: the stop left
			// no connection to confirm it on (a resend, same event id).
			var ids []string
			testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
				ids = ids[:0]
				seen := map[string]bool{}
				for _, m := range got.Messages() {
					v, _ := m.Header("id")
					if !seen[string(v)] {
						seen[string(v)] = true
						ids = append(ids, string(v))
					}
				}
				return len(ids) == 4, fmt.Sprintf("records %v", ids)
			})
			if want := []string{id(1), id(2), id(3), id(4)}; strings.Join(ids, " ") != strings.Join(want, " ") {
				t.Fatalf("records %v, want %v", ids, want)
			}
			if n := len(got.Messages()); n > 5 {
				t.Fatalf("%d records, want 4 and at most the first one again", n)
			}
		})
	}
}

// TestRowLargerThanTheMemoryLimitStopsInsteadOfOOMKilling runs the binary
// in a memory control group of 160 MiB (as a container's limit) and writes
// an 80 MB row, which needs about 2.3 × 80 MB + 30 MiB to decode. The
// kernel's OOM killer is the oracle: before the cap, the process was
// killed (SIGKILL) at the row, and would be at every start; now it exits 1
// before reading it, naming the row's transaction and the limit the cap
// came from (real PostgreSQL, Kafka and kernel; it needs root and cgroup
// v1's memory controller, as on the project's test machine, and skips
// elsewhere, saying why).
func TestRowLargerThanTheMemoryLimitStopsInsteadOfOOMKilling(t *testing.T) {
	env := testenv.Require(t)
	group := memoryGroup(t, 160<<20)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	// A topic and a producer that take the record: decoded, it would be
	// sent, not refused for its size.
	env.CreateTopicWith(t, "outbox.event."+f.slot, testenv.TopicSpec{Partitions: 1, Configs: map[string]string{"max.message.bytes": "100000000"}})
	p := startInGroup(t, group, append(f.environ(), "GOMEMLIMIT=128MiB", "PGOUTBOX_KAFKA_MAX_MESSAGE_BYTES=100000000"))
	f.waitStreaming(t)
	if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
		('00000000-0000-4000-8000-000000000001', '`+f.slot+`', 'k', 'T', json_build_object('pad', repeat('x', 80000000)))`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("pgoutbox did not stop on the row")
	}
	log, _ := os.ReadFile(p.log)
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("pgoutbox ended with %v, want exit 1 (-1 with a signal: OOM-killed)", p.err)
	}
	if !strings.Contains(string(log), "a cap set by the memory limit of 160 MiB") || !strings.Contains(string(log), "in transaction ") {
		t.Fatalf("the log does not name the transaction and the limit:\n%s", lastLines(string(log), 10))
	}
	if confirmed, _ := f.slotState(t); confirmed == 0 {
		t.Fatal("slot has no confirmed position")
	}
}

// memoryGroup makes a cgroup v1 memory group of limit bytes under the
// test process's own (removed at the end), or skips the test saying why.
func memoryGroup(t *testing.T, limit int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a memory control group")
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no /proc/self/cgroup: %v", err)
	}
	var parent string
	for line := range strings.Lines(string(self)) {
		if parts := strings.SplitN(strings.TrimSpace(line), ":", 3); len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			parent = filepath.Join("/sys/fs/cgroup/memory", parts[2])
		}
	}
	if parent == "" {
		t.Skip("no cgroup v1 memory controller (cgroup v2 is not set up by this test)")
	}
	dir := filepath.Join(parent, "pgoutbox-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a memory control group: %v", err)
	}
	t.Cleanup(func() {
		// Empty once the test's processes ended (startProcess's cleanup
		// runs first: registered later).
		for i := 0; i < 50 && os.Remove(dir) != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Skipf("cannot set the group's limit: %v", err)
	}
	// No swap to escape to (the file is missing without swap accounting).
	_ = os.WriteFile(filepath.Join(dir, "memory.swappiness"), []byte("0"), 0o644)
	return dir
}

// insertLargeRows writes rows outbox rows of about 900 KB of payload
// each (md5 text, which TOAST cannot compress away), keys of 7 aggregates,
// to the topic of the fixture's slot name, in one transaction.
func insertLargeRows(t *testing.T, f *fixture, rows int) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'k' || (i % 7), 'T', json_build_object('n', i, 'pad', repeat(md5(i::text), 900000 / 32))
		FROM generate_series(1, $2) i`, f.slot, rows); err != nil {
		t.Fatal(err)
	}
}

// startInGroup starts pgoutbox run with environ inside the memory control
// group at group (memoryGroup): the shell puts itself in and becomes it.
func startInGroup(t *testing.T, group string, environ []string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "pgoutbox.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	return startProcess(t, "/bin/sh", []string{"-c", `echo $$ > "$1/cgroup.procs" && exec "$2" run`, "sh", group, pgoutboxBinary(t)}, environ, lf, logPath)
}

// awaitRecords waits three minutes for count to reach rows records on
// topic, failing at once if the process ends first (killed by the kernel,
// it ends by a signal).
func awaitRecords(t *testing.T, p *process, rows int, topic string, count func() int) {
	t.Helper()
	testenv.Eventually(t, 3*time.Minute, 200*time.Millisecond, func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("pgoutbox ended with %v before %d records reached %s (a signal: OOM-killed)", p.err, rows, topic)
		default:
		}
		n := count()
		return n >= rows, fmt.Sprintf("%d of %d records on %s", n, rows, topic)
	})
}

// capRowID is the event id of the n-th row insertCapRows writes.
func capRowID(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// insertCapRows writes three rows of one key, one transaction each, to the
// topic of the fixture's slot name: a small one, one of 100 KB of payload
// (over a cap of 64 KiB), and a small one.
func insertCapRows(t *testing.T, f *fixture) {
	t.Helper()
	for n, payload := range []string{`'{"n": 1}'`, `json_build_object('pad', repeat('x', 100000))`, `'{"n": 3}'`} {
		if _, err := f.conn.Exec(context.Background(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+capRowID(n+1)+`', '`+f.slot+`', 'k', 'T', `+payload+`)`); err != nil {
			t.Fatal(err)
		}
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestPollBacklogOfLargeRowsFitsTheMemoryLimit runs the poll source's
// binary in a memory control group of 160 MiB (as a container's limit)
// over a backlog of 200 rows of 900 KB, events Kafka takes (its default
// record limit is 1 MiB). A claim read all of its poll.batch.size rows
// into memory before the in-flight bytes cap took a part of them: 180 MB
// here, and the kernel killed the process, and would at every start; the
// next instance too. Now a claim keeps no more rows than
// relay.max.inflight.bytes, and every row reaches Kafka. The oracle is the
// kernel's OOM killer and the topic's own count (real PostgreSQL, Kafka
// and kernel; root and cgroup v1, skipped elsewhere, saying why).
func TestPollBacklogOfLargeRowsFitsTheMemoryLimit(t *testing.T) {
	env := testenv.Require(t)
	group := memoryGroup(t, 160<<20)
	f := newPollFixture(t, env, 1)
	topic := f.pollTopic(t)
	const rows = 200
	insertLargeRows(t, f, rows)
	p := startInGroup(t, group, f.pollEnviron("GOMEMLIMIT=128MiB"))
	awaitRecords(t, p, rows, topic, func() int { return int(env.HighWater(t, []string{topic})[topic+"/0"]) })
	if n := f.unpublished(t); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
	p.terminate(t, time.Minute)
}

// TestSnapshotOfLargeRowsFitsTheMemoryLimit: the initial snapshot
// (snapshot.mode: initial) of a table of 200 rows of 900 KB, by the binary
// in a memory control group of 160 MiB. Its fetches of snapshot.batch.size
// rows were read whole (180 MB here): the kernel killed the process, at
// every start. Now the fetches take about as many rows as fit
// relay.max.inflight.bytes, and every row reaches Kafka (real PostgreSQL,
// Kafka and kernel; root and cgroup v1, skipped elsewhere, saying why).
func TestSnapshotOfLargeRowsFitsTheMemoryLimit(t *testing.T) {
	env := testenv.Require(t)
	group := memoryGroup(t, 160<<20)
	f := newFixture(t, env, 1)
	topic := f.pollTopic(t)
	const rows = 200
	insertLargeRows(t, f, rows)
	p := startInGroup(t, group, append(f.environ(), "GOMEMLIMIT=128MiB", "PGOUTBOX_SNAPSHOT_MODE=initial"))
	awaitRecords(t, p, rows, topic, func() int { return int(env.HighWater(t, []string{topic})[topic+"/0"]) })
	p.terminate(t, time.Minute)
}

// TestPollRowOverTheCapStopsTheRelayNamingIt: the poll source reads a row
// whole as well; one longer than postgres.receive.max.message.bytes stops
// the relay before it is read, naming the table, the row's place and its
// size, publishing nothing of its claim; a start with the cap raised
// publishes every row, in order (real PostgreSQL and Kafka).
func TestPollRowOverTheCapStopsTheRelayNamingIt(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	ctx := context.Background()
	topic := f.pollTopic(t)
	id := capRowID
	insertCapRows(t, f)
	var firstSeq int64
	if err := f.checkDB.QueryRow(ctx, "SELECT seq FROM outbox WHERE id = $1", id(1)).Scan(&firstSeq); err != nil {
		t.Fatal(err)
	}
	cfg := f.pollConfig()
	cfg.Postgres.ReceiveMaxMessageBytes = 64 << 10
	err := waitPoisonStop(t, startPoisonRelay(t, cfg))
	var fe *relay.FatalError
	var tl *poll.RowTooLargeError
	if !errors.As(err, &fe) || !errors.As(err, &tl) || tl.Size < 100_000 || tl.AfterSeq != firstSeq ||
		!strings.Contains(err.Error(), "public.outbox") || !strings.Contains(err.Error(), "postgres.receive.max.message.bytes") {
		t.Fatalf("want a fatal error naming the table, the row after seq %d and its size, got %v", firstSeq, err)
	}
	t.Logf("stopped: %v", err)
	if n := f.unpublished(t); n != 3 {
		t.Fatalf("%d rows unpublished after the stop, want all 3 (the claim rolled back)", n)
	}
	cfg.Postgres.ReceiveMaxMessageBytes = 0
	stop := runRelay(t, cfg)
	defer stop()
	var ids []string
	for _, m := range env.NewConsumer(t, []string{topic}).WaitFor(t, 3, time.Minute) {
		v, _ := m.Header("id")
		ids = append(ids, string(v))
	}
	if want := []string{id(1), id(2), id(3)}; !slices.Equal(ids, want) {
		t.Fatalf("records %v, want %v", ids, want)
	}
}

// TestWALTransactionOfLargeRowsFitsTheMemoryLimit: one transaction of 200
// rows of 900 KB (180 MB), streamed by the binary in a memory control
// group of 160 MiB, as the WAL source's in-flight caps promise: every
// row reaches Kafka, and the kernel does not kill the process (real
// PostgreSQL, Kafka and kernel; root and cgroup v1, skipped elsewhere,
// saying why).
func TestWALTransactionOfLargeRowsFitsTheMemoryLimit(t *testing.T) {
	env := testenv.Require(t)
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) { walLargeRows(t, env, mode == "exactly-once") })
	}
}

func walLargeRows(t *testing.T, env *testenv.Env, exactlyOnce bool) {
	group := memoryGroup(t, 160<<20)
	f := newFixture(t, env, 1)
	topic := f.pollTopic(t)
	c := env.NewConsumer(t, []string{topic}, testenv.ReadCommitted())
	environ := append(f.environ(), "GOMEMLIMIT=128MiB")
	if exactlyOnce {
		environ = append(environ, "PGOUTBOX_KAFKA_EXACTLY_ONCE=true", "PGOUTBOX_KAFKA_OFFSETS_TOPIC=pgoutbox.offsets."+f.slot)
	}
	p := startInGroup(t, group, environ)
	f.waitStreaming(t)
	const rows = 200
	insertLargeRows(t, f, rows)
	awaitRecords(t, p, rows, topic, func() int { return int(c.Len()) })
	p.terminate(t, time.Minute)
}

// TestSnapshotRowOverTheCapStopsNamingIt: the initial snapshot reads a
// row whole too; one longer than postgres.receive.max.message.bytes stops
// the relay before it is read, naming the table and the row's size,
// without making the slot; a start with the cap raised publishes every
// row (real PostgreSQL and Kafka).
func TestSnapshotRowOverTheCapStopsNamingIt(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	topic := f.pollTopic(t)
	id := capRowID
	insertCapRows(t, f)
	cfg := f.config()
	cfg.Snapshot.Mode = relay.SnapshotInitial
	cfg.Postgres.ReceiveMaxMessageBytes = 64 << 10
	err := waitPoisonStop(t, startPoisonRelay(t, cfg))
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "initial snapshot of public.outbox") || !strings.Contains(err.Error(), "postgres.receive.max.message.bytes") {
		t.Fatalf("want a fatal error naming the table and the setting, got %v", err)
	}
	t.Logf("stopped: %v", err)
	var slots int
	if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots named %s after the stop (%v), want none", slots, f.slot, err)
	}
	cfg.Postgres.ReceiveMaxMessageBytes = 0
	stop := runRelay(t, cfg)
	defer stop()
	c := env.NewConsumer(t, []string{topic})
	seen := map[string]bool{}
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		for _, m := range c.Messages() {
			v, _ := m.Header("id")
			seen[string(v)] = true
		}
		return seen[id(1)] && seen[id(2)] && seen[id(3)], fmt.Sprintf("records %v", seen)
	})
}
