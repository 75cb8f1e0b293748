package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
)

// outboxTable is the table the benchmark writes, in the run's database. It
// has Debezium's shape, as `pgoutbox migrate` creates it.
const outboxTable = "public.outbox"

// harness is one run's shared state.
type harness struct {
	o      Options
	runID  string // short random suffix of every name the run creates
	dsn    string // the database the run works in
	pub    string
	admin  *pgx.Conn // on the run's database; used by the main goroutine only
	kcfg   kafka.Config
	logDir string

	// variantEnv is the running variant's settings, and variantTag what
	// its scenarios add to their names.
	variantEnv []string
	variantTag string

	// fsyncChanged: the writers scenario changed the server's fsync,
	// which the teardown resets.
	fsyncChanged bool

	mu     sync.Mutex
	topics []string

	// eos: the pgoutbox being started runs with kafka.exactly.once.
	eos bool
}

// mode names the delivery mode of the pgoutbox being started.
func (h *harness) mode() string {
	if h.eos {
		return "exactly-once"
	}
	return "at-least-once"
}

// Run runs the enabled scenarios and writes results.json, summary.md and
// latency.png into o.Out. A scenario that fails is recorded (its error is
// in the results) and the others still run; Run then returns an error after
// writing the outputs.
func Run(ctx context.Context, o Options) (*Results, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	h := &harness{o: o, runID: randomID(), kcfg: kafka.Config{Brokers: o.Brokers, ClientID: "pgoutbox-bench"}}
	res := &Results{Mode: "full", StartedAt: time.Now().UTC()}
	if o.Smoke {
		res.Mode = "smoke"
	}
	var err error
	if o.Pgoutbox, err = filepath.Abs(o.Pgoutbox); err != nil {
		return nil, err
	}
	if _, err := os.Stat(o.Pgoutbox); err != nil {
		return nil, fmt.Errorf("pgoutbox binary: %w (build it with go build -o bin/pgoutbox ./cmd/pgoutbox)", err)
	}
	h.o = o
	h.logDir = filepath.Join(o.Out, "logs")
	if err := os.MkdirAll(h.logDir, 0o755); err != nil {
		return nil, err
	}
	res.Machine = machineInfo()
	res.Settings = settingsOf(o, h.runID)

	h.logf("run %s (%s mode): preparing database", h.runID, res.Mode)
	if err := h.setupDatabase(ctx); err != nil {
		return nil, err
	}
	defer h.teardown()
	res.Versions = versions(ctx, h)
	res.Settings.PostgresSettings = postgresSettings(ctx, h)

	var failed []error
	record := func(name string, err error) {
		if err != nil {
			h.logf("%s: FAILED: %v", name, err)
			failed = append(failed, fmt.Errorf("%s: %w", name, err))
		}
	}
	if o.ExactlyOnce && (o.enabled(ScenarioCatchup) || o.enabled(ScenarioLatency)) {
		record("exactly-once: the transaction coordinator", h.warmTxnCoordinator(ctx))
	}
	if len(o.Variants) > 0 {
		failed = append(failed, h.variants(ctx, res)...)
	}
	if len(o.Variants) == 0 {
		res.Catchup, res.Latency = h.walScenarios(ctx, record)
	}
	if o.enabled(ScenarioPoll) && ctx.Err() == nil {
		h.runPoll(ctx, res, record)
	}
	if o.enabled(ScenarioDebezium) && ctx.Err() == nil {
		failed = append(failed, h.versus(ctx, res)...)
	}
	if o.enabled(ScenarioScaling) && ctx.Err() == nil {
		failed = append(failed, h.scaling(ctx, res)...)
	}
	if o.enabled(ScenarioWriters) && ctx.Err() == nil {
		failed = append(failed, h.writers(ctx, res)...)
	}
	if o.enabled(ScenarioMicro) && ctx.Err() == nil {
		h.logf("micro-benchmarks: go test -bench (benchtime %s)", o.BenchTime)
		m := runMicro(ctx, o)
		res.Micro = &m
		if m.Error != "" {
			record("micro-benchmarks", errors.New(m.Error))
		}
	}
	if ctx.Err() != nil {
		failed = append(failed, ctx.Err())
	}
	res.FinishedAt = time.Now().UTC()
	res.Machine.LoadAvgEnd = loadAvg()
	res.Targets = targets(res)
	res.Notes = notes(res)
	if err := writeOutputs(o.Out, res); err != nil {
		return res, err
	}
	h.logf("wrote %s, %s, %s", res.Files.JSON, res.Files.Summary, res.Files.Plot)
	return res, errors.Join(failed...)
}

// walScenarios runs the WAL source's catch-up and latency scenarios that
// are enabled, passing each point's name and error to record. A cancelled
// ctx stops it between points.
func (h *harness) walScenarios(ctx context.Context, record func(string, error)) (cu []CatchupResult, lat []LatencyResult) {
	o := h.o
	if o.enabled(ScenarioCatchup) {
		for _, size := range o.TxnSizes {
			if ctx.Err() != nil {
				return cu, lat
			}
			r, err := h.catchup(ctx, size)
			if err != nil {
				r.Error = err.Error()
			}
			cu = append(cu, r)
			record(fmt.Sprintf("catch-up, %d-event transactions", size), err)
		}
	}
	if o.enabled(ScenarioLatency) {
		for _, rate := range o.Rates {
			for _, eos := range []bool{false, true} {
				if ctx.Err() != nil {
					return cu, lat
				}
				if eos && !o.ExactlyOnce {
					break
				}
				h.eos = eos
				r, err := h.latency(ctx, rate, h.walSource())
				h.eos = false
				if err != nil {
					r.Error = err.Error()
				}
				lat = append(lat, r)
				record(fmt.Sprintf("latency at %d events/s (%s)", rate, r.Mode), err)
			}
		}
	}
	return cu, lat
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.o.Log, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func randomID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// name returns a name unique to the run: valid as a slot, publication,
// aggregate type and (after outbox.event.) topic.
func (h *harness) name(parts ...string) string {
	return "bench_" + h.runID + "_" + strings.Join(parts, "_")
}

// setupDatabase creates the run's database (when o.Database is set), the
// outbox table and the publication.
func (h *harness) setupDatabase(ctx context.Context) error {
	h.dsn = h.o.PGDSN
	if h.o.Database != "" {
		dsn, err := withDatabase(h.o.PGDSN, h.o.Database)
		if err != nil {
			return err
		}
		conn, err := pgx.Connect(ctx, h.o.PGDSN)
		if err != nil {
			return fmt.Errorf("connect to PostgreSQL: %w", err)
		}
		defer conn.Close(context.Background())
		if err := dropDatabase(ctx, conn, h.o.Database); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+h.o.Database); err != nil {
			return fmt.Errorf("create database %s: %w", h.o.Database, err)
		}
		h.dsn = dsn
	}
	var err error
	if h.admin, err = pgx.Connect(ctx, h.dsn); err != nil {
		return fmt.Errorf("connect to the benchmark database: %w", err)
	}
	h.pub = h.name("pub")
	_, err = h.admin.Exec(ctx, `CREATE TABLE `+outboxTable+` (
		id uuid PRIMARY KEY,
		aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL,
		payload jsonb,
		created_at timestamptz NOT NULL DEFAULT now())`)
	if err != nil {
		return fmt.Errorf("create %s (the benchmark wants a database of its own: see --database): %w", outboxTable, err)
	}
	if _, err := h.admin.Exec(ctx, "CREATE PUBLICATION "+h.pub+" FOR TABLE "+outboxTable+" WITH (publish = 'insert')"); err != nil {
		return fmt.Errorf("create publication: %w", err)
	}
	return nil
}

// teardown drops what the run created: its slots, topics, and (unless
// kept) the database.
func (h *harness) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if h.admin != nil {
		if err := h.resetFsync(ctx); err != nil {
			h.logf("%v", err)
		}
		rows, err := h.admin.Query(ctx, "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE $1", "bench\\_"+h.runID+"\\_%")
		if err == nil {
			slots, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			for _, s := range slots {
				h.dropSlot(ctx, s)
			}
		}
		_, _ = h.admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+h.pub)
		if h.o.Database == "" {
			_, _ = h.admin.Exec(ctx, "DROP TABLE IF EXISTS "+outboxTable)
		}
		_ = h.admin.Close(ctx)
	}
	h.mu.Lock()
	topics := h.topics
	h.mu.Unlock()
	if len(topics) > 0 {
		if err := kafkatest.DeleteTopics(h.kcfg, topics); err != nil {
			h.logf("deleting topics: %v", err)
		}
	}
	if h.o.Database != "" && !h.o.KeepDatabase {
		conn, err := pgx.Connect(ctx, h.o.PGDSN)
		if err == nil {
			if err := dropDatabase(ctx, conn, h.o.Database); err != nil {
				h.logf("dropping database %s: %v", h.o.Database, err)
			}
			_ = conn.Close(ctx)
		}
	}
}

// createTopic creates a topic for one scenario, with the given topic
// configuration entries, and remembers it for the teardown.
func (h *harness) createTopic(topic string, configs map[string]string) error {
	h.mu.Lock()
	h.topics = append(h.topics, topic)
	h.mu.Unlock()
	return kafka.CreateTopicsWithConfig(h.kcfg, []string{topic}, int32(h.o.Partitions), 1, configs)
}

// dropSlot drops a slot, waiting (bounded) for a walsender that is still
// going away after its client exited.
func (h *harness) dropSlot(ctx context.Context, slot string) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := h.admin.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		if err == nil || sqlState(err) == "42704" { // gone already
			return
		}
		if sqlState(err) != "55006" || time.Now().After(deadline) { // 55006: still active
			h.logf("drop slot %s: %v", slot, err)
			return
		}
		time.Sleep(50 * time.Millisecond) // the walsender exits within moments
	}
}

// dropDatabase drops a database after dropping its replication slots and
// terminating its sessions (walsenders included).
func dropDatabase(ctx context.Context, conn *pgx.Conn, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
			return fmt.Errorf("terminate sessions of %s: %w", name, err)
		}
		rows, err := conn.Query(ctx, "SELECT slot_name FROM pg_replication_slots WHERE database = $1", name)
		if err != nil {
			return fmt.Errorf("list slots of %s: %w", name, err)
		}
		slots, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("list slots of %s: %w", name, err)
		}
		if len(slots) == 0 {
			break
		}
		for _, s := range slots {
			_, _ = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", s)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication slots of %s still there: %v", name, slots)
		}
		time.Sleep(100 * time.Millisecond) // terminated walsenders release their slots shortly
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

func sqlState(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState()
	}
	return ""
}

// withDatabase returns dsn with its database replaced.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse the PostgreSQL DSN: %w", err)
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil // keyword=value form: a later keyword wins
}

// relayEnv is the environment of a pgoutbox process on slot: the bench's own
// settings, then extra (a scenario's), then --pgoutbox-env, then the running
// variant's (--variant). PGOUTBOX_* variables of the caller's environment are
// left out so that a run is configured only by what results.json records.
func (h *harness) relayEnv(slot string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PGOUTBOX_") {
			continue
		}
		env = append(env, kv)
	}
	if h.eos {
		env = append(env, "PGOUTBOX_KAFKA_EXACTLY_ONCE=true", "PGOUTBOX_KAFKA_OFFSETS_TOPIC="+h.name("offsets"))
	}
	env = append(env,
		"PGOUTBOX_POSTGRES_DSN="+h.dsn,
		"PGOUTBOX_POSTGRES_SLOT_NAME="+slot,
		"PGOUTBOX_POSTGRES_PUBLICATION_NAME="+h.pub,
		"PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST="+outboxTable,
		"PGOUTBOX_KAFKA_BROKERS="+strings.Join(h.o.Brokers, ","),
		"PGOUTBOX_LOG_FORMAT=json",
	)
	env = append(env, extra...)
	env = append(env, h.o.PgoutboxEnv...)
	return append(env, h.variantEnv...)
}
