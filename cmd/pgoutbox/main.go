// Command pgoutbox relays transactional-outbox events from a PostgreSQL
// logical replication slot to Apache Kafka.
//
// Exit codes: 0 success (including a stop by SIGINT/SIGTERM), 1 a runtime
// failure, 2 bad configuration or usage, 3 a server that could not be reached
// or refused us at start-up.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/metrics"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitConfig  = 2
	exitStartup = 3
)

// defaultMemoryLimit is the soft heap limit used unless GOMEMLIMIT is set.
const defaultMemoryLimit = 48 << 20

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	if len(os.Args) > 1 && os.Args[1] == "run" {
		keepSysmonAwake()
		tuneRuntime()
	}
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// tuneRuntime sets the process-wide runtime settings of pgoutbox run. It is
// called from main, not from cmdRun, so that tests calling cmdRun in their
// own process keep theirs.
func tuneRuntime() {
	// A soft memory limit makes the garbage collector work harder before
	// the heap outgrows what the in-flight caps need, instead of letting it
	// double; GOMEMLIMIT in the environment takes precedence.
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	// One processor for Go code unless GOMAXPROCS says otherwise: the
	// walsender decodes on one core, and one P keeps up with it while
	// sparing idle Ps' wake-ups (measurements in DESIGN.md).
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

const usage = `pgoutbox relays transactional-outbox events from PostgreSQL to Kafka.

Usage:
  pgoutbox run     [flags]   stream the outbox to Kafka until SIGINT/SIGTERM
  pgoutbox migrate [flags]   create the default outbox table and publication
  pgoutbox status  [flags]   show the slot, its lag and WAL retention, and the publication
  pgoutbox validate [flags]  check configuration, servers, permissions, publication, slot and topics
  pgoutbox cleanup [flags]   delete outbox rows relayed longer ago than the retention (for cron)
  pgoutbox convert FILE      print the native YAML equivalent of a Debezium connector JSON
  pgoutbox version           print the version
  pgoutbox completion SHELL  print a completion script for bash, zsh or fish

Run "pgoutbox <command> --help" for the command's flags and settings.
`

func run(args []string, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitConfig
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], environ, stdout, stderr)
	case "migrate":
		return cmdMigrate(args[1:], environ, stdout, stderr)
	case "convert":
		return cmdConvert(args[1:], environ, stdout, stderr)
	case "status":
		return cmdStatus(args[1:], environ, stdout, stderr)
	case "validate":
		return cmdValidate(args[1:], environ, stdout, stderr)
	case "cleanup":
		return cmdCleanup(args[1:], environ, stdout, stderr)
	case "completion":
		return cmdCompletion(args[1:], environ, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "pgoutbox %s\n", buildVersion())
		return exitOK
	case "help", "--help", "-help", "-h":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "pgoutbox: unknown command %q\n\n%s", args[0], usage)
	return exitConfig
}

// commonFlags are the flags every command that loads the configuration
// (run, migrate, status, validate, cleanup) shares; each overrides the
// config file and the environment, and --connector is applied under them.
type commonFlags struct {
	fs                                      *flag.FlagSet
	config, dsn, brokers, slot, publication string
	tables, logLevel, logFormat             string
	connector                               string
	// ignored lists the connector keys pgoutbox ignored, for one warning.
	ignored []string
}

func newFlags(name string, stderr io.Writer, help string) *commonFlags {
	c := &commonFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	c.fs.SetOutput(stderr)
	c.fs.StringVar(&c.config, "config", "", "YAML config file (env PGOUTBOX_CONFIG)")
	c.fs.StringVar(&c.dsn, "dsn", "", "PostgreSQL connection string (postgres.dsn)")
	c.fs.StringVar(&c.brokers, "brokers", "", "comma-separated Kafka bootstrap servers (kafka.brokers)")
	c.fs.StringVar(&c.slot, "slot", "", "replication slot name (postgres.slot.name)")
	c.fs.StringVar(&c.publication, "publication", "", "publication name (postgres.publication.name)")
	c.fs.StringVar(&c.tables, "tables", "", "comma-separated outbox tables (postgres.table.include.list)")
	c.fs.StringVar(&c.logLevel, "log-level", "", "debug, info, warn or error (log.level)")
	c.fs.StringVar(&c.logFormat, "log-format", "", "auto, json or console (log.format)")
	c.fs.StringVar(&c.connector, "connector", "", "a Debezium PostgreSQL connector JSON with the outbox EventRouter (as POSTed to Kafka Connect) to take the settings from; applied over the config file, under the environment and flags")
	c.fs.Usage = func() {
		fmt.Fprintf(stderr, "%s\nFlags:\n", help)
		c.fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nSettings (YAML section: key, environment variable, default):%s", describeSettings())
	}
	return c
}

// loadOrExit is each command's prologue: it parses the flags, loads the
// configuration and wraps *stdout and *stderr so that no configured
// password gets through them (the password files are read once, here).
// ok is false when the command is done: code is exitOK after --help, or
// exitConfig after the configuration error was printed (scrubbed too).
func (c *commonFlags) loadOrExit(args, environ []string, stdout, stderr *io.Writer) (cfg fileConfig, code int, ok bool) {
	cfg, err := c.load(args, environ)
	if errors.Is(err, flag.ErrHelp) {
		return cfg, exitOK, false
	}
	secrets := configSecrets(cfg)
	*stdout = scrubSecrets(*stdout, cfg.Postgres.DSN, secrets...)
	*stderr = scrubSecrets(*stderr, cfg.Postgres.DSN, secrets...)
	if err != nil {
		fmt.Fprintf(*stderr, "pgoutbox: configuration: %v\n", err)
		return cfg, exitConfig, false
	}
	return cfg, 0, true
}

// load parses flags and builds the configuration: defaults, then the file,
// then the environment, then flags.
func (c *commonFlags) load(args, environ []string) (fileConfig, error) {
	if err := c.fs.Parse(args); err != nil {
		return fileConfig{}, err
	}
	if c.fs.NArg() > 0 {
		return fileConfig{}, fmt.Errorf("unexpected arguments %q", c.fs.Args())
	}
	path := c.config
	if path == "" {
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, "PGOUTBOX_CONFIG="); ok {
				path = v
			}
		}
	}
	var between func(*fileConfig) error
	var readOnPurpose []string
	snapshotDefaulted := false
	if c.connector != "" {
		conn, err := readConnector(c.connector)
		if err != nil {
			return fileConfig{}, err
		}
		between = func(cfg *fileConfig) error {
			ignored, err := applyConnector(cfg, conn)
			c.ignored = ignored
			return err
		}
		readOnPurpose = envReferences(conn)
		_, given := conn["snapshot.mode"]
		snapshotDefaulted = !given && !slices.ContainsFunc(environ, func(kv string) bool {
			return strings.HasPrefix(kv, envName("snapshot", "mode")+"=")
		})
	}
	cfg, err := loadConfigWith(path, environ, between, readOnPurpose)
	if err != nil {
		return cfg, err
	}
	if snapshotDefaulted && isPoll(cfg) && cfg.Snapshot.Mode == relay.SnapshotInitial {
		// The user never wrote initial: say where it came from, or the
		// refusal of the poll source's check names a value nobody set.
		return cfg, fmt.Errorf("connector %s has no snapshot.mode, which means Debezium's default, initial (publish the rows already in the outbox tables, then stream), and relay.source is poll, which takes no snapshot (it publishes every unpublished row anyway): set \"snapshot.mode\": \"no_data\" in the connector JSON", c.connector)
	}
	var blank []string
	split := func(name, s string) []string {
		var out []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		if out == nil {
			blank = append(blank, "--"+name)
		}
		return out
	}
	set := map[string]func(string){
		"dsn":         func(v string) { cfg.Postgres.DSN = v },
		"brokers":     func(v string) { cfg.Kafka.Brokers = split("brokers", v) },
		"slot":        func(v string) { cfg.Postgres.Slot = v },
		"publication": func(v string) { cfg.Postgres.Publication = v },
		"tables":      func(v string) { cfg.Postgres.Tables = split("tables", v) },
		"log-level":   func(v string) { cfg.Log.Level = v },
		"log-format":  func(v string) { cfg.Log.Format = v },
	}
	c.fs.Visit(func(f *flag.Flag) {
		if fn, ok := set[f.Name]; ok {
			fn(f.Value.String())
		}
	})
	if len(blank) > 0 {
		// A blank list is most likely a template's variable left unfilled:
		// an empty table list relays no table, without a word.
		return cfg, fmt.Errorf("%s given an empty list: name the values, or leave the flag out to keep the configured ones", strings.Join(blank, ", "))
	}
	return cfg, nil
}

func newLogger(lc logConfig, stderr io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(lc.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level %q: use debug, info, warn or error", lc.Level)
	}
	format := lc.Format
	if format == "auto" || format == "" {
		format = "json"
		if f, ok := stderr.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				format = "console"
			}
		}
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		ec := zap.NewProductionEncoderConfig()
		ec.TimeKey = "ts"
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		ec := zap.NewDevelopmentEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, fmt.Errorf("log.format %q: use auto, json or console", lc.Format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(stderr)), level)
	return zap.New(core), nil
}

// lockedWriter serialises writes: the logger (used by the HTTP server and
// slot poller goroutines) and the final one-line reason share stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func cmdRun(args, environ []string, stdout, stderr io.Writer) int {
	if f, ok := stderr.(*os.File); !ok || f != os.Stderr {
		stderr = &lockedWriter{w: stderr}
	}
	c := newFlags("run", stderr, "Usage: pgoutbox run [flags]\n\nStreams outbox inserts from the replication slot to Kafka. SIGINT or SIGTERM stops\nat a transaction boundary, waits for Kafka's acknowledgements, confirms and exits 0.\n")
	// Nothing prints a password; should an error ever quote one, it is
	// replaced (each write through the logger is one whole line).
	cfg, code, ok := c.loadOrExit(args, environ, &stdout, &stderr)
	if !ok {
		return code
	}
	log, err := newLogger(cfg.Log, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	defer log.Sync() //nolint:errcheck // nothing to do about a failed flush at exit
	defer startProfiles(environ, stderr)()
	if len(c.ignored) > 0 {
		log.Warn("connector settings ignored by pgoutbox", zap.Strings("keys", describeIgnored(c.ignored)))
	}
	if err := cfg.Metrics.Validate(); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	if isPoll(cfg) {
		// A claim waits for Kafka without reporting: the poll source's
		// liveness is the process serving (metrics.Live).
		cfg.Metrics.LiveStaleAfter = 0
	}
	mopts := []metrics.Option{metrics.WithVersion(buildVersion())}
	if isPoll(cfg) {
		mopts = append(mopts, metrics.WithPollSource())
	}
	m, err := metrics.New(prometheus.NewRegistry(), cfg.Metrics, mopts...)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: metrics: %v\n", err)
		return exitConfig
	}
	// Signals: the first SIGINT, SIGTERM or SIGHUP starts a clean stop (at
	// a transaction boundary, waiting for Kafka, within
	// relay.shutdown.timeout); a second one during it stops at once.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	force := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	sigDone := make(chan struct{})
	var sigWG sync.WaitGroup
	defer func() {
		close(sigDone)
		sigWG.Wait()
	}()
	sigWG.Add(1)
	go func() {
		defer sigWG.Done()
		n := 0
		for {
			select {
			case <-sigDone:
				return
			case sig := <-sigs:
				n++
				switch n {
				case 1:
					log.Info("stop requested; stopping at the next transaction boundary (send the signal again to stop at once)", zap.Stringer("signal", sig))
					stop()
				case 2:
					log.Warn("second stop request: stopping at once", zap.Stringer("signal", sig))
					close(force)
				}
			}
		}
	}()
	audit := newDurabilityAudit(cfg.Config, log)
	audit.Start()
	r, err := relay.New(cfg.Config, log, relay.WithObserver(audit.Observe(m)), relay.WithForceStop(force))
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitConfig
	}
	warnUnseenUpdates(ctx, cfg, log)

	// Goroutines and shutdown order: the relay runs on this goroutine until
	// a signal (it drains and confirms itself); the HTTP server, the slot
	// poller and the durability audit run on their own goroutines, under
	// auxCtx, so /metrics and /readyz stay up while the relay drains; after
	// Run returns they are stopped and waited for.
	var wg sync.WaitGroup
	auxCtx, stopAux := context.WithCancel(context.Background())
	defer func() {
		stopAux()
		wg.Wait()
	}()
	if cfg.Metrics.Listen != "" {
		srv := metrics.NewServer(cfg.Metrics.Listen, m.Handler())
		if err := srv.Listen(); err != nil {
			fmt.Fprintf(stderr, "pgoutbox: metrics listener: %v\n", err)
			return exitStartup
		}
		log.Info("serving /metrics, /healthz and /readyz", zap.String("addr", srv.Addr()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Run(auxCtx); err != nil {
				log.Warn("metrics server", zap.Error(err))
			}
		}()
	}
	// The durability audit asks the servers on its own goroutine, never on
	// the relay's: it warns about settings that can lose confirmed events.
	wg.Add(1)
	go func() {
		defer wg.Done()
		audit.Run(auxCtx)
	}()
	if isPoll(cfg) {
		// The poll source has no slot: its backlog is what is watched.
		if t, err := cfg.PollTable(); err == nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m.PollBacklog(auxCtx, cfg.Postgres, t, cfg.Metrics.BacklogPollInterval, log.Named("backlog"))
			}()
		}
	} else if cfg.Metrics.SlotPollInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.PollSlot(auxCtx, cfg.Postgres, cfg.Metrics.SlotPollInterval, log.Named("slot"))
		}()
	}
	log.Info("pgoutbox starting", zap.String("version", buildVersion()), zap.String("slot", cfg.Postgres.Slot),
		zap.String("publication", cfg.Postgres.Publication), zap.Strings("tables", cfg.Postgres.Tables), zap.Strings("brokers", cfg.Kafka.Brokers),
		zap.String("sysmon", sysmonState(environ)))
	err = r.Run(ctx)
	// Stop and wait for the poller and the server before the last lines, so
	// the one-line reason is the last thing written to stderr.
	stopAux()
	wg.Wait()
	if err == nil {
		log.Info("pgoutbox stopped")
		return exitOK
	}
	var se *relay.StartupError
	var ce *relay.ConfigError
	switch {
	case errors.As(err, &ce):
		log.Error("bad configuration", zap.Error(err))
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitConfig
	case errors.As(err, &se):
		log.Error("could not start", zap.Error(err))
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitStartup
	}
	log.Error("relay failed", zap.Error(err))
	fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
	return exitRuntime
}

// connectOrReport opens the ordinary connection of a one-shot subcommand
// (application name app) within postgres.connect.timeout. When it cannot,
// it says why on stderr and returns nil with the exit status: exitConfig
// for a missing or invalid postgres.dsn, exitStartup when the connection
// fails.
func connectOrReport(ctx context.Context, pc replication.Config, app string, stderr io.Writer) (*pgx.Conn, int) {
	if pc.DSN == "" {
		fmt.Fprintln(stderr, "pgoutbox: configuration: postgres.dsn is empty: pass --dsn or set PGOUTBOX_POSTGRES_DSN")
		return nil, exitConfig
	}
	if err := pc.ValidateDSN(); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return nil, exitConfig
	}
	conn, err := replication.ConnectSQL(ctx, pc, app, pc.ConnectTimeout)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: connect to PostgreSQL: %v\n", err)
		return nil, exitStartup
	}
	return conn, exitOK
}

func cmdMigrate(args, environ []string, stdout, stderr io.Writer) int {
	c := newFlags("migrate", stderr, "Usage: pgoutbox migrate [flags]\n\nCreates the default outbox table (one per postgres.table.include.list entry), the\npublication, the state table and the slot if they do not exist. Safe to run again.\nWith relay.source=poll: creates (or completes) the poll table, its indexes and its\nnotification trigger instead.\n")
	dry := c.fs.Bool("print", false, "print the SQL instead of applying it")
	guard := c.fs.Bool("guard", false, "create event triggers that refuse to drop the publication, take an outbox table out of it, make an outbox table or a partition of it unlogged, make a table inherit from one, or stop the publication from publishing inserts (needs a superuser)")
	accept := c.fs.Bool("accept-catalog", false, "record the publication and outbox tables as they are now, after pgoutbox stopped because one was dropped and created again (relay what is missing first)")
	recreate := c.fs.Bool("recreate-slot", false, "create the slot again after it was lost or dropped, and record that in the state table (events between the old slot's last confirmed position and now are not relayed)")
	lockTimeout := c.fs.Duration("lock-timeout", migrations.DefaultLockTimeout, fmt.Sprintf("relay.source=poll: how long each of migrate's %d attempts waits for a lock on the table (while it waits, the table's INSERTs wait behind it); migrate takes none when the table has everything", migrations.DefaultLockAttempts))
	acceptRelays := c.fs.Bool("accept-running-poll-relays", false, "relay.source=poll: install the keep trigger although poll relays run on the table with poll.on.publish=delete (relays of versions before it would have their deletes on publish skipped and resend those rows forever)")
	cfg, code, ok := c.loadOrExit(args, environ, &stdout, &stderr)
	if !ok {
		return code
	}
	// run refuses these; migrate would otherwise set up for them.
	if err := cfg.ValidateExactlyOnce(); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	p := migrations.Params{Tables: cfg.Postgres.QualifiedTables(), Publication: cfg.Postgres.Publication, PublicationAutocreate: cfg.Postgres.PublicationAutocreate}
	if cfg.Postgres.StateTable != "" {
		ddl, err := replication.StateTableDDL(cfg.Postgres.StateTable)
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
			return exitConfig
		}
		p.StateTableDDL = ddl
	}
	if *dry {
		render := func() ([]string, error) { return migrations.Render(p) }
		if isPoll(cfg) { // poll.go
			render = func() ([]string, error) { return renderPoll(cfg) }
		}
		stmts, err := render()
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
			return exitConfig
		}
		if !isPoll(cfg) {
			fmt.Fprintln(stdout, keepTriggersNote(p.Tables))
		}
		fmt.Fprintln(stdout, strings.Join(stmts, "\n"))
		return exitOK
	}
	ctx := context.Background()
	conn, code := connectOrReport(ctx, cfg.Postgres, "pgoutbox-migrate", stderr)
	if conn == nil {
		return code
	}
	defer conn.Close(ctx)
	if isPoll(cfg) { // the poll table instead: poll.go
		return migratePoll(ctx, conn, cfg, pollMigrateFlags{lockTimeout: *lockTimeout, acceptRelays: *acceptRelays}, stdout, stderr)
	}
	if err := replication.PublicationAfterSlot(ctx, conn, cfg.Postgres); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return exitRuntime
	}
	if err := sharedPublication(ctx, conn, cfg.Postgres); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: migrate: %v\n", err)
		return exitRuntime
	}
	kept, err := dropsKeepTriggers(ctx, conn, p.Tables) // poll.go
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: migrate: %v\n", err)
		return exitRuntime
	}
	// (After the refusal of running poll relays, before the triggers go.)
	if err := pollRowsLeft(ctx, conn, cfg); err != nil { // poll.go
		fmt.Fprintf(stderr, "pgoutbox: migrate: nothing was changed: %v\n", err)
		return exitRuntime
	}
	if err := migrations.Apply(ctx, conn, p); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: migrate: %v\n", err)
		return exitRuntime
	}
	fmt.Fprintf(stdout, "migrated %s (publication %s)\n", strings.Join(p.Tables, ", "), cfg.Postgres.Publication)
	if len(kept) > 0 {
		fmt.Fprintf(stdout, "dropped the poll source's triggers %s and %s from %s: a row deleted before it is published is deleted now, as the delete-after-insert mode needs; a poll relay refuses to start on the table until pgoutbox migrate with relay.source=poll puts them back\n",
			migrations.KeepTrigger, migrations.KeepTruncateTrigger, strings.Join(kept, ", "))
	}
	if *guard {
		tables, err := replication.InstallGuard(ctx, conn, cfg.Postgres.StateTable)
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: migrate --guard: %v\n", err)
			return exitRuntime
		}
		fmt.Fprintf(stdout, "guard installed: dropping the publication or an outbox table from it, making an outbox table or a partition unlogged, inheriting from an outbox table and publishing no inserts are refused, for what state table(s) %s record\n", strings.Join(tables, ", "))
	}
	if cfg.Kafka.ExactlyOnce && len(cfg.Kafka.Brokers) > 0 {
		kctx, cancel := context.WithTimeout(ctx, 2*(cfg.Kafka.DialTimeout+cfg.Kafka.ReadTimeout))
		err := kafka.EnsureOffsetsTopic(kctx, cfg.Kafka)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: migrate: %v\n", err)
			return exitRuntime
		}
		fmt.Fprintf(stdout, "offsets topic %s ready (kafka.exactly.once)\n", cfg.Kafka.OffsetsTopic)
	}
	if *accept {
		if err := acceptCatalog(ctx, conn, cfg.Postgres, cfg.Messages.Prefix, stdout); err != nil {
			fmt.Fprintf(stderr, "pgoutbox: accept the catalog: %v\n", err)
			return exitRuntime
		}
	}
	if *recreate {
		if err := recreateSlot(ctx, conn, cfg.Postgres, cfg.Snapshot, stdout); err != nil {
			fmt.Fprintf(stderr, "pgoutbox: recreate slot %s: %v\n", cfg.Postgres.Slot, err)
			return exitRuntime
		}
		if cfg.Snapshot.Mode == relay.SnapshotInitial {
			// recreateSlot said who makes it.
			return exitOK
		}
	}
	if !cfg.Postgres.CreateSlot {
		return exitOK
	}
	if cfg.Snapshot.Mode == relay.SnapshotInitial {
		// The relay creates the slot after publishing the rows already
		// there: a slot made now would skip them.
		fmt.Fprintf(stdout, "slot %s not created: with snapshot.mode=initial pgoutbox run creates it after publishing the rows the outbox tables hold\n", cfg.Postgres.Slot)
		return exitOK
	}
	// Create the slot now too: events are captured from the slot's creation
	// on, so an application that writes between the migration and the
	// relay's first start loses nothing. After an initial snapshot that a
	// relay (of another configuration) may be reading: a slot made during
	// it would start after its consistent point.
	if err := waitForSnapshot(ctx, conn, cfg.Postgres.Slot, stdout); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: create slot %s: %v\n", cfg.Postgres.Slot, err)
		return exitRuntime
	}
	start, err := replication.Prepare(ctx, cfg.Postgres, zap.NewNop())
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: create slot %s: %v\n", cfg.Postgres.Slot, err)
		return exitRuntime
	}
	if err := relay.StartRefusal(start, cfg.Config); err != nil {
		// The state row (or the slot) says pgoutbox run would refuse to
		// start: the slot is there, but nothing will be relayed from it.
		fmt.Fprintf(stdout, "slot %s at %s is not ready: pgoutbox run refuses to start on it: %v\n", start.Slot.Name, start.Slot.ConfirmedFlushLSN, err)
		return exitRuntime
	}
	fmt.Fprintf(stdout, "slot %s ready at %s: events committed from now on will be relayed\n", start.Slot.Name, start.Slot.ConfirmedFlushLSN)
	return exitOK
}

// sharedPublication refuses to add this configuration's outbox tables to a
// publication another relay streams other tables from (another team's,
// both left at the default postgres.publication.name): each relay would
// then stop on the other's rows.
func sharedPublication(ctx context.Context, conn *pgx.Conn, pcfg replication.Config) error {
	cat, err := replication.ReadCatalog(ctx, conn, pcfg)
	if err != nil || cat.Publication == 0 || cat.AllTables {
		return nil // made by migrate, or every table's already: nothing to add
	}
	adds := slices.ContainsFunc(cat.Tables, func(t replication.TableInfo) bool { return !t.Published })
	if !adds {
		return nil
	}
	// Advice only: a state table migrate has yet to upgrade may not be
	// readable.
	sharers, err := replication.PublicationSharers(ctx, conn, pcfg)
	if err != nil || len(sharers) == 0 {
		return nil
	}
	return fmt.Errorf("%s; nothing was changed", replication.SharedPublicationProblem(pcfg, sharers))
}

// acceptCatalog records the publication's and the outbox tables' OIDs (and
// the partitions attached to them) as they are now in the state table, so
// that the next start accepts them.
func acceptCatalog(ctx context.Context, conn *pgx.Conn, pcfg replication.Config, prefix string, stdout io.Writer) error {
	if pcfg.StateTable == "" {
		return errors.New("postgres.state.table is empty: there is nothing recorded to accept")
	}
	st, had, err := replication.ReadState(ctx, conn, pcfg.StateTable, pcfg.Slot)
	if err != nil {
		return err
	}
	if !had {
		return fmt.Errorf("no state recorded for slot %q", pcfg.Slot)
	}
	// What is recorded is the catalog that was looked at and shown.
	never, cat, err := replication.NeverStreamed(ctx, conn, pcfg, st)
	if err != nil {
		return err
	}
	for _, ch := range append(never, st.Unconfigured(&cat)...) {
		fmt.Fprintf(stdout, "accepted: %s\n", ch)
	}
	if st.MessagesRecorded && st.MessagesPrefix != "" && st.MessagesPrefix != prefix {
		fmt.Fprintf(stdout, "accepted: table-less messages with prefix %q are no longer relayed (messages.prefix %q)\n", st.MessagesPrefix, prefix)
	}
	st.MessagesPrefix, st.MessagesRecorded = prefix, true
	// The old tables' rows may still be in the WAL still to be read: their
	// OIDs stay known as the outbox's.
	for _, t := range cat.Tables {
		if was, ok := st.TableOIDs[t.Name]; ok && was != t.OID && was != 0 {
			if st.RetiredOIDs == nil {
				st.RetiredOIDs = map[uint32]string{}
			}
			st.RetiredOIDs[was] = t.Name
		}
	}
	st.SetCatalog(&cat)
	st.Publication = pcfg.Publication
	st.Note = "catalog accepted by pgoutbox migrate --accept-catalog at " + time.Now().UTC().Format(time.RFC3339)
	// The hold first: once the new catalog is recorded, a start streams
	// past the gap, and cleanup must already be held by then. Only for a
	// change that may have kept events out of the stream: a table no
	// longer configured or another messages.prefix (refused at start,
	// before anything was skipped) leave no gap, and a hold would also
	// stop the cleanup of every other slot on these tables.
	if len(never) > 0 {
		if err := holdCleanup(ctx, conn, pcfg, stdout, st.Note+": events committed while the table or publication was changed may never have been relayed from the WAL"); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(stdout, "pgoutbox cleanup is not held: no change of the publication or the outbox tables that could have kept events out of the stream")
	}
	return replication.WriteState(ctx, conn, pcfg.StateTable, st)
}

// holdCleanup records a cleanup hold: pgoutbox cleanup deletes nothing until
// cleanup --release-hold, once the events of the gap are relayed.
func holdCleanup(ctx context.Context, conn *pgx.Conn, pcfg replication.Config, stdout io.Writer, why string) error {
	hold, err := replication.SetCleanupHold(ctx, conn, pcfg.StateTable, pcfg.Slot, why)
	if err != nil {
		return fmt.Errorf("%w; hold pgoutbox cleanup (and any job that deletes outbox rows) yourself until the events of the gap are relayed", err)
	}
	// The whole hold, older gaps not yet released included: the ID
	// releases all of it.
	id := replication.HoldID(hold)
	fmt.Fprintf(stdout, "pgoutbox cleanup is held until the events of the gap are relayed (hold ID %s: %s): relay them from the outbox table, then run pgoutbox cleanup --release-hold=%s\n", id, hold, id)
	return nil
}

// waitForSnapshot takes the lock of an initial snapshot of slot on conn
// (held until conn closes), waiting, and saying so, while a relay with
// snapshot.mode=initial reads one: a slot made meanwhile would start after
// the snapshot's consistent point.
func waitForSnapshot(ctx context.Context, conn *pgx.Conn, slot string, stdout io.Writer) error {
	lock := replication.SnapshotLock(slot)
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", lock).Scan(&got); err != nil {
		return fmt.Errorf("take the lock of an initial snapshot of the slot: %w", err)
	}
	if got {
		return nil
	}
	fmt.Fprintf(stdout, "waiting for the initial snapshot of slot %s to end (a pgoutbox run with snapshot.mode=initial is publishing the outbox tables' rows; it makes the slot where the snapshot ends)\n", slot)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", lock); err != nil {
		return fmt.Errorf("wait for the initial snapshot of the slot: %w", err)
	}
	return nil
}

// recreateSlot is the deliberate recreation of a slot that vanished: it
// refuses while the slot exists. Otherwise it first holds cleanup in the
// state row (writing a placeholder row when there is none), so that a
// failure later leaves cleanup held rather than free to delete the rows of
// the gap, and then lets Prepare create the slot and replace the row's
// history (the hold, and any older hold not yet released, stay). With
// snapshot.mode: initial it makes no slot: a slot made now would start
// before pgoutbox run's snapshot, which then would not be taken. The row
// is made a placeholder that awaits the snapshot instead
// (replication.AwaitSnapshot), and run publishes the rows the outbox
// tables hold (the gap's among them) before it makes the slot.
func recreateSlot(ctx context.Context, conn *pgx.Conn, pcfg replication.Config, snap relay.Snapshot, stdout io.Writer) error {
	bySnapshot := snap.Mode == relay.SnapshotInitial
	if pcfg.StateTable == "" {
		return errors.New("postgres.state.table is empty: there is no history to correct; pgoutbox run creates a missing slot by itself")
	}
	if _, err := replication.ReadSlot(ctx, conn, pcfg.Slot); err == nil {
		return errors.New("the slot exists: drop it first (SELECT pg_drop_replication_slot(...)) if you really mean to start over")
	} else if !errors.Is(err, replication.ErrSlotMissing) {
		return err
	}
	if err := replication.EnsureStateTable(ctx, conn, pcfg.StateTable); err != nil {
		return err
	}
	st, had, err := replication.ReadState(ctx, conn, pcfg.StateTable, pcfg.Slot)
	if err != nil {
		return err
	}
	now := time.Now().UTC().Format(time.RFC3339)
	gap := "events committed before the new slot"
	notRelayed := "are not relayed"
	if bySnapshot {
		notRelayed = fmt.Sprintf("are not relayed from the WAL: pgoutbox run's initial snapshot publishes those whose rows the outbox tables still hold (snapshot.rows: %s), not table-less messages or rows deleted since", snap.Rows)
	}
	if had && st.AwaitingSnapshot != "" {
		fmt.Fprintf(stdout, "the old slot was %s\n", st.AwaitingSnapshot)
		gap = "events committed before the new slot (the old one was " + st.AwaitingSnapshot + ")"
	} else if had {
		fmt.Fprintf(stdout, "the old slot was last recorded confirmed at %s (%s): events committed after that and before the new slot %s\n",
			st.ConfirmedLSN, st.ConfirmedAt.UTC().Format(time.RFC3339), notRelayed)
		gap = fmt.Sprintf("events committed after %s (where the old slot was last recorded confirmed) and before the new slot", st.ConfirmedLSN)
	} else {
		id, err := replication.ReadServerIdentity(ctx, conn)
		if err != nil {
			return err
		}
		placeholder := replication.State{Slot: pcfg.Slot, SystemIdentifier: id.SystemIdentifier, Database: id.Database, Timeline: id.Timeline,
			ConfirmedAt: time.Now(), SessionStartedAt: time.Now(), Publication: pcfg.Publication,
			Note: "being recreated by pgoutbox migrate --recreate-slot at " + now}
		if err := replication.WriteState(ctx, conn, pcfg.StateTable, placeholder); err != nil {
			return err
		}
	}
	note := "slot recreated by pgoutbox migrate --recreate-slot at " + now
	why := note + ": " + gap + " were not relayed from the WAL"
	if bySnapshot {
		why += "; pgoutbox run's initial snapshot publishes those whose rows the outbox tables still hold"
	}
	if err := holdCleanup(ctx, conn, pcfg, stdout, why); err != nil {
		return err
	}
	pcfg.CreateSlot, pcfg.RecreateVanishedSlot = true, true
	if err := waitForSnapshot(ctx, conn, pcfg.Slot, stdout); err != nil {
		return err
	}
	if bySnapshot {
		// (After the snapshot's lock: one that ran meanwhile made the
		// slot, and the row is its session's.)
		if _, err := replication.ReadSlot(ctx, conn, pcfg.Slot); err == nil {
			return errors.New("an initial snapshot made the slot meanwhile: nothing left to do")
		} else if !errors.Is(err, replication.ErrSlotMissing) {
			return err
		}
		id, err := replication.ReadServerIdentity(ctx, conn)
		if err != nil {
			return err
		}
		awaited := "recreated by pgoutbox migrate --recreate-slot at " + now + " for pgoutbox run's initial snapshot"
		if had && st.AwaitingSnapshot != "" {
			awaited = st.AwaitingSnapshot + ", then " + awaited
		}
		if err := replication.AwaitSnapshot(ctx, conn, pcfg.StateTable, pcfg.Slot, id, pcfg.Publication, awaited); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "slot %s not created now, and recorded as left to pgoutbox run (snapshot.mode=initial): it publishes the rows the outbox tables hold (snapshot.rows: %s), then creates the slot where its snapshot ends\n",
			pcfg.Slot, snap.Rows)
		return nil
	}
	start, err := replication.Prepare(ctx, pcfg, zap.NewNop())
	if err != nil {
		return err
	}
	ns, _, err := replication.ReadState(ctx, conn, pcfg.StateTable, pcfg.Slot)
	if err != nil {
		return err
	}
	ns.Note = note
	if had {
		ns.Note += fmt.Sprintf("; the old slot was last confirmed at %s", st.ConfirmedLSN)
	}
	if err := replication.WriteState(ctx, conn, pcfg.StateTable, ns); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "slot %s created again at %s and recorded\n", start.Slot.Name, start.Slot.ConfirmedFlushLSN)
	return nil
}
