package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a primary and a streaming physical standby of the environment's
// PostgreSQL version, on loopback ports of their own, for tests of a
// database failover. The standby is made by copying the stopped primary's
// data directory (pg_basebackup of the same major version is not at hand
// for the npm builds); from PostgreSQL 17 on it synchronizes failover slots
// (sync_replication_slots), and the primary waits for it
// (synchronized_standby_slots).
type Pair struct {
	Dir                      string
	PrimaryPort, StandbyPort int
	Major                    int
	bin, pgUser              string
}

// StandbySlot is the physical slot the standby streams from.
const StandbySlot = "pgoutbox_standby"

// NewPair makes and starts a pair; the test's cleanup stops it and removes
// it.
func (e *Env) NewPair(t testing.TB) *Pair {
	t.Helper()
	p := e.newPairDir(t, "pgoutbox-pair-")
	dir := p.Dir
	p.PrimaryPort, p.StandbyPort = mustFreePort(t), mustFreePort(t)
	p.must(t, "initdb", "-D", p.data("primary"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
wal_level = logical
max_wal_senders = 20
max_replication_slots = 20
hot_standby = on
hot_standby_feedback = on
fsync = off
full_page_writes = off
logging_collector = off
log_line_prefix = '%%m [%%p] %%q%%u@%%d %%a: '
`, dir)
	p.appendConf(t, "primary", conf+fmt.Sprintf("port = %d\n", p.PrimaryPort))
	p.writeFile(t, filepath.Join(p.data("primary"), "pg_hba.conf"),
		"local all all trust\nlocal replication all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n")
	p.start(t, "primary")
	p.Exec(t, p.PrimaryPort, "postgres", "SELECT pg_create_physical_replication_slot($1)", StandbySlot)
	p.must(t, "pg_ctl", "-D", p.data("primary"), "-m", "fast", "-w", "-t", "60", "stop")
	p.must(t, "cp", "-a", p.data("primary"), p.data("standby"))
	_ = os.Remove(filepath.Join(p.data("standby"), "postmaster.pid"))
	standby := fmt.Sprintf("port = %d\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=standby'\nprimary_slot_name = '%s'\n",
		p.StandbyPort, p.PrimaryPort, StandbySlot)
	if p.Major >= 17 {
		standby += "sync_replication_slots = on\n"
		p.appendConf(t, "primary", fmt.Sprintf("synchronized_standby_slots = '%s'\n", StandbySlot))
	}
	p.appendConf(t, "standby", standby)
	p.writeFile(t, filepath.Join(p.data("standby"), "standby.signal"), "")
	p.start(t, "primary")
	p.start(t, "standby")
	Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		var n int
		err := p.queryRow(p.PrimaryPort, "postgres", "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'", &n)
		return err == nil && n == 1, fmt.Sprintf("the standby does not stream (%v)", err)
	})
	return p
}

// newPairDir reads the environment's server build and makes a directory
// for servers, owned by PostgreSQL's user; the test's cleanup stops the
// servers in it and removes it.
func (e *Env) newPairDir(t testing.TB, prefix string) *Pair {
	t.Helper()
	record(t)
	state, err := e.state()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	p := &Pair{bin: state["PG_BIN"], pgUser: state["PG_USER"]}
	if p.Major, err = strconv.Atoi(state["PG_MAJOR"]); err != nil {
		p.Major = 15
	}
	if p.Dir, err = os.MkdirTemp("", prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range []string{"primary", "standby"} {
			if _, err := os.Stat(p.data(d)); err == nil {
				_, _ = p.asPG("pg_ctl", "-D", p.data(d), "-m", "immediate", "-t", "30", "stop")
			}
		}
		_ = os.RemoveAll(p.Dir)
	})
	if err := os.Chmod(p.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := p.chown(p.Dir); err != nil {
		t.Fatal(err)
	}
	return p
}

// DSN is a libpq URL for database db listing both servers, primary first,
// that connects to whichever accepts writes.
func (p *Pair) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		p.PrimaryPort, p.StandbyPort, db)
}

// ServerDSN is a DSN of one of the servers.
func (p *Pair) ServerDSN(port int, db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, db)
}

// CreateDatabase creates db on the primary (the standby replays it).
func (p *Pair) CreateDatabase(t testing.TB, db string) {
	t.Helper()
	p.Exec(t, p.PrimaryPort, "postgres", "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
}

// KillPrimary stops the primary as a crash would (immediate shutdown).
func (p *Pair) KillPrimary(t testing.TB) {
	t.Helper()
	p.must(t, "pg_ctl", "-D", p.data("primary"), "-m", "immediate", "-t", "60", "stop")
}

// Promote makes the standby the primary and waits until it accepts writes.
func (p *Pair) Promote(t testing.TB) {
	t.Helper()
	p.must(t, "pg_ctl", "-D", p.data("standby"), "-w", "-t", "60", "promote")
	Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		var rec bool
		err := p.queryRow(p.StandbyPort, "postgres", "SELECT pg_is_in_recovery()", &rec)
		return err == nil && !rec, fmt.Sprintf("the standby is still in recovery (%v)", err)
	})
}

// StopPrimary stops the primary (a fast shutdown), and StartPrimary starts
// it again.
func (p *Pair) StopPrimary(t testing.TB) {
	t.Helper()
	p.must(t, "pg_ctl", "-D", p.data("primary"), "-m", "fast", "-w", "-t", "60", "stop")
}

func (p *Pair) StartPrimary(t testing.TB) {
	t.Helper()
	p.start(t, "primary")
}

// SaveData copies the stopped primary's data directory aside under name:
// a backup (or a disk snapshot) of that moment.
func (p *Pair) SaveData(t testing.TB, name string) {
	t.Helper()
	p.must(t, "cp", "-a", p.data("primary"), p.data(name))
}

// RestoreKeepingSlots puts the copy saved under name back in place of the
// stopped primary's data directory, but with the primary's pg_replslot of
// now, as pg_rewind leaves it, or a restore that keeps the slots'
// directory: the slots may then hold positions past the end of the WAL.
func (p *Pair) RestoreKeepingSlots(t testing.TB, name string) {
	t.Helper()
	p.must(t, "mv", p.data("primary"), p.data("replaced"))
	p.must(t, "mv", p.data(name), p.data("primary"))
	p.must(t, "rm", "-rf", filepath.Join(p.data("primary"), "pg_replslot"))
	p.must(t, "cp", "-a", filepath.Join(p.data("replaced"), "pg_replslot"), filepath.Join(p.data("primary"), "pg_replslot"))
}

// Log returns the tail of a server's log ("primary" or "standby").
func (p *Pair) Log(which string) string {
	b, _ := os.ReadFile(filepath.Join(p.Dir, which+".log"))
	s := string(b)
	if len(s) > 8000 {
		s = s[len(s)-8000:]
	}
	return s
}

func (p *Pair) data(which string) string { return filepath.Join(p.Dir, which) }

func (p *Pair) start(t testing.TB, which string) {
	t.Helper()
	p.must(t, "pg_ctl", "-D", p.data(which), "-l", filepath.Join(p.Dir, which+".log"), "-w", "-t", "60", "start")
}

func (p *Pair) appendConf(t testing.TB, which, text string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(p.data(which), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

func (p *Pair) writeFile(t testing.TB, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.chown(path); err != nil {
		t.Fatal(err)
	}
}

// Exec runs a statement on one of the servers, failing the test on an
// error.
func (p *Pair) Exec(t testing.TB, port int, db, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.ServerDSN(port, db))
	if err != nil {
		t.Fatalf("testenv: connect to %d: %v", port, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
}

func (p *Pair) queryRow(port int, db, sql string, dst ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.ServerDSN(port, db))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(dst...)
}

// QueryRow runs a query on one of the servers.
func (p *Pair) QueryRow(port int, db, sql string, dst ...any) error {
	return p.queryRow(port, db, sql, dst...)
}

func (p *Pair) must(t testing.TB, prog string, args ...string) {
	t.Helper()
	if out, err := p.asPG(prog, args...); err != nil {
		t.Fatalf("testenv: %s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

// asPG runs a program as PostgreSQL's user (the server refuses root).
func (p *Pair) asPG(prog string, args ...string) (string, error) {
	path := prog
	switch prog {
	case "cp", "mv", "rm": // the system's
	default:
		path = filepath.Join(p.bin, prog)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if os.Geteuid() == 0 && p.pgUser != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", p.pgUser, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = "/"
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p *Pair) chown(path string) error {
	if os.Geteuid() != 0 || p.pgUser == "" {
		return nil
	}
	u, err := user.Lookup(p.pgUser)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

func mustFreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// state reads the environment's state file (KEY=value lines).
func (e *Env) state() (map[string]string, error) {
	if e.Dir == "" {
		return nil, fmt.Errorf("%s is not set", envDir)
	}
	b, err := os.ReadFile(filepath.Join(e.Dir, "state"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = strings.Trim(v, "'\"")
		}
	}
	return out, nil
}

// NewServer makes and starts one server of the environment's version on a
// loopback port of its own (PrimaryPort; the Pair has no standby), for a
// test that needs what a shared server cannot give: after initdb, and
// before the first start, pg_resetwal runs with resetwal's arguments when
// there are any (e.g. "-e", "1": the next transaction id in epoch 1, as on
// a server that has used 2^32 of them). The npm builds have no
// pg_resetwal; with arguments the test is skipped on them. The test's
// cleanup stops and removes the server.
func (e *Env) NewServer(t testing.TB, resetwal ...string) *Pair {
	t.Helper()
	if len(resetwal) > 0 {
		state, err := e.state()
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if _, err := os.Stat(filepath.Join(state["PG_BIN"], "pg_resetwal")); err != nil {
			t.Skipf("testenv: PostgreSQL %s here has no pg_resetwal (%v); PostgreSQL 15 (make test) has", state["PG_MAJOR"], err)
		}
	}
	p := e.newPairDir(t, "pgoutbox-server-")
	dir := p.Dir
	p.PrimaryPort = mustFreePort(t)
	p.must(t, "initdb", "-D", p.data("primary"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if len(resetwal) > 0 {
		p.must(t, "pg_resetwal", append(resetwal, "-D", p.data("primary"))...)
	}
	p.appendConf(t, "primary", fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
port = %d
wal_level = logical
fsync = off
full_page_writes = off
logging_collector = off
`, dir, p.PrimaryPort))
	p.writeFile(t, filepath.Join(p.data("primary"), "pg_hba.conf"),
		"local all all trust\nlocal replication all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n")
	p.start(t, "primary")
	return p
}
