package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment variables shared with scripts/testenv.sh and the Makefile.
const (
	envDir     = "PGOUTBOX_TEST_ENV_DIR"
	envPGDSN   = "PGOUTBOX_TEST_PG_DSN"
	envPGPort  = "PGOUTBOX_TEST_PG_PORT"
	envPGBin   = "PGOUTBOX_TEST_PG_BIN"
	envPGMajor = "PGOUTBOX_TEST_PG_MAJOR"
	envKafka   = "PGOUTBOX_TEST_KAFKA"
	envRequire = "PGOUTBOX_REQUIRE_INTEGRATION"
	envMarker  = "PGOUTBOX_INTEGRATION_MARKER"
)

const howTo = "integration environment missing: run `make test` or scripts/testenv.sh exec -- go test ./..."

// scriptTimeout bounds one call of scripts/testenv.sh: the script's own
// waits are shorter (Kafka: 60 s to stop, 90 s to become ready).
const scriptTimeout = 5 * time.Minute

// Env is the running test environment.
type Env struct {
	// PGDSN is a superuser DSN of the server's postgres database. Tests
	// should work in a database of their own: see NewDatabase.
	PGDSN string
	// PGPort is PostgreSQL's port on 127.0.0.1.
	PGPort int
	// PGBin is the directory of PostgreSQL's client programs
	// (pg_recvlogical, psql): Debian's 15 for the later servers, whose
	// builds have none.
	PGBin string
	// PGMajor is the server's major version the environment was made with
	// (PGOUTBOX_TEST_PG_MAJOR; 0 when unset). NewDatabase fails the test
	// when the running server is another one.
	PGMajor int
	// KafkaBrokers are the broker addresses.
	KafkaBrokers []string
	// Dir is the environment's directory; empty when the servers were
	// given without one, and then they cannot be stopped or started.
	Dir string

	// exclusive: the test holds the environment (RequireExclusive) and may
	// stop PostgreSQL and the single broker. heal is the script command
	// that restarts, before a cleanup needs them, the servers the test may
	// have stopped ("" when it may stop none).
	exclusive bool
	heal      string
	// topics is how CreateTopic makes topics: on the single broker one
	// replica, on the cluster three and min.insync.replicas=2.
	topics TopicSpec
}

// Require returns the environment, or skips the test when there is none
// (fails it instead when PGOUTBOX_REQUIRE_INTEGRATION=1). The test shares
// the servers with other tests: it must not stop or pause them (see
// RequireExclusive).
func Require(t testing.TB) *Env {
	t.Helper()
	e := fromEnviron(t)
	e.lock(t, false)
	record(t)
	return e
}

// RequireExclusive is Require for a test that stops, pauses or restarts a
// server: it waits until no other test holds the environment and keeps the
// others waiting until the test and its cleanups are over. At the end it
// resumes or restarts whatever the test left paused or stopped. Call it
// instead of Require, not after it.
func RequireExclusive(t testing.TB) *Env {
	t.Helper()
	e := fromEnviron(t)
	if e.Dir == "" {
		t.Fatalf("testenv: %s is not set, so the servers cannot be stopped or started", envDir)
	}
	e.lock(t, true)
	e.exclusive, e.heal = true, "heal"
	// Registered after the lock's release, so it runs before it.
	t.Cleanup(func() {
		if _, err := e.run("heal"); err != nil {
			t.Errorf("testenv: restarting the servers after the test: %v", err)
		}
	})
	record(t)
	return e
}

func fromEnviron(t testing.TB) *Env {
	t.Helper()
	dsn, brokers := os.Getenv(envPGDSN), os.Getenv(envKafka)
	if dsn == "" || brokers == "" {
		if os.Getenv(envRequire) == "1" {
			t.Fatal(howTo)
		}
		t.Skip(howTo)
	}
	e := &Env{
		PGDSN:  dsn,
		PGBin:  os.Getenv(envPGBin),
		Dir:    os.Getenv(envDir),
		topics: TopicSpec{ReplicationFactor: 1},
	}
	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			e.KafkaBrokers = append(e.KafkaBrokers, b)
		}
	}
	if m := os.Getenv(envPGMajor); m != "" {
		major, err := strconv.Atoi(m)
		if err != nil {
			t.Fatalf("testenv: %s=%q: %v", envPGMajor, m, err)
		}
		e.PGMajor = major
	}
	if p := os.Getenv(envPGPort); p != "" {
		port, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("testenv: %s=%q: %v", envPGPort, p, err)
		}
		e.PGPort = port
	}
	return e
}

var markerMu sync.Mutex

// record notes in $PGOUTBOX_INTEGRATION_MARKER that an integration test ran.
func record(t testing.TB) {
	t.Helper()
	path := os.Getenv(envMarker)
	if path == "" {
		return
	}
	wd, _ := os.Getwd()
	markerMu.Lock()
	defer markerMu.Unlock()
	// O_APPEND keeps lines from concurrent test processes whole.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatalf("testenv: recording the test in %s: %v", path, err)
	}
	_, err = fmt.Fprintf(f, "%s\t%s\n", wd, t.Name())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("testenv: recording the test in %s: %v", path, err)
	}
}

// KafkaStop sends signal ("TERM", "KILL", "INT", ...) to the broker and
// waits until it has exited (after 60 s, it sends KILL). The broker keeps its
// data and ports for KafkaStart. After KILL, the next KafkaStart takes about
// 15 s: the restarted broker may register only once the killed one's
// session (broker.session.timeout.ms) has expired. Needs RequireExclusive.
func (e *Env) KafkaStop(t testing.TB, signal string) {
	t.Helper()
	e.control(t, "kafka-stop", signal)
}

// KafkaStart starts the broker again with the same configuration, data and
// port, and waits until it serves metadata with a leader for every
// partition. Needs RequireExclusive.
func (e *Env) KafkaStart(t testing.TB) {
	t.Helper()
	e.control(t, "kafka-start")
}

// KafkaPause freezes the broker (SIGSTOP): connections stay open and
// requests go unanswered. Needs RequireExclusive.
func (e *Env) KafkaPause(t testing.TB) {
	t.Helper()
	e.control(t, "kafka-pause")
}

// KafkaResume undoes KafkaPause (SIGCONT). Needs RequireExclusive.
func (e *Env) KafkaResume(t testing.TB) {
	t.Helper()
	e.control(t, "kafka-resume")
}

// PGCtl runs pg_ctl on the server's data directory as the server's user
// and returns its output, e.g. PGCtl(t, "restart", "-m", "immediate"),
// PGCtl(t, "stop", "-m", "fast"), PGCtl(t, "start", "-w"). It fails the test
// if pg_ctl fails. Needs RequireExclusive.
func (e *Env) PGCtl(t testing.TB, args ...string) string {
	t.Helper()
	return e.control(t, append([]string{"pg-ctl"}, args...)...)
}

// ensureUp restarts, in an exclusive test, whatever the test left stopped
// or paused, so that cleanups that need the servers (dropping the test's
// database, deleting its topics) can run before RequireExclusive's own.
func (e *Env) ensureUp() error {
	if e.heal == "" {
		return nil
	}
	_, err := e.run(e.heal)
	return err
}

func (e *Env) control(t testing.TB, args ...string) string {
	t.Helper()
	if !e.exclusive {
		t.Fatalf("testenv: %s disrupts every test that shares the servers: get the Env with RequireExclusive", args[0])
	}
	out, err := e.run(args...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return out
}

// run calls scripts/testenv.sh on this environment.
func (e *Env) run(args ...string) (string, error) {
	if e.Dir == "" {
		return "", fmt.Errorf("%s is not set, so the servers cannot be controlled", envDir)
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "scripts", "testenv.sh")}, args...)...)
	cmd.Env = append(os.Environ(), envDir+"="+e.Dir)
	cmd.Dir = root
	// Should a server ever inherit the output pipe, do not wait for it.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("scripts/testenv.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// repoRoot finds the module root by walking up from the working directory
// (a test runs in its package's directory) to go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "scripts", "testenv.sh")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: no go.mod with scripts/testenv.sh above the working directory")
		}
		dir = parent
	}
}
