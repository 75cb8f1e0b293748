package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envDebezium names the directory scripts/debezium/fetch.sh prints: the
// Kafka Connect worker's class path (connect/) and Debezium's PostgreSQL
// connector as a Connect plugin (plugins/).
const envDebezium = "PGOUTBOX_DEBEZIUM_LIBS"

const howToDebezium = "Debezium is not fetched: run `make test-debezium` (or set " + envDebezium + " to the directory scripts/debezium/fetch.sh prints)"

// connectStopTimeout bounds a worker's clean stop; past it the JVM is
// killed.
const connectStopTimeout = 60 * time.Second

// DebeziumLibs returns the directory of Kafka Connect's and Debezium's jars
// (PGOUTBOX_DEBEZIUM_LIBS), or skips the test when it is not set (fails it
// when PGOUTBOX_REQUIRE_INTEGRATION=1 and PGOUTBOX_REQUIRE_DEBEZIUM=1).
func DebeziumLibs(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(envDebezium)
	if dir == "" {
		if os.Getenv("PGOUTBOX_REQUIRE_DEBEZIUM") == "1" {
			t.Fatal(howToDebezium)
		}
		t.Skip(howToDebezium)
	}
	for _, sub := range []string{"connect", "plugins"} {
		if st, err := os.Stat(filepath.Join(dir, sub)); err != nil || !st.IsDir() {
			t.Fatalf("testenv: %s=%s has no %s/ directory: run scripts/debezium/fetch.sh", envDebezium, dir, sub)
		}
	}
	return dir
}

// ConnectConfig describes a Kafka Connect standalone worker.
type ConnectConfig struct {
	// Libs is DebeziumLibs' directory.
	Libs string
	// Dir holds the worker's files: its properties, the offset file and
	// its log (connect.log).
	Dir string
	// Connectors are connector configuration files, JSON as POSTed to
	// Kafka Connect ({"name": ..., "config": {...}}), started at once.
	Connectors []string
	// OffsetFlushInterval is offset.flush.interval.ms: how often the
	// worker commits source offsets (and so how often Debezium confirms
	// its slot). Zero means Kafka Connect's default, 60 s.
	OffsetFlushInterval time.Duration
	// Worker adds or overrides worker properties.
	Worker map[string]string
	// Env adds environment variables to the JVM's (for ${env:...}).
	Env []string
	// Brokers are the Kafka brokers (StartConnect: the environment's).
	Brokers []string
	// JVMOptions replace the tests' heap and JVM flags (testConnectJVM).
	JVMOptions []string
}

// testConnectJVM are the JVM options of the tests' workers.
var testConnectJVM = []string{"-Xms256m", "-Xmx1g", "-XX:+ExitOnOutOfMemoryError", "-XX:-UsePerfData", "-Djava.awt.headless=true"}

// Connect is a running Kafka Connect standalone worker.
type Connect struct {
	cfg     ConnectConfig
	rest    string // http://127.0.0.1:PORT
	logPath string
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{}
	waitErr error
}

// StartConnect starts a standalone worker with e's broker and cfg's
// connectors, on loopback, and waits until its REST interface answers (the
// connectors are then created; their tasks start asynchronously). The
// test's cleanup stops it.
func (e *Env) StartConnect(t testing.TB, cfg ConnectConfig) *Connect {
	t.Helper()
	cfg.Brokers = e.KafkaBrokers
	c, err := LaunchConnect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(t) })
	Eventually(t, 120*time.Second, 200*time.Millisecond, func() (bool, string) {
		if err := c.Exited(); err != nil {
			t.Fatalf("testenv: Kafka Connect exited at start-up (%v); log tail:\n%s", err, c.LogTail(40))
		}
		var names []string
		err := c.get("/connectors", &names)
		return err == nil && len(names) == len(cfg.Connectors), fmt.Sprintf("Kafka Connect's REST interface at %s: connectors %v, %v", c.rest, names, err)
	})
	return c
}

// LaunchConnect starts a standalone worker as cfg says, on loopback, and
// returns at once, without waiting for its REST interface (for programs
// such as the benchmark; tests use StartConnect). The caller stops it with
// Close.
func LaunchConnect(cfg ConnectConfig) (*Connect, error) {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("testenv: a port for Kafka Connect: %w", err)
	}
	props := map[string]string{
		"bootstrap.servers":                 strings.Join(cfg.Brokers, ","),
		"key.converter":                     "org.apache.kafka.connect.json.JsonConverter",
		"value.converter":                   "org.apache.kafka.connect.json.JsonConverter",
		"offset.storage.file.filename":      filepath.Join(cfg.Dir, "offsets"),
		"plugin.path":                       filepath.Join(cfg.Libs, "plugins"),
		"listeners":                         "http://127.0.0.1:" + strconv.Itoa(port),
		"rest.advertised.host.name":         "127.0.0.1",
		"plugin.discovery":                  "service_load",
		"task.shutdown.graceful.timeout.ms": "10000",
	}
	if cfg.OffsetFlushInterval > 0 {
		props["offset.flush.interval.ms"] = strconv.FormatInt(cfg.OffsetFlushInterval.Milliseconds(), 10)
	}
	for k, v := range cfg.Worker {
		props[k] = v
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# Written by pkg/testenv: a Kafka Connect standalone worker for tests.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	workerProps := filepath.Join(cfg.Dir, "worker.properties")
	if err := os.WriteFile(workerProps, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(cfg.Dir, "connect.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	jvm := cfg.JVMOptions
	if jvm == nil {
		jvm = testConnectJVM
	}
	args := append(append([]string{}, jvm...),
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSX",
		"-cp", filepath.Join(cfg.Libs, "connect", "*"),
		"org.apache.kafka.connect.cli.ConnectStandalone", workerProps)
	args = append(args, cfg.Connectors...)
	cmd := exec.Command("java", args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c := &Connect{cfg: cfg, rest: "http://127.0.0.1:" + strconv.Itoa(port), logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	c.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start Kafka Connect: %w", err)
	}
	go func() {
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// PID is the worker's process id (the JVM's).
func (c *Connect) PID() int { return c.cmd.Process.Pid }

// Started is when the worker's process was started.
func (c *Connect) Started() time.Time { return c.started }

// Exited returns nil while the worker runs, and how it ended once it has.
func (c *Connect) Exited() error {
	if !c.hasExited() {
		return nil
	}
	if c.waitErr != nil {
		return c.waitErr
	}
	return errors.New("exited")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TaskStatus is one connector task's state as Kafka Connect reports it.
type TaskStatus struct {
	ID    int    `json:"id"`
	State string `json:"state"` // RUNNING, FAILED, PAUSED, UNASSIGNED, ...
	Trace string `json:"trace"` // the failure's stack trace, for FAILED
}

// ConnectorStatus is GET /connectors/NAME/status.
type ConnectorStatus struct {
	Name      string `json:"name"`
	Connector struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"connector"`
	Tasks []TaskStatus `json:"tasks"`
}

// Failed returns the first failure's trace (the connector's or a task's),
// or "" when nothing failed.
func (s ConnectorStatus) Failed() string {
	if s.Connector.State == "FAILED" {
		return s.Connector.Trace
	}
	for _, tk := range s.Tasks {
		if tk.State == "FAILED" {
			return tk.Trace
		}
	}
	return ""
}

// Status returns a connector's status.
func (c *Connect) Status(name string) (ConnectorStatus, error) {
	var s ConnectorStatus
	err := c.get("/connectors/"+name+"/status", &s)
	return s, err
}

func (c *Connect) get(path string, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.rest+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(body.String()))
	}
	return json.Unmarshal(body.Bytes(), out)
}

// Stop stops the worker with SIGTERM (Kafka Connect then stops its tasks and
// commits their offsets) and waits; after connectStopTimeout it kills the
// JVM. Stopping twice is harmless.
func (c *Connect) Stop(t testing.TB) {
	t.Helper()
	if err := c.Close(connectStopTimeout); err != nil {
		t.Logf("testenv: %v", err)
	}
}

// Close stops the worker with SIGTERM and waits; after timeout it kills
// the JVM and says so. Closing twice is harmless.
func (c *Connect) Close(timeout time.Duration) error {
	if c.hasExited() {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		return nil
	case <-time.After(timeout):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
		return fmt.Errorf("kafka Connect still ran %s after SIGTERM: killed it", timeout)
	}
}

// Kill stops the worker with SIGKILL: nothing is committed on the way out.
func (c *Connect) Kill(t testing.TB) {
	t.Helper()
	if !c.hasExited() {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	}
}

func (c *Connect) hasExited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// LogTail returns the last n lines of the worker's log.
func (c *Connect) LogTail(n int) string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogPath is the worker's log file.
func (c *Connect) LogPath() string { return c.logPath }
