package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// Debezium runs as in the common Kafka Connect setup: one standalone worker
// (org.apache.kafka.connect.cli.ConnectStandalone) with the connector as a
// plugin, its offsets in a file, the JVM options of Kafka's
// connect-standalone.sh and kafka-run-class.sh (heap -Xms256M -Xmx2G, G1),
// and the connector JSON a user POSTs: String keys, JsonConverter values
// without schemas, the outbox EventRouter. scripts/debezium/fetch.sh
// fetches the jars; Options.DebeziumLibs is the directory it prints.

// connectJVMOptions are connect-standalone.sh's heap and kafka-run-class.sh's
// performance options (the worker adds its logging options).
var connectJVMOptions = []string{
	"-Xms256M", "-Xmx2G",
	"-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
	"-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
}

// connectorJSON returns the connector JSON (as POSTed to Kafka Connect)
// of connectorConfig.
func (h *harness) connectorJSON(name, slot, topicPrefix string, extra map[string]string) ([]byte, error) {
	cfg, err := h.connectorConfig(slot, topicPrefix, extra)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(map[string]any{"name": name, "config": cfg}, "", "  ")
}

// dsnParts returns what a connector JSON names of a postgres:// DSN.
func dsnParts(dsn string) (host, port, user, db string, err error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", "", "", "", fmt.Errorf("parse the PostgreSQL DSN: %w", err)
	}
	if cfg.Password != "" {
		return "", "", "", "", fmt.Errorf("the benchmark's DSN has a password: the connector JSON would carry it (use a test environment with trust authentication)")
	}
	return cfg.Host, strconv.Itoa(int(cfg.Port)), cfg.User, cfg.Database, nil
}

// connectProc is a running Kafka Connect standalone worker.
type connectProc struct{ c *testenv.Connect }

// startConnect starts a worker in dir with the connector file, offsets in
// a fresh file and offset.flush.interval.ms at Kafka Connect's default
// unless worker says otherwise.
func (h *harness) startConnect(dir, connector string, worker map[string]string) (*connectProc, error) {
	props := map[string]string{
		// Start-up only: the worker finds plugins by their service
		// manifests instead of scanning every class (Kafka Connect 3.6+).
		"plugin.discovery": "service_load",
	}
	for k, v := range worker {
		props[k] = v
	}
	_ = os.Remove(filepath.Join(dir, "offsets")) // the worker's offset file: start from the slot
	c, err := testenv.LaunchConnect(testenv.ConnectConfig{Libs: h.o.DebeziumLibs, Dir: dir, Connectors: []string{connector},
		Worker: props, Brokers: h.o.Brokers, JVMOptions: connectJVMOptions})
	if err != nil {
		return nil, err
	}
	return &connectProc{c: c}, nil
}

func (p *connectProc) pid() int             { return p.c.PID() }
func (p *connectProc) started() time.Time   { return p.c.Started() }
func (p *connectProc) logTail(n int) string { return p.c.LogTail(n) }
func (p *connectProc) name() string         { return "Kafka Connect" }

func (p *connectProc) exited() error {
	if err := p.c.Exited(); err != nil {
		return fmt.Errorf("kafka Connect exited early (%v); last log lines:\n%s", err, p.logTail(20))
	}
	return nil
}

// failed returns the connector's or its task's failure trace (its first
// lines), or "" while nothing failed or the REST interface is not up yet.
func (p *connectProc) failed(connector string) string {
	st, err := p.c.Status(connector)
	if err != nil {
		return ""
	}
	return firstLines(st.Failed(), 3)
}

// stop stops the worker with SIGTERM (it stops the task, which commits its
// offsets, so Debezium confirms its slot) and waits; after timeout it kills
// the JVM.
func (p *connectProc) stop(timeout time.Duration) error { return p.c.Close(timeout) }

func firstLines(s string, n int) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "at ") || strings.HasPrefix(l, "...") {
			continue
		}
		if keep = append(keep, l); len(keep) == n {
			break
		}
	}
	return strings.Join(keep, " / ")
}

func fileTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
