package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// fixture is one test's database, slot, publication and topics.
type fixture struct {
	env     *testenv.Env
	dsn     string
	slot    string
	pub     string
	shape   outboxtest.Shape
	topics  []string
	conn    *pgx.Conn // the writer's connection
	checkDB *pgx.Conn // for slot and LSN queries
}

func newFixture(t *testing.T, env *testenv.Env, partitions int) *fixture {
	t.Helper()
	return fixtureOn(t, env, env.NewDatabase(t), partitions)
}

// fixtureOn is newFixture on the database at dsn.
func fixtureOn(t *testing.T, env *testenv.Env, dsn string, partitions int) *fixture {
	t.Helper()
	ctx := context.Background()
	name := strings.ToLower(testenv.UniqueName(t, "r"))
	f := &fixture{env: env, dsn: dsn, slot: name, pub: name, shape: outboxtest.DefaultShape()}
	// Topic names are cluster-wide: give this test's aggregate types a
	// prefix of their own.
	for i, a := range f.shape.AggregateTypes {
		f.shape.AggregateTypes[i] = name + "_" + a
		topic := "outbox.event." + f.shape.AggregateTypes[i]
		env.CreateTopic(t, topic, partitions)
		f.topics = append(f.topics, topic)
	}
	var err error
	f.conn, err = pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { f.conn.Close(context.Background()) })
	f.checkDB, err = pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { f.checkDB.Close(context.Background()) })
	if err := outboxtest.Setup(ctx, f.conn, "outbox"); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) config() relay.Config {
	cfg := relay.DefaultConfig()
	cfg.Postgres.DSN = f.dsn
	cfg.Postgres.Slot = f.slot
	cfg.Postgres.Publication = f.pub
	cfg.Postgres.Tables = []string{"public.outbox"}
	cfg.Kafka.Brokers = f.env.KafkaBrokers
	cfg.Relay.RestartBackoff = 200 * time.Millisecond
	cfg.Relay.RestartBackoffMax = 2 * time.Second
	return cfg
}

// env returns the process environment that configures the binary like config.
func (f *fixture) environ() []string {
	return append(os.Environ(),
		"PGOUTBOX_POSTGRES_DSN="+f.dsn,
		"PGOUTBOX_POSTGRES_SLOT_NAME="+f.slot,
		"PGOUTBOX_POSTGRES_PUBLICATION_NAME="+f.pub,
		"PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=public.outbox",
		"PGOUTBOX_KAFKA_BROKERS="+strings.Join(f.env.KafkaBrokers, ","),
		"PGOUTBOX_RELAY_RESTART_BACKOFF=200ms",
		"PGOUTBOX_RELAY_RESTART_BACKOFF_MAX=2s",
		"PGOUTBOX_LOG_FORMAT=json",
	)
}

// slot reads the slot's confirmed position and whether a walsender holds it.
func (f *fixture) slotState(t testing.TB) (confirmed checkpoint.LSN, active bool) {
	t.Helper()
	var lsn *string
	err := f.checkDB.QueryRow(context.Background(),
		"SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&lsn, &active)
	if err == pgx.ErrNoRows {
		return 0, false
	}
	if err != nil {
		t.Fatalf("read slot: %v", err)
	}
	if lsn != nil {
		confirmed, err = outboxtest.ParseLSN(*lsn)
		if err != nil {
			t.Fatal(err)
		}
	}
	return confirmed, active
}

// fence reads the state row's fence (stopped_lsn); NULL fails the test.
func (f *fixture) fence(t testing.TB) checkpoint.LSN {
	t.Helper()
	var s *string
	if err := f.checkDB.QueryRow(context.Background(), "SELECT stopped_lsn::text FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&s); err != nil {
		t.Fatal(err)
	}
	if s == nil {
		t.Fatal("stopped_lsn is NULL: no fence is recorded")
	}
	lsn, err := parseLSN(*s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// waitStreaming waits until a walsender streams from the slot, so that what
// the test writes next is after the slot's consistent point. A slot being
// created is active too — held by the creating backend while it waits for
// running transactions to end — so "active" alone is not enough: writes
// made then can precede the slot and are rightly never decoded.
func (f *fixture) waitStreaming(t testing.TB) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		var n int
		err := f.checkDB.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots s
			JOIN pg_stat_activity a ON a.pid = s.active_pid
			WHERE s.slot_name = $1 AND a.backend_type = 'walsender'`, f.slot).Scan(&n)
		if err != nil {
			return false, err.Error()
		}
		return n == 1, "no walsender streams from slot " + f.slot
	})
}

// delivered converts what the consumer read.
func delivered(msgs []testenv.Message) []outboxtest.Delivered {
	out := make([]outboxtest.Delivered, 0, len(msgs))
	for _, m := range msgs {
		id, _ := m.Header("id")
		out = append(out, outboxtest.Delivered{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, ID: string(id), Timestamp: m.Timestamp})
	}
	return out
}

// backgroundWriter runs the writer's transactions on its own goroutine until
// stopped or until maxTxns, whichever is first.
type backgroundWriter struct {
	w      *outboxtest.Writer
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	err    error
	events int
}

func startWriter(w *outboxtest.Writer, maxTxns int) *backgroundWriter {
	b := &backgroundWriter{w: w, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for i := 0; i < maxTxns; i++ {
			select {
			case <-b.stop:
				return
			default:
			}
			err := w.Txn(context.Background())
			b.mu.Lock()
			b.events = w.Events()
			b.err = err
			b.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return b
}

// Events is how many events have been committed so far.
func (b *backgroundWriter) Events() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.events
}

// Stop ends the writer and waits for it; it fails the test on a write error.
func (b *backgroundWriter) Stop(t testing.TB) {
	t.Helper()
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
	if b.err != nil {
		t.Fatalf("writer: %v", b.err)
	}
}

// binary builds cmd/pgoutbox once per test process.
var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func pgoutboxBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgoutbox-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "pgoutbox")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/pgoutbox/pgoutbox/cmd/pgoutbox")
		out, err := cmd.CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// process is a running pgoutbox binary whose log goes to a file kept with
// the test's output.
type process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startBinary(t *testing.T, f *fixture, logName string) *process {
	t.Helper()
	bin := pgoutboxBinary(t)
	logPath := filepath.Join(t.TempDir(), logName)
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, []string{"run"}, f.environ(), lf, logPath)
	f.waitStreaming(t)
	return p
}

// startProcess starts bin with args and environ, output to lf (logPath),
// and makes the test's cleanup kill it and show its log on failure.
func startProcess(t *testing.T, bin string, args, environ []string, lf *os.File, logPath string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			lines := strings.Split(string(data), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("%s (last lines):\n%s", filepath.Base(logPath), strings.Join(lines, "\n"))
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *process) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("pgoutbox did not exit within %s", timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// terminate sends SIGTERM and requires a clean exit (code 0) in time.
func (p *process) terminate(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, timeout); code != 0 {
		t.Fatalf("SIGTERM: exit code %d, want 0", code)
	}
}

// peakRSS returns the process's peak resident set (VmHWM) in bytes.
func (p *process) peakRSS() int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb * 1024
		}
	}
	return -1
}

// sessionStarts reads the "replication started" lines of pgoutbox logs:
// when each session started and from which confirmed position.
func sessionStarts(t testing.TB, logs ...string) []outboxtest.Restart {
	t.Helper()
	var out []outboxtest.Restart
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(line, `"msg":"replication started"`) {
				continue
			}
			var rec struct {
				TS        string `json:"ts"`
				Confirmed string `json:"confirmed_lsn"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("%s: %v: %s", path, err, line)
			}
			at, err := time.Parse("2006-01-02T15:04:05.000Z0700", rec.TS)
			if err != nil {
				t.Fatalf("%s: timestamp %q: %v", path, rec.TS, err)
			}
			lsn, err := outboxtest.ParseLSN(rec.Confirmed)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, outboxtest.Restart{At: at, Confirmed: lsn})
		}
	}
	return out
}

// reconnect replaces the fixture's connections after a server restart.
func (f *fixture) reconnect(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var err error
	f.conn, err = pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	t.Cleanup(func() { f.conn.Close(context.Background()) })
	f.checkDB, err = pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	t.Cleanup(func() { f.checkDB.Close(context.Background()) })
}

func parseLSN(s string) (checkpoint.LSN, error) { return outboxtest.ParseLSN(s) }
