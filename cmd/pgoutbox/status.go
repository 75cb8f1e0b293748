package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

const statusHelp = `Usage: pgoutbox status [--format table|json] [flags]

Prints the replication slot's state (plugin, activity, confirmed and restart
LSN, lag, wal_status, safe_wal_size), the publication and its tables, and the
server version, read over an ordinary SQL connection. Exit status 0, 1 when
the slot does not exist, 2 for bad flags or settings, 3 when PostgreSQL cannot
be reached or refuses the connection.
`

// statusQueryTimeout bounds the queries of status and validate once
// connected (the connection itself is bounded by postgres.connect.timeout).
const statusQueryTimeout = 30 * time.Second

// cmdStatus implements "pgoutbox status".
func cmdStatus(args, environ []string, stdout, stderr io.Writer) int {
	c := newFlags("status", stderr, statusHelp)
	format := c.fs.String("format", "table", "output format: table or json")
	cfg, code, ok := c.loadOrExit(args, environ, &stdout, &stderr)
	if !ok {
		return code
	}
	if *format != "table" && *format != "json" {
		fmt.Fprintf(stderr, "pgoutbox: configuration: --format %q: use table or json\n", *format)
		return exitConfig
	}
	if err := cfg.Postgres.Validate(); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.Postgres.ConnectTimeout+statusQueryTimeout)
	defer cancel()
	conn, target, err := connectPG(ctx, cfg.Postgres)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		if errors.Is(err, errBadDSN) {
			return exitConfig
		}
		return exitStartup
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if isPoll(cfg) {
		return statusPoll(ctx, conn, target, cfg, *format, stdout, stderr)
	}

	st, err := readStatus(ctx, conn, target, cfg.Config)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: read status: %s\n", oneLine(err))
		return exitRuntime
	}
	if !writeStatus(stdout, stderr, *format, st, func(w io.Writer) { writeStatusTable(w, st) }) {
		return exitRuntime
	}
	warnOtherDestinations(ctx, conn, cfg.Config, stderr)
	if !st.Slot.Exists {
		fmt.Fprintf(stderr, "pgoutbox: replication slot %q does not exist on %s (pgoutbox run creates it when postgres.slot.create is true)\n", st.Slot.Name, target)
		return exitRuntime
	}
	if len(st.Problems) > 0 {
		fmt.Fprintf(stderr, "pgoutbox: %d problem(s) keep pgoutbox from relaying every event; see \"problems\" above\n", len(st.Problems))
		return exitRuntime
	}
	return exitOK
}

// writeStatus writes a status report as indented JSON when format is
// "json", and as table writes it otherwise: one output path for both
// sources' reports. It returns false when the JSON could not be written
// (and says so on stderr).
func writeStatus(stdout, stderr io.Writer, format string, report any, table func(io.Writer)) bool {
	if format != "json" {
		table(stdout)
		return true
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(report); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: %v\n", err)
		return false
	}
	return true
}

// statusReport is the output of "pgoutbox status". The JSON field names
// are stable; nullable values are JSON null when PostgreSQL has none.
type statusReport struct {
	Server      serverStatus      `json:"server"`
	Slot        slotStatus        `json:"slot"`
	Publication publicationStatus `json:"publication"`
	// History is the state table's row for the slot (null without one).
	History *historyStatus `json:"history"`
	// Problems lists what keeps pgoutbox from relaying every event, each
	// with its fix; empty when nothing does.
	Problems []string `json:"problems"`
}

type historyStatus struct {
	SlotCreatedAt    *time.Time `json:"slot_created_at"`
	ConfirmedLSN     string     `json:"recorded_confirmed_lsn"`
	ConfirmedAt      time.Time  `json:"recorded_at"`
	Instance         string     `json:"instance"`
	SessionStartedAt time.Time  `json:"session_started_at"`
	Timeline         int32      `json:"timeline"`
	Note             string     `json:"note"`
}

type serverStatus struct {
	// Address is host:port as configured; never the DSN, which may hold a
	// password.
	Address    string `json:"address"`
	Database   string `json:"database"`
	User       string `json:"user"`
	Version    string `json:"version"`     // server_version, e.g. "15.18 (Debian 15.18-1)"
	VersionNum int    `json:"version_num"` // server_version_num, e.g. 150018
	InRecovery bool   `json:"in_recovery"`
	// CurrentWALLSN is pg_current_wal_lsn() (pg_last_wal_replay_lsn() on a
	// standby): what lag is measured against.
	CurrentWALLSN string `json:"current_wal_lsn"`
}

type slotStatus struct {
	Name   string `json:"name"`
	Exists bool   `json:"exists"`
	// The rest is pg_replication_slots' row, null when the slot does not
	// exist (or when the column is NULL).
	Plugin            *string `json:"plugin"`
	SlotType          *string `json:"slot_type"`
	Database          *string `json:"database"`
	Active            bool    `json:"active"`
	ActivePID         *int32  `json:"active_pid"`
	ConfirmedFlushLSN *string `json:"confirmed_flush_lsn"`
	RestartLSN        *string `json:"restart_lsn"`
	// LagBytes is current_wal_lsn - confirmed_flush_lsn: WAL written since
	// the last position pgoutbox confirmed.
	LagBytes *int64 `json:"lag_bytes"`
	// RetainedWALBytes is current_wal_lsn - restart_lsn: WAL the server
	// keeps on disk for this slot.
	RetainedWALBytes *int64  `json:"retained_wal_bytes"`
	WALStatus        *string `json:"wal_status"`
	// SafeWALSize is how many more bytes of WAL can be written before the
	// slot risks losing WAL; null when max_slot_wal_keep_size is -1
	// (unlimited) or the slot is lost.
	SafeWALSize *int64 `json:"safe_wal_size"`
	// Failover and InvalidationReason are PostgreSQL 17's columns, null on
	// earlier servers (InvalidationReason also while the slot is valid).
	Failover           *bool   `json:"failover"`
	InvalidationReason *string `json:"invalidation_reason"`
}

type publicationStatus struct {
	Name            string   `json:"name"`
	Exists          bool     `json:"exists"`
	PublishesInsert bool     `json:"publishes_insert"`
	AllTables       bool     `json:"all_tables"`
	Tables          []string `json:"tables"` // pg_publication_tables, schema.table, sorted
}

// readStatus reads the server's, the slot's and the publication's state.
func readStatus(ctx context.Context, conn *pgx.Conn, target pgTarget, cfg relay.Config) (statusReport, error) {
	rc := cfg.Postgres
	ctx, cancel := context.WithTimeout(ctx, statusQueryTimeout)
	defer cancel()
	st := statusReport{Server: serverStatus{Address: target.Address, User: target.User}}
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num')::int,
		current_database(), current_user, pg_is_in_recovery(),
		(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text`).Scan(
		&st.Server.Version, &st.Server.VersionNum, &st.Server.Database, &st.Server.User, &st.Server.InRecovery, &st.Server.CurrentWALLSN)
	if err != nil {
		return st, fmt.Errorf("server version: %w", err)
	}
	if st.Slot, err = readSlotStatus(ctx, conn, rc.Slot); err != nil {
		return st, err
	}
	if st.Publication, err = readPublicationStatus(ctx, conn, rc.Publication); err != nil {
		return st, err
	}
	st.Problems = slotProblems(st.Slot, st.Server.Database, rc)
	if cat, err := replication.ReadCatalog(ctx, conn, rc); err == nil && st.Publication.Exists {
		problems := cat.Problems(rc)
		if shared := replication.SharedPublication(ctx, conn, rc, &cat, problems); shared != "" {
			problems = append([]string{shared}, problems...)
		}
		st.Problems = append(st.Problems, problems...)
	}
	if rc.StateTable != "" {
		h, had, err := replication.ReadState(ctx, conn, rc.StateTable, rc.Slot)
		if err == nil && had {
			st.History = &historyStatus{ConfirmedLSN: h.ConfirmedLSN.String(), ConfirmedAt: h.ConfirmedAt, Instance: h.Instance,
				SessionStartedAt: h.SessionStartedAt, Timeline: h.Timeline, Note: h.Note}
			if !h.SlotCreatedAt.IsZero() {
				st.History.SlotCreatedAt = &h.SlotCreatedAt
			}
			switch {
			case !st.Slot.Exists && h.AwaitingSnapshot != "":
				st.Problems = append(st.Problems, fmt.Sprintf("slot %q does not exist, on purpose: it was %s; pgoutbox run with the WAL source and snapshot.mode: initial publishes the rows written since, then makes it", rc.Slot, h.AwaitingSnapshot))
			case !st.Slot.Exists:
				st.Problems = append(st.Problems, (&replication.VanishedError{Slot: rc.Slot, State: h}).Error())
			}
		}
		// A slot moved past the fence while no session held it, which
		// pgoutbox run refuses (status said "problems: none" to it). The
		// server's start and checkpoint tell a restart's shutdown from
		// it; without them (a role that may not read pg_control_*), not
		// judged here.
		if err == nil && had && st.Slot.Exists && !st.Slot.Active && st.Slot.ConfirmedFlushLSN != nil {
			if at, perr := pglogrepl.ParseLSN(*st.Slot.ConfirmedFlushLSN); perr == nil {
				if id, ierr := replication.ReadServerIdentity(ctx, conn); ierr == nil {
					start := replication.Start{Slot: replication.SlotState{Name: rc.Slot, ConfirmedFlushLSN: replication.LSN(at)}, HadState: true, State: h, Identity: id}
					if ferr := relay.FenceRefusal(start, rc); ferr != nil {
						st.Problems = append(st.Problems, strings.TrimPrefix(ferr.Error(), "relay: "))
					}
				}
			}
		}
		// A slot of the same tables left behind where this one started,
		// which pgoutbox run refuses.
		if err == nil && had && st.Slot.Exists {
			if others, err := replication.OtherSlots(ctx, conn, rc.StateTable, rc.Slot, rc.QualifiedTables()); err == nil {
				start := replication.Start{Slot: replication.SlotState{Name: rc.Slot}, HadState: true, State: h, OtherSlots: others}
				if o, ok := relay.LeftBehindSlot(start, cfg); ok {
					st.Problems = append(st.Problems, fmt.Sprintf("slot %q, which relayed %s too, is idle at %s, before %s where this slot started: the events committed in between are in it only, and pgoutbox run refuses to start until it is past that point or dropped",
						o.Slot, o.What(cfg.Messages.Prefix), o.Confirmed, start.StartedAt()))
				}
			}
		}
	}
	if st.Problems == nil {
		st.Problems = []string{}
	}
	return st, nil
}

// slotProblems says what is wrong with an existing slot for pgoutbox.
func slotProblems(s slotStatus, db string, rc replication.Config) []string {
	if !s.Exists {
		return nil
	}
	var out []string
	val := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	if t := val(s.SlotType); t != "logical" {
		out = append(out, fmt.Sprintf("slot %q is a %s slot; pgoutbox needs a logical slot with plugin pgoutput: choose another postgres.slot.name", s.Name, t))
	} else if p := val(s.Plugin); p != "pgoutput" {
		out = append(out, fmt.Sprintf("slot %q uses plugin %q, not pgoutput: pgoutbox cannot stream from it; drop it (if nothing else uses it) or choose another postgres.slot.name", s.Name, p))
	}
	if d := val(s.Database); d != "" && d != db {
		out = append(out, fmt.Sprintf("slot %q belongs to database %q, not %q", s.Name, d, db))
	}
	if val(s.WALStatus) == "lost" || val(s.InvalidationReason) != "" {
		out = append(out, fmt.Sprintf("slot %q is invalidated (wal_status %s, invalidation_reason %q): events may be gone", s.Name, val(s.WALStatus), val(s.InvalidationReason)))
	}
	return out
}

// readSlotStatus reads the slot's row of pg_replication_slots; Exists is
// false when there is none.
func readSlotStatus(ctx context.Context, conn *pgx.Conn, slot string) (slotStatus, error) {
	r, err := replication.ReadSlotReport(ctx, conn, slot)
	if errors.Is(err, replication.ErrSlotMissing) {
		return slotStatus{Name: slot}, nil
	}
	if err != nil {
		return slotStatus{Name: slot}, err
	}
	lsn := func(l *replication.LSN) *string {
		if l == nil {
			return nil
		}
		s := l.String()
		return &s
	}
	return slotStatus{Name: slot, Exists: true, Plugin: r.Plugin, SlotType: r.SlotType, Database: r.Database,
		Active: r.Active, ActivePID: r.ActivePID, ConfirmedFlushLSN: lsn(r.ConfirmedFlushLSN), RestartLSN: lsn(r.RestartLSN),
		WALStatus: r.WALStatus, SafeWALSize: r.SafeWALSize, LagBytes: r.Lag(), RetainedWALBytes: r.Retained(),
		Failover: r.Failover, InvalidationReason: r.InvalidationReason}, nil
}

// readPublicationStatus reads the publication and its tables; Exists is
// false when there is none.
func readPublicationStatus(ctx context.Context, conn *pgx.Conn, pub string) (publicationStatus, error) {
	p, err := replication.ReadPublication(ctx, conn, pub)
	return publicationStatus{Name: p.Name, Exists: p.Exists, PublishesInsert: p.Insert, AllTables: p.AllTables, Tables: p.Tables}, err
}

// writeStatusTable prints the report as key/value lines under a heading per
// section, with the JSON field names as keys and every value starting in
// the same column.
func writeStatusTable(w io.Writer, st statusReport) {
	type line struct{ key, value string } // key "" marks a heading
	var lines []line
	head := func(h string) { lines = append(lines, line{value: h}) }
	row := func(k, v string) { lines = append(lines, line{key: k, value: v}) }
	str := func(p *string) string {
		if p == nil {
			return "-"
		}
		return *p
	}
	head("server")
	row("address", st.Server.Address)
	row("database", st.Server.Database)
	row("user", st.Server.User)
	row("version", st.Server.Version)
	row("in_recovery", strconv.FormatBool(st.Server.InRecovery))
	row("current_wal_lsn", st.Server.CurrentWALLSN)

	s := st.Slot
	head("slot")
	row("name", s.Name)
	row("exists", strconv.FormatBool(s.Exists))
	if s.Exists {
		row("plugin", str(s.Plugin))
		row("slot_type", str(s.SlotType))
		db := str(s.Database)
		if s.Database != nil && *s.Database != st.Server.Database {
			db += " (not this database)"
		}
		row("database", db)
		row("active", strconv.FormatBool(s.Active))
		pid := "-"
		if s.ActivePID != nil {
			pid = strconv.Itoa(int(*s.ActivePID))
		}
		row("active_pid", pid)
		row("confirmed_flush_lsn", str(s.ConfirmedFlushLSN))
		row("restart_lsn", str(s.RestartLSN))
		row("lag_bytes", byteCount(s.LagBytes))
		row("retained_wal_bytes", byteCount(s.RetainedWALBytes))
		row("wal_status", str(s.WALStatus))
		safe := byteCount(s.SafeWALSize)
		if s.SafeWALSize == nil && str(s.WALStatus) != "lost" {
			safe = "unlimited"
		}
		row("safe_wal_size", safe)
		failover := "-"
		if s.Failover != nil {
			failover = strconv.FormatBool(*s.Failover)
		}
		row("failover", failover)
		row("invalidation_reason", str(s.InvalidationReason))
	}

	if h := st.History; h != nil {
		head("history")
		created := "-"
		if h.SlotCreatedAt != nil {
			created = h.SlotCreatedAt.UTC().Format(time.RFC3339)
		}
		row("slot_created_at", created)
		row("recorded_confirmed_lsn", h.ConfirmedLSN)
		row("recorded_at", h.ConfirmedAt.UTC().Format(time.RFC3339))
		row("instance", h.Instance)
		row("session_started_at", h.SessionStartedAt.UTC().Format(time.RFC3339))
		row("note", h.Note)
	}

	p := st.Publication
	head("publication")
	row("name", p.Name)
	row("exists", strconv.FormatBool(p.Exists))
	if p.Exists {
		row("publishes_insert", strconv.FormatBool(p.PublishesInsert))
		row("all_tables", strconv.FormatBool(p.AllTables))
		tables := strings.Join(p.Tables, ", ")
		if tables == "" {
			tables = "-"
		}
		row("tables", tables)
	}

	head("problems")
	if len(st.Problems) == 0 {
		row("-", "none")
	}
	for _, pr := range st.Problems {
		row("-", pr)
	}

	width := 0
	for _, l := range lines {
		width = max(width, len(l.key))
	}
	var b strings.Builder
	for _, l := range lines {
		if l.key == "" {
			fmt.Fprintln(&b, l.value)
			continue
		}
		fmt.Fprintf(&b, "  %-*s  %s\n", width, l.key, l.value)
	}
	_, _ = io.WriteString(w, b.String())
}

// byteCount formats a byte count as the number and, from 1 KiB, a
// human-readable size: "1536 (1.5 KiB)". nil is "-".
func byteCount(n *int64) string {
	if n == nil {
		return "-"
	}
	v := *n
	s := strconv.FormatInt(v, 10)
	if v < 1024 && v > -1024 {
		return s
	}
	f := float64(v)
	unit := ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		f /= 1024
		unit = u
		if f < 1024 && f > -1024 {
			break
		}
	}
	return fmt.Sprintf("%s (%.1f %s)", s, f, unit)
}

// pgTarget is where a DSN points, without its password.
type pgTarget struct {
	Address  string // host:port
	Database string
	User     string
}

func (t pgTarget) String() string {
	return fmt.Sprintf("%s/%s as %s", t.Address, t.Database, t.User)
}

// errBadDSN is the error of a connection string that does not parse. Its
// text is never shown: it may hold a password.
var errBadDSN = errors.New("postgres.dsn is not a valid connection string (its text is not shown because it may hold a password)")

// connectPG opens an ordinary SQL connection with rc's DSN, bounded by the
// DSN's connect_timeout or else postgres.connect.timeout. Its errors are
// errBadDSN, a *replication.ConnectError (one line, with what to check) or
// an unreadable postgres.password.file; none contains the DSN's text.
func connectPG(ctx context.Context, rc replication.Config) (*pgx.Conn, pgTarget, error) {
	pcfg, err := rc.SQLConfig()
	if errors.Is(err, replication.ErrInvalidDSN) {
		return nil, pgTarget{}, errBadDSN
	}
	if err != nil {
		return nil, pgTarget{}, err // password.file unreadable or empty
	}
	timeout := rc.ConnectTimeout
	if pcfg.ConnectTimeout != 0 {
		timeout = pcfg.ConnectTimeout
	}
	target := pgTarget{
		Address:  fmt.Sprintf("%s:%d", pcfg.Host, pcfg.Port),
		Database: pcfg.Database,
		User:     pcfg.User,
	}
	if strings.HasPrefix(pcfg.Host, "/") { // a unix socket directory
		target.Address = fmt.Sprintf("%s/.s.PGSQL.%d", pcfg.Host, pcfg.Port)
	}
	conn, err := replication.ConnectSQL(ctx, rc, "pgoutbox-check", timeout)
	if err != nil {
		return nil, target, err
	}
	return conn, target, nil
}

// oneLine joins a multi-line error text (pgconn lists one line per host
// tried) into one line.
func oneLine(err error) string {
	s := strings.TrimSpace(err.Error())
	s = strings.ReplaceAll(s, "\n\t", "; ")
	return strings.ReplaceAll(s, "\n", "; ")
}

// minSecretLen is the shortest password scrubSecrets replaces: replacing a
// shorter one would garble the output (every "1" in an LSN) while it could
// not be told apart anyway. Nothing prints the DSN; scrubbing is the second
// line of defence.
const minSecretLen = 4

// scrubSecrets returns w, or a writer that replaces the DSN's password
// (as given, parsed from a passfile, or percent-encoded) with "xxxxx" in
// everything written through it. Each write must hold whole secrets: the
// commands write whole lines.
func scrubSecrets(w io.Writer, dsn string, extra ...string) io.Writer {
	seen := map[string]bool{}
	var secrets [][]byte
	add := func(s string) {
		if len(s) >= minSecretLen && !seen[s] {
			seen[s] = true
			secrets = append(secrets, []byte(s))
		}
	}
	if pcfg, err := pgx.ParseConfig(dsn); err == nil {
		add(pcfg.Password)
	}
	for _, e := range extra {
		add(e)
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if p, ok := u.User.Password(); ok {
			add(p)
		}
		for _, k := range []string{"password", "sslpassword"} {
			add(u.Query().Get(k))
		}
	}
	for _, s := range append([][]byte(nil), secrets...) {
		add(url.QueryEscape(string(s)))
		add(url.PathEscape(string(s)))
	}
	if len(secrets) == 0 {
		return w
	}
	return &scrubWriter{w: w, secrets: secrets}
}

// configSecrets lists the passwords the configuration gives besides the
// DSN's, for scrubSecrets: postgres.password, kafka.sasl.password and the
// contents of their files (a file that cannot be read holds nothing to
// hide; the commands report it).
func configSecrets(cfg fileConfig) []string {
	out := []string{cfg.Postgres.Password, cfg.Kafka.SASLPassword}
	for _, path := range []string{cfg.Postgres.PasswordFile, cfg.Kafka.SASLPasswordFile} {
		if path == "" {
			continue
		}
		if data, err := os.ReadFile(path); err == nil {
			s := strings.TrimSuffix(string(data), "\n")
			out = append(out, s, strings.TrimSuffix(s, "\r"))
		}
	}
	return out
}

type scrubWriter struct {
	w       io.Writer
	secrets [][]byte
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	out := p
	for _, sec := range s.secrets {
		if bytes.Contains(out, sec) {
			out = bytes.ReplaceAll(out, sec, []byte("xxxxx"))
		}
	}
	if _, err := s.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// warnOtherDestinations warns of the WAL source's instances on the slot
// that publish elsewhere than this configuration (another kafka.brokers or
// other topic-deciding router settings): they stand by for each other, and
// the one that takes the slot over decides where its events go (see
// pkg/relay's membership.go). A rolling update that changes the
// destination shows so too, until the old instances are gone.
func warnOtherDestinations(ctx context.Context, conn *pgx.Conn, cfg relay.Config, stderr io.Writer) {
	others, recorded, err := cfg.OtherDestinations(ctx, conn)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: WARN: could not read the instances on slot %q: %s\n", cfg.Postgres.Slot, oneLine(err))
		return
	}
	if recorded != "" {
		fmt.Fprintf(stderr, "pgoutbox: WARN: the state row of slot %q records that its last session published to another destination than this configuration's: %s\n", cfg.Postgres.Slot, recorded)
	}
	for _, o := range others {
		fmt.Fprintf(stderr, "pgoutbox: WARN: an instance on slot %q with another destination than this configuration's runs: %s; another deployment on this slot, or a rolling update that changes the destination under way\n", cfg.Postgres.Slot, o)
	}
}
