// Command pgoutbox-bench measures pgoutbox against a running PostgreSQL and
// Kafka (normally the environment of scripts/testenv.sh, which
// scripts/bench.sh brings up and tears down around it). The default
// scenarios:
//
//  1. catch-up throughput: N events pre-inserted as 1-event and as
//     100-event transactions, read once by pg_recvlogical (the reference:
//     how fast the server decodes and sends) and once by pgoutbox until Kafka
//     has acknowledged every record, from two slots created at the same LSN,
//     with the walsender's CPU time beside each drain's;
//  2. steady-state latency at fixed write rates, from the commit to a Kafka
//     consumer receiving the record;
//  3. peak RSS, CPU time, system calls and context switches of the pgoutbox
//     process in each scenario;
//  4. the Go micro-benchmarks of the hot paths.
//
// And on request (--scenarios):
//
//   - debezium: the same backlogs drained by pg_recvlogical, Debezium on
//     Kafka Connect and pgoutbox, each from its own slot copied at one LSN,
//     and the latency of the same events through Debezium (at its defaults
//     and with a short poll.interval.ms) and pgoutbox running at once; two
//     runs, the order alternated;
//   - scaling: throughput and memory against payload size, transaction
//     size and number of topics;
//   - writers: the application's transactions/s with a business insert
//     alone, plus an outbox row, plus the row deleted in the same
//     transaction, plus pg_logical_emit_message instead.
//
// It writes bench-results/results.json, summary.md and latency.png. Run
// `pgoutbox-bench -h` for the flags; `--smoke` is a quick check of the
// harness itself whose numbers mean nothing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox-bench: %v\n", err)
		return exitUsage
	}
	opts.Log = stderr
	if opts.Render != "" {
		res, err := Render(opts.Render, opts.Out)
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox-bench: %v\n", err)
			return exitFail
		}
		fmt.Fprintf(stdout, "results: %s, %s, %s\n", res.Files.JSON, res.Files.Summary, res.Files.Plot)
		return exitOK
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox-bench: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "results: %s, %s, %s\n", res.Files.JSON, res.Files.Summary, res.Files.Plot)
	return exitOK
}

// parseFlags turns the command line into Options: smoke defaults first when
// --smoke is given, then every flag given explicitly.
func parseFlags(args []string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("pgoutbox-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		smoke          = fs.Bool("smoke", false, "quick check of the harness: 2,000 events, 200 events/s for 3 s, short micro-benchmarks")
		pgDSN          = fs.String("pg-dsn", os.Getenv("PGOUTBOX_TEST_PG_DSN"), "superuser DSN of the PostgreSQL server (default $PGOUTBOX_TEST_PG_DSN)")
		pgBin          = fs.String("pg-bin", os.Getenv("PGOUTBOX_TEST_PG_BIN"), "directory holding pg_recvlogical (default $PGOUTBOX_TEST_PG_BIN)")
		brokers        = fs.String("kafka", os.Getenv("PGOUTBOX_TEST_KAFKA"), "comma-separated Kafka brokers (default $PGOUTBOX_TEST_KAFKA)")
		database       = fs.String("database", "pgoutbox_bench", "database to (re)create and work in; empty: work in the DSN's database")
		binary         = fs.String("pgoutbox", "bin/pgoutbox", "the pgoutbox binary to measure")
		out            = fs.String("out", "bench-results", "output directory")
		root           = fs.String("repo", ".", "repository root (for the micro-benchmarks and scripts/kafka/pom.xml)")
		events         = fs.Int("events", 0, "catch-up: events per shape (default 200000; smoke 2000)")
		shapes         = fs.String("txn-sizes", "", "catch-up: comma-separated events per transaction (default 1,100)")
		prepWriters    = fs.Int("prep-writers", 0, "catch-up: concurrent connections that pre-insert the events (default 4)")
		payload        = fs.Int("payload-bytes", 0, "padding in each event's JSON payload (default 100)")
		partitions     = fs.Int("partitions", 0, "partitions per topic (default 3)")
		rates          = fs.String("rates", "", "latency: comma-separated write rates in events/s (default 1000,5000,20000; smoke 200)")
		duration       = fs.Duration("duration", 0, "latency: how long each rate is measured (default 60s; smoke 3s)")
		routeTimes     = fs.Bool("route-times", false, "latency: create the topics with CreateTime, so that latency_ms ends when pgoutbox routed the event (its record timestamp) instead of at Kafka's append: splits the latency into before and after pgoutbox hands the record to the producer")
		settle         = fs.Duration("settle", -1, "latency: how long each rate is written before its measurement starts, not counted (default 10s; smoke 1s)")
		latWriters     = fs.Int("writers", 0, "latency: writer connections, each sending single-event transactions (default 8; smoke 2)")
		drain          = fs.Duration("drain-timeout", 0, "latency: how long to wait for the last events after the writers stop (default 30s)")
		keepUp         = fs.Duration("keepup-bound", 0, "latency: the relay kept up only if every event arrived within this of the writers' stop (default 2s)")
		catchupTimeout = fs.Duration("catchup-timeout", 0, "catch-up: limit for one reader to read every event (default 15m; smoke 2m)")
		scenarios      = fs.String("scenarios", "", "comma-separated scenarios: catchup, latency, poll, micro (the default set), debezium, scaling, writers")
		debeziumLibs   = fs.String("debezium-libs", os.Getenv("PGOUTBOX_DEBEZIUM_LIBS"), "debezium: the directory scripts/debezium/fetch.sh prints (default $PGOUTBOX_DEBEZIUM_LIBS)")
		kafkaPID       = fs.Int("kafka-pid", 0, "the Kafka broker's process id, to report its CPU time during each drain (scripts/bench.sh passes it)")
		runs           = fs.Int("runs", 0, "debezium, writers: runs, the order of the systems or modes alternated from one run to the next (default 2; smoke 1)")
		dbzRate        = fs.Int("debezium-rate", 0, "debezium: the latency's write rate in events/s (default 1000)")
		dbzPoll        = fs.Int("debezium-poll-ms", 0, "debezium: the poll.interval.ms of the second latency run beside Debezium's default (default 10)")
		dbzFlush       = fs.Duration("debezium-offset-flush", 0, "debezium: the worker's offset.flush.interval.ms, when Debezium confirms its slot (default Kafka Connect's, 60s; smoke 1s)")
		scalePayloads  = fs.String("scale-payloads", "", "scaling: payload paddings in bytes (default 100,1024,10240,102400,524288)")
		scaleTxns      = fs.String("scale-txn-sizes", "", "scaling: events per transaction (default 1,10,100,1000,10000,200000)")
		scaleTopics    = fs.String("scale-topics", "", "scaling: numbers of topics (default 1,10,100,1000)")
		scaleBytes     = fs.Int64("scale-bytes", 0, "scaling: at most this many payload bytes per point: fewer events for large payloads (default 512 MiB)")
		writerClients  = fs.Int("writer-clients", 0, "writers: concurrent clients (default 4)")
		writerDuration = fs.Duration("writer-duration", 0, "writers: how long each mode is measured (default 20s; smoke 1s)")
		writerFsync    = fs.String("writer-fsync", "", "writers: fsync settings to measure under, off and/or on (default off,on)")
		pollInstances  = fs.String("poll-instances", "", "poll: comma-separated numbers of relays the backlog catch-up runs with (default 1,4)")
		pollRates      = fs.String("poll-rates", "", "poll: comma-separated write rates of the latency runs, each with notifications, without at the default poll.interval, and without at 50ms (default 1000,5000; smoke 200)")
		triggerRound   = fs.Duration("trigger-round", 0, "poll: how long each round of the trigger's cost runs (default 15s; smoke 2s)")
		benchtime      = fs.String("benchtime", "", "go test -benchtime for the micro-benchmarks (default 1s; smoke 100x)")
		microPkgs      = fs.String("micro-packages", "", "packages of the micro-benchmarks (default ./checkpoint ./router ./replication ./pkg/kafka ./pkg/relay, comma-separated)")
		keepDB         = fs.Bool("keep-database", false, "keep the database, slots are dropped anyway")
		exactlyOnce    = fs.Bool("exactly-once", false, "also run every catch-up shape and every rate with kafka.exactly.once, right after its at-least-once run (exactly-once latency is read with a read_committed consumer)")
		pgoutboxEnv    multiFlag
		variants       []string
		render         = fs.String("render", "", "write summary.md, latency.png and results.json into --out again from this results.json (after a change to the report), measuring nothing")
	)
	fs.Func("variant", "NAME=KEY=VALUE,...: run the catch-up and latency scenarios once per variant (repeatable; NAME= for pgoutbox's defaults), the order reversed every other --runs", func(v string) error {
		variants = append(variants, v)
		return nil
	})
	fs.Var(&pgoutboxEnv, "pgoutbox-env", "extra KEY=VALUE setting for pgoutbox, e.g. PGOUTBOX_KAFKA_FLUSH_FREQUENCY=5ms, or one of the Go runtime's GOGC, GOMEMLIMIT, GOMAXPROCS, GODEBUG (repeatable)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: pgoutbox-bench [flags]\n\nMeasures pgoutbox's catch-up throughput (against pg_recvlogical), steady-state latency\nand resources against a running PostgreSQL and Kafka; see scripts/bench.sh.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Options{}, err
	}
	if fs.NArg() > 0 {
		return Options{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	o := DefaultOptions()
	if *smoke {
		o = SmokeOptions()
	}
	o.PGDSN, o.PGBin, o.Database, o.Pgoutbox, o.Out, o.RepoRoot = *pgDSN, *pgBin, *database, *binary, *out, *root
	o.Brokers = splitList(*brokers)
	o.KeepDatabase = *keepDB
	o.ExactlyOnce = *exactlyOnce
	o.PgoutboxEnv = pgoutboxEnv
	o.DebeziumLibs, o.KafkaPID, o.Render = *debeziumLibs, *kafkaPID, *render
	if o.Render != "" {
		return o, nil
	}
	for _, v := range variants {
		pv, err := parseVariant(v)
		if err != nil {
			return o, err
		}
		o.Variants = append(o.Variants, pv)
	}
	setIf(&o.Runs, *runs)
	setIf(&o.VersusRate, *dbzRate)
	setIf(&o.DebeziumPollMs, *dbzPoll)
	setIf(&o.DebeziumOffsetFlush, *dbzFlush)
	setIf(&o.ScaleBytes, *scaleBytes)
	setIf(&o.WriterClients, *writerClients)
	setIf(&o.WriterDuration, *writerDuration)
	if *writerFsync != "" {
		o.WriterFsync = splitList(*writerFsync)
	}
	setIf(&o.Events, *events)
	setIf(&o.PrepWriters, *prepWriters)
	setIf(&o.PayloadBytes, *payload)
	setIf(&o.Partitions, *partitions)
	setIf(&o.Duration, *duration)
	o.RouteTimes = *routeTimes
	if *settle >= 0 {
		o.Settle = *settle
	}
	setIf(&o.LatencyWriters, *latWriters)
	setIf(&o.DrainTimeout, *drain)
	setIf(&o.KeepUpBound, *keepUp)
	setIf(&o.CatchupTimeout, *catchupTimeout)
	setIf(&o.BenchTime, *benchtime)
	for _, l := range []struct {
		flag string
		val  string
		dst  *[]int
	}{
		{"--txn-sizes", *shapes, &o.TxnSizes}, {"--rates", *rates, &o.Rates},
		{"--scale-payloads", *scalePayloads, &o.ScalePayloads}, {"--scale-txn-sizes", *scaleTxns, &o.ScaleTxnSizes}, {"--scale-topics", *scaleTopics, &o.ScaleTopics},
		{"--poll-instances", *pollInstances, &o.PollInstances}, {"--poll-rates", *pollRates, &o.PollRates},
	} {
		if l.val != "" {
			var err error
			if *l.dst, err = parseInts(l.val); err != nil {
				return o, fmt.Errorf("%s: %w", l.flag, err)
			}
		}
	}
	setIf(&o.TriggerRound, *triggerRound)
	if *microPkgs != "" {
		o.MicroPackages = splitList(*microPkgs)
	}
	if *scenarios != "" {
		o.Scenarios = map[string]bool{}
		for _, s := range splitList(*scenarios) {
			if !slices.Contains(allScenarios, s) {
				return o, fmt.Errorf("--scenarios: unknown scenario %q (want %s)", s, strings.Join(allScenarios, ", "))
			}
			o.Scenarios[s] = true
		}
	}
	return o, o.Validate()
}

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, " ") }

func (m *multiFlag) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*m = append(*m, v)
	return nil
}

func setIf[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		f = strings.ReplaceAll(f, "_", "")
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// Options configure a benchmark run.
type Options struct {
	Smoke bool
	// Render, when set, is a results.json to render again instead of a
	// run.
	Render string

	PGDSN    string   // superuser DSN of the server
	PGBin    string   // directory of pg_recvlogical
	Brokers  []string // Kafka
	Database string   // created afresh for the run; "" = the DSN's database
	// KeepDatabase leaves the database in place at the end.
	KeepDatabase bool
	Pgoutbox     string // the binary
	Out          string // output directory
	RepoRoot     string
	// PgoutboxEnv are extra KEY=VALUE settings for every pgoutbox process.
	PgoutboxEnv []string
	// ExactlyOnce runs every catch-up shape and every rate a second time
	// with kafka.exactly.once, right after the at-least-once run.
	ExactlyOnce bool

	Scenarios map[string]bool // nil: defaultScenarios (catchup, latency, poll and micro)

	// DebeziumLibs is the directory of Kafka Connect's and Debezium's jars
	// (scripts/debezium/fetch.sh); KafkaPID the broker's process, whose
	// CPU time each drain reports (0: not reported).
	DebeziumLibs string
	KafkaPID     int
	// Runs of the debezium and writers scenarios and of the variants, in
	// alternating order.
	Runs int
	// Variants, when set, run the catch-up and latency scenarios once per
	// variant and run instead of once.
	Variants []Variant
	// VersusRate is the write rate of the latency beside Debezium, and
	// DebeziumPollMs the poll.interval.ms of its second configuration.
	VersusRate     int
	DebeziumPollMs int
	// DebeziumOffsetFlush is the worker's offset.flush.interval.ms (zero:
	// Kafka Connect's default, 60 s), which is when Debezium confirms its
	// slot.
	DebeziumOffsetFlush time.Duration

	// Scaling: the points of each dimension, and the most payload bytes a
	// point writes (large payloads get fewer events).
	ScalePayloads []int
	ScaleTxnSizes []int
	ScaleTopics   []int
	ScaleBytes    int64

	// Writers: clients, the measured time per mode (after WriterWarmup)
	// and the fsync settings.
	WriterClients  int
	WriterDuration time.Duration
	WriterWarmup   time.Duration
	WriterFsync    []string

	Events         int   // catch-up events per shape
	TxnSizes       []int // catch-up shapes: events per transaction
	PrepWriters    int
	PayloadBytes   int
	Partitions     int
	CatchupTimeout time.Duration

	Rates          []int
	Duration       time.Duration
	LatencyWriters int
	Warmup         int // events written and awaited before each rate's measurement
	// Settle is how long each rate is written before its measurement
	// starts: the broker's JIT and the servers' caches reach the rate's
	// steady state; those events are delivered but not counted.
	Settle time.Duration
	// RouteTimes creates the latency topics with CreateTime: the latency
	// then ends at pgoutbox's routing of the event (the record's timestamp)
	// instead of at Kafka's append.
	RouteTimes   bool
	DrainTimeout time.Duration
	KeepUpBound  time.Duration

	BenchTime     string
	MicroPackages []string

	// The poll source (poll.go): the catch-up's numbers of relays, the
	// latency runs' rates, the trigger cost's writers and round length.
	PollInstances  []int
	PollRates      []int
	TriggerWriters int
	TriggerRound   time.Duration

	Log io.Writer // progress; nil: discarded
}

// Scenario names for Options.Scenarios.
const (
	ScenarioCatchup  = "catchup"
	ScenarioLatency  = "latency"
	ScenarioPoll     = "poll"
	ScenarioMicro    = "micro"
	ScenarioDebezium = "debezium"
	ScenarioScaling  = "scaling"
	ScenarioWriters  = "writers"
)

// allScenarios are every scenario; the first four (defaultScenarios) are
// the default set.
var allScenarios = []string{ScenarioCatchup, ScenarioLatency, ScenarioPoll, ScenarioMicro, ScenarioDebezium, ScenarioScaling, ScenarioWriters}

// defaultScenarios run when --scenarios is not given.
var defaultScenarios = allScenarios[:4]

// DefaultOptions are the full run's settings.
func DefaultOptions() Options {
	return Options{
		Database:       "pgoutbox_bench",
		Pgoutbox:       "bin/pgoutbox",
		Out:            "bench-results",
		RepoRoot:       ".",
		Events:         200_000,
		TxnSizes:       []int{1, 100},
		PrepWriters:    4,
		PayloadBytes:   100,
		Partitions:     3,
		CatchupTimeout: 15 * time.Minute,
		Rates:          []int{1000, 5000, 20000},
		Duration:       60 * time.Second,
		LatencyWriters: 8,
		Warmup:         50,
		Settle:         10 * time.Second,
		DrainTimeout:   30 * time.Second,
		KeepUpBound:    2 * time.Second,
		BenchTime:      "1s",
		MicroPackages:  []string{"./checkpoint", "./router", "./replication", "./pkg/kafka", "./pkg/relay"},
		Runs:           2,
		VersusRate:     1000,
		DebeziumPollMs: 10,
		ScalePayloads:  []int{100, 1 << 10, 10 << 10, 100 << 10, 512 << 10},
		ScaleTxnSizes:  []int{1, 10, 100, 1000, 10_000, 200_000},
		ScaleTopics:    []int{1, 10, 100, 1000},
		ScaleBytes:     512 << 20,
		WriterClients:  4,
		WriterDuration: 20 * time.Second,
		WriterWarmup:   3 * time.Second,
		WriterFsync:    []string{"off", "on"},
		PollInstances:  []int{1, 4},
		PollRates:      []int{1000, 5000},
		TriggerWriters: 8,
		TriggerRound:   15 * time.Second,
	}
}

// SmokeOptions are the settings of --smoke: every scenario, small and short.
func SmokeOptions() Options {
	o := DefaultOptions()
	o.Smoke = true
	o.Events = 2000
	o.PrepWriters = 2
	o.CatchupTimeout = 2 * time.Minute
	o.Rates = []int{200}
	o.Duration = 3 * time.Second
	o.LatencyWriters = 2
	o.Warmup = 10
	o.Settle = time.Second
	o.DrainTimeout = 20 * time.Second
	o.BenchTime = "100x"
	o.Runs = 1
	o.VersusRate = 200
	o.DebeziumOffsetFlush = time.Second
	o.ScalePayloads = []int{100, 10 << 10}
	o.ScaleTxnSizes = []int{1, 2000}
	o.ScaleTopics = []int{1, 10}
	o.ScaleBytes = 8 << 20
	o.WriterDuration = time.Second
	o.WriterWarmup = 200 * time.Millisecond
	o.WriterFsync = []string{"off"}
	o.PollRates = []int{200}
	o.TriggerWriters = 2
	o.TriggerRound = 2 * time.Second
	return o
}

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	if o.PGDSN == "" {
		errs = append(errs, errors.New("no PostgreSQL DSN: give --pg-dsn or set PGOUTBOX_TEST_PG_DSN (source the env.sh of scripts/testenv.sh up)"))
	}
	if len(o.Brokers) == 0 {
		errs = append(errs, errors.New("no Kafka brokers: give --kafka or set PGOUTBOX_TEST_KAFKA"))
	}
	if (o.enabled(ScenarioCatchup) || o.enabled(ScenarioDebezium) || o.enabled(ScenarioScaling)) && o.PGBin == "" {
		errs = append(errs, errors.New("no PostgreSQL bin directory for pg_recvlogical: give --pg-bin or set PGOUTBOX_TEST_PG_BIN"))
	}
	if o.Database != "" && !validIdent(o.Database) {
		errs = append(errs, fmt.Errorf("--database %q: use lower-case letters, digits and _", o.Database))
	}
	if o.Events <= 0 || o.PrepWriters <= 0 || o.Partitions <= 0 || o.LatencyWriters <= 0 || o.Duration <= 0 {
		errs = append(errs, errors.New("events, prep-writers, partitions, writers and duration must be positive"))
	}
	if o.PayloadBytes < 0 {
		errs = append(errs, errors.New("payload-bytes must not be negative"))
	}
	for _, s := range o.TxnSizes {
		if s <= 0 {
			errs = append(errs, fmt.Errorf("transaction size %d", s))
		}
	}
	for _, r := range o.Rates {
		if r <= 0 {
			errs = append(errs, fmt.Errorf("rate %d", r))
		}
	}
	if o.enabled(ScenarioPoll) && (o.TriggerWriters <= 0 || o.TriggerRound <= 0) {
		errs = append(errs, errors.New("trigger writers and round must be positive"))
	}
	if o.enabled(ScenarioDebezium) && o.DebeziumLibs == "" {
		errs = append(errs, errors.New("debezium: no Debezium jars: give --debezium-libs or set PGOUTBOX_DEBEZIUM_LIBS (the directory bash scripts/debezium/fetch.sh prints)"))
	}
	if o.Runs <= 0 || o.VersusRate <= 0 || o.DebeziumPollMs <= 0 || o.WriterClients <= 0 || o.WriterDuration <= 0 || o.ScaleBytes <= 0 {
		errs = append(errs, errors.New("runs, debezium-rate, debezium-poll-ms, writer-clients, writer-duration and scale-bytes must be positive"))
	}
	for _, f := range o.WriterFsync {
		if f != "on" && f != "off" {
			errs = append(errs, fmt.Errorf("--writer-fsync %q: want on or off", f))
		}
	}
	var envs []string
	envs = append(envs, o.PgoutboxEnv...)
	seen := map[string]bool{}
	for _, v := range o.Variants {
		if seen[v.Name] {
			errs = append(errs, fmt.Errorf("--variant %s given twice", v.Name))
		}
		seen[v.Name] = true
		envs = append(envs, v.Env...)
	}
	for _, kv := range envs {
		if !strings.HasPrefix(kv, "PGOUTBOX_") && !slices.Contains(goRuntimeEnv, strings.SplitN(kv, "=", 2)[0]) {
			errs = append(errs, fmt.Errorf("--pgoutbox-env %q: pgoutbox settings start with PGOUTBOX_ (or are one of the Go runtime's %s)", kv, strings.Join(goRuntimeEnv, ", ")))
		}
	}
	return errors.Join(errs...)
}

// goRuntimeEnv are the Go runtime's settings --pgoutbox-env passes too,
// for experiments on pgoutbox's CPU use.
var goRuntimeEnv = []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG"}

func (o *Options) enabled(s string) bool {
	if o.Scenarios == nil {
		return slices.Contains(defaultScenarios, s)
	}
	return o.Scenarios[s]
}

func validIdent(s string) bool {
	if s == "" || len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}
