package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Results is everything a run measured; results.json is its JSON form.
type Results struct {
	Mode       string          `json:"mode"` // full or smoke
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt time.Time       `json:"finished_at"`
	Machine    Machine         `json:"machine"`
	Versions   Versions        `json:"versions"`
	Settings   Settings        `json:"settings"`
	Catchup    []CatchupResult `json:"catchup"`
	Latency    []LatencyResult `json:"latency"`
	// The poll source's scenarios (poll.go).
	PollCatchup []PollCatchupResult `json:"poll_catchup,omitempty"`
	PollLatency []LatencyResult     `json:"poll_latency,omitempty"`
	TriggerCost *TriggerCostResult  `json:"trigger_cost,omitempty"`
	Micro       *MicroResult        `json:"micro_benchmarks,omitempty"`
	Versus      *VersusResult       `json:"debezium,omitempty"`
	Scaling     *ScalingResult      `json:"scaling,omitempty"`
	Writers     *WritersResult      `json:"writers,omitempty"`
	Variants    []VariantResult     `json:"variants,omitempty"`
	Targets     []Target            `json:"targets,omitempty"`
	Notes       []string            `json:"notes"`

	Files Files `json:"-"`
}

// Files are the paths Run wrote.
type Files struct {
	JSON, Summary, Plot string
}

// Machine describes the computer the run was on.
type Machine struct {
	NumCPU        int    `json:"nproc"`
	MemTotalBytes int64  `json:"memory_bytes"`
	CPUModel      string `json:"cpu_model"`
	Kernel        string `json:"kernel"`
	// Load averages (1, 5, 15 min) when the run started and ended: the
	// machine may have been shared.
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
}

// Versions of what was measured and what measured it.
type Versions struct {
	Go            string            `json:"go"`           // the harness's runtime
	GoToolchain   string            `json:"go_toolchain"` // `go version`
	PostgreSQL    string            `json:"postgresql"`   // server_version
	PGRecvlogical string            `json:"pg_recvlogical,omitempty"`
	Kafka         string            `json:"kafka"` // <kafka.version> of scripts/kafka/pom.xml
	Pgoutbox      string            `json:"pgoutbox"`
	Git           string            `json:"git,omitempty"`
	Modules       map[string]string `json:"modules"`
}

// Settings are the run's parameters.
type Settings struct {
	RunID               string            `json:"run_id"`
	Events              int               `json:"catchup_events"`
	TxnSizes            []int             `json:"catchup_txn_sizes"`
	PrepWriters         int               `json:"catchup_prep_writers"`
	PayloadPadBytes     int               `json:"payload_pad_bytes"`
	Partitions          int               `json:"partitions_per_topic"`
	Rates               []int             `json:"latency_rates"`
	DurationSeconds     float64           `json:"latency_duration_s"`
	LatencyWriters      int               `json:"latency_writers"`
	Warmup              int               `json:"latency_warmup_events"`
	SettleSeconds       float64           `json:"latency_settle_s"`
	LatencyEnd          string            `json:"latency_end"` // "kafka_append" or "pgoutbox_route"
	DrainTimeoutSeconds float64           `json:"latency_drain_timeout_s"`
	KeepUpBoundSeconds  float64           `json:"latency_keepup_bound_s"`
	KeepUpMaxGrowthMs   float64           `json:"latency_keepup_max_growth_ms"`
	PollIntervalMs      float64           `json:"poll_interval_ms"`
	BenchTime           string            `json:"micro_benchtime"`
	MicroPackages       []string          `json:"micro_packages"`
	Scenarios           []string          `json:"scenarios"`
	PgoutboxEnv         []string          `json:"pgoutbox_extra_env"`
	Variants            []Variant         `json:"variants,omitempty"`
	Runs                int               `json:"runs"`
	PostgresSettings    map[string]string `json:"postgres_settings"`
	PollInstances       []int             `json:"poll_instances"`
	PollRates           []int             `json:"poll_rates"`
	TriggerWriters      int               `json:"trigger_writers"`
	TriggerRoundSeconds float64           `json:"trigger_round_s"`
}

func settingsOf(o Options, runID string) Settings {
	s := Settings{
		RunID: runID, Events: o.Events, TxnSizes: o.TxnSizes, PrepWriters: o.PrepWriters, PayloadPadBytes: o.PayloadBytes,
		Partitions: o.Partitions, Rates: o.Rates, DurationSeconds: o.Duration.Seconds(), LatencyWriters: o.LatencyWriters,
		Warmup: o.Warmup, SettleSeconds: o.Settle.Seconds(), LatencyEnd: latencyEnd(o).key, DrainTimeoutSeconds: o.DrainTimeout.Seconds(),
		KeepUpBoundSeconds: o.KeepUpBound.Seconds(), KeepUpMaxGrowthMs: keptUpMaxGrowthMs, PollIntervalMs: float64(pollInterval) / float64(time.Millisecond),
		BenchTime: o.BenchTime, MicroPackages: o.MicroPackages, PgoutboxEnv: o.PgoutboxEnv, Variants: o.Variants, Runs: o.Runs,
		PollInstances: o.PollInstances, PollRates: o.PollRates, TriggerWriters: o.TriggerWriters, TriggerRoundSeconds: o.TriggerRound.Seconds(),
	}
	if s.PgoutboxEnv == nil {
		s.PgoutboxEnv = []string{}
	}
	for _, sc := range allScenarios {
		if o.enabled(sc) {
			s.Scenarios = append(s.Scenarios, sc)
		}
	}
	return s
}

func machineInfo() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), LoadAvgStart: loadAvg()}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					m.MemTotalBytes = kb * 1024
				}
			}
		}
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	return m
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// versions collects the versions, and the server settings that matter to
// the numbers into res.Settings.
func versions(ctx context.Context, h *harness) Versions {
	v := Versions{Go: runtime.Version(), Modules: map[string]string{}}
	cmdOut := func(name string, args ...string) string {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, name, args...)
		cmd.Dir = h.o.RepoRoot
		out, err := cmd.Output()
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(out))
	}
	v.GoToolchain = cmdOut("go", "version")
	v.Pgoutbox = cmdOut(h.o.Pgoutbox, "version")
	if h.o.PGBin != "" {
		v.PGRecvlogical = cmdOut(filepath.Join(h.o.PGBin, "pg_recvlogical"), "--version")
	}
	if rev := cmdOut("git", "rev-parse", "--short=12", "HEAD"); rev != "" {
		if cmdOut("git", "status", "--porcelain", "--untracked-files=no") != "" {
			rev += "-dirty"
		}
		v.Git = rev
	}
	_ = h.admin.QueryRow(ctx, "SHOW server_version").Scan(&v.PostgreSQL)
	v.Kafka = kafkaVersion(filepath.Join(h.o.RepoRoot, "scripts", "kafka", "pom.xml"))
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/IBM/sarama", "github.com/jackc/pgx/v5", "github.com/jackc/pglogrepl", "go.uber.org/zap":
				v.Modules[d.Path] = d.Version
			}
		}
	}
	return v
}

var pomKafkaVersion = regexp.MustCompile(`<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>`)

func kafkaVersion(pom string) string {
	data, err := os.ReadFile(pom)
	if err != nil {
		return ""
	}
	if m := pomKafkaVersion.FindSubmatch(data); m != nil {
		return string(m[1])
	}
	return ""
}

// postgresSettings reads the server settings that shape the numbers.
func postgresSettings(ctx context.Context, h *harness) map[string]string {
	out := map[string]string{}
	rows, err := h.admin.Query(ctx, `SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name = ANY($1)`,
		[]string{"fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_writer_delay", "logical_decoding_work_mem", "wal_sender_timeout"})
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if rows.Scan(&k, &v) == nil {
			out[k] = v
		}
	}
	return out
}

// notes are the caveats that go with the numbers.
func notes(r *Results) []string {
	var n []string
	if r.Mode == "smoke" {
		n = append(n, "Smoke mode: a check of the harness with tiny sizes; the numbers say nothing about performance.")
	}
	if load := firstFloat(r.Machine.LoadAvgStart); load > float64(r.Machine.NumCPU)/2 {
		n = append(n, fmt.Sprintf("The machine was busy: load average %s at the start and %s at the end on %d CPUs. PostgreSQL, Kafka, pgoutbox, pg_recvlogical and the harness share these CPUs anyway; other load makes every number worse and noisier.",
			r.Machine.LoadAvgStart, r.Machine.LoadAvgEnd, r.Machine.NumCPU))
	}
	n = append(n,
		"Catch-up: both slots start at the same LSN (the second is pg_copy_logical_replication_slot of the first); the events are written before either reader starts. pg_recvlogical (-o proto_version=1, the same publication, output to /dev/null) runs first, until --endpos; then pgoutbox, until the topic's high-water marks add up to the event count (Kafka acknowledged everything, acks=all). Both wall times include process start-up and connecting.",
		"Latency: each event is a single-statement transaction whose payload carries clock_timestamp() taken in its INSERT, i.e. just before the commit; latency is the record's Kafka append time (the topic has message.timestamp.type=LogAppendTime; millisecond precision, the middle of the millisecond is used) minus that. Writers pipeline due events over several connections, each INSERT followed by its own Sync, so each event is its own transaction.",
		fmt.Sprintf("Kept up: every committed event arrived within %s s of the writers' stop, and the lag grew by at most %d ms over the run (lag growth: the least-squares slope of latency against commit time, times the run's duration).", f1(r.Settings.KeepUpBoundSeconds), keptUpMaxGrowthMs),
		"Commit → consumer adds a sarama consumer's fetch to the latency: what an application reading the topic sees. Machine CPU busy is the share of all CPUs' time not idle while the writers ran (everything on the machine: PostgreSQL, Kafka, pgoutbox, the harness, other users).",
		"Resources: pgoutbox's peak RSS is VmHWM of /proc/<pid>/status and its CPU time utime+stime of /proc/<pid>/stat, read just before it is stopped; walsender CPU is sampled every 100 ms.",
	)
	return n
}

func firstFloat(s string) float64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// Render reads a results.json and writes the outputs again into dir, with
// the targets and notes of this version of the report.
func Render(path, dir string) (*Results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.Targets = targets(&r)
	r.Notes = notes(&r)
	return &r, writeOutputs(dir, &r)
}

// writeOutputs writes results.json, summary.md and latency.png into dir.
func writeOutputs(dir string, r *Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r.Files = Files{
		JSON:    filepath.Join(dir, "results.json"),
		Summary: filepath.Join(dir, "summary.md"),
		Plot:    filepath.Join(dir, "latency.png"),
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(r.Files.JSON, append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(r.Files.Summary, []byte(summary(r)), 0o644); err != nil {
		return err
	}
	var png bytes.Buffer
	if err := writeLatencyPlot(&png, r.Latency, r.Mode); err != nil {
		return err
	}
	return os.WriteFile(r.Files.Plot, png.Bytes(), 0o644)
}

func mb(b int64) string { return fmt.Sprintf("%.0f", float64(b)/(1<<20)) }

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// thousands formats n with thin separators: 200000 → 200,000.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// summary renders summary.md.
func summary(r *Results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	s := r.Settings
	p("# pgoutbox benchmark\n\n")
	p("Run `%s` (%s mode), %s – %s UTC (%s).\n\n", s.RunID, r.Mode, r.StartedAt.Format("2006-01-02 15:04:05"), r.FinishedAt.Format("15:04:05"),
		r.FinishedAt.Sub(r.StartedAt).Round(time.Second))

	p("## Machine\n\n")
	p("- CPU: %s, %d CPUs\n- Memory: %.1f GiB\n- Kernel: %s\n- Load average (1/5/15 min): %s at the start, %s at the end\n\n",
		orDash(r.Machine.CPUModel), r.Machine.NumCPU, float64(r.Machine.MemTotalBytes)/(1<<30), orDash(r.Machine.Kernel), r.Machine.LoadAvgStart, r.Machine.LoadAvgEnd)

	p("## Versions\n\n| component | version |\n|---|---|\n")
	v := r.Versions
	p("| pgoutbox | %s (git %s) |\n| PostgreSQL | %s |\n| pg_recvlogical | %s |\n| Kafka | %s |\n| Go | %s |\n",
		orDash(v.Pgoutbox), orDash(v.Git), orDash(v.PostgreSQL), orDash(v.PGRecvlogical), orDash(v.Kafka), orDash(v.GoToolchain))
	for _, k := range []string{"github.com/IBM/sarama", "github.com/jackc/pgx/v5", "github.com/jackc/pglogrepl"} {
		if ver, ok := v.Modules[k]; ok {
			p("| %s | %s |\n", k, ver)
		}
	}
	p("\n## Settings\n\n")
	p("- Catch-up: %s events per shape, transactions of %s events, payload padded with %d bytes, %d partitions per topic, %d writer connections to prepare.\n",
		thousands(int64(s.Events)), joinInts(s.TxnSizes), s.PayloadPadBytes, s.Partitions, s.PrepWriters)
	p("- Latency: %s events/s measured for %s s each after %s s at the same rate that are not counted, %d writer connections, %d warm-up events, kept-up bound %s s, drain timeout %s s.\n",
		joinInts(s.Rates), f0(s.DurationSeconds), f0(s.SettleSeconds), s.LatencyWriters, s.Warmup, f1(s.KeepUpBoundSeconds), f0(s.DrainTimeoutSeconds))
	extra := "defaults"
	if len(s.PgoutboxEnv) > 0 {
		extra = "defaults plus `" + strings.Join(s.PgoutboxEnv, "`, `") + "`"
	}
	p("- pgoutbox: %s. Completion polled every %s ms.\n", extra, f0(s.PollIntervalMs))
	if len(s.PostgresSettings) > 0 {
		keys := make([]string, 0, len(s.PostgresSettings))
		for k := range s.PostgresSettings {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, k+"="+s.PostgresSettings[k])
		}
		p("- PostgreSQL: %s.\n", strings.Join(kv, ", "))
	}

	if len(r.Catchup) > 0 {
		p("\n## Catch-up throughput\n\n")
		p("Events already in the WAL, read from the same LSN. pgoutbox counts as done when Kafka has acknowledged every record; its time includes start-up (the first record was in Kafka after the time in parentheses).\n\n")
		p("| events per txn | events | WAL MB | pg_recvlogical s | pg_recvlogical events/s | pgoutbox s | pgoutbox events/s | pgoutbox / pg_recvlogical |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.Catchup {
			if c.Error != "" {
				p("| %d | %s | failed: %s ||||||\n", c.TxnSize, thousands(int64(c.Events)), oneLine(c.Error))
				continue
			}
			p("| %d | %s | %s | %s | %s | %s (%s) | %s | %s |\n", c.TxnSize, thousands(int64(c.Events)), mb(c.WALBytes),
				f2(c.PGRecvlogical.WallSeconds), thousands(int64(c.PGRecvlogical.EventsPerSec)),
				f2(c.Pgoutbox.WallSeconds), f2(c.Pgoutbox.FirstRecordSeconds), thousands(int64(c.Pgoutbox.EventsPerSec)), f2(c.Ratio))
		}
		p("\nResources of the catch-up (walsender: the server process decoding for the reader):\n\n")
		p("| events per txn | pgoutbox CPU s | pgoutbox CPU s per 100k events | pgoutbox peak RSS MB | pg_recvlogical CPU s | walsender CPU s (busy, waiting for a CPU) for pg_recvlogical / for pgoutbox | broker CPU s for pgoutbox | slot confirmed after the last record, s |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.Catchup {
			if c.Error != "" {
				continue
			}
			p("| %d | %s | %s | %s | %s | %s / %s | %s | %s |\n", c.TxnSize, f2(c.Pgoutbox.CPUSeconds), f2(c.Pgoutbox.CPUSecondsPer100k), mb(c.Pgoutbox.PeakRSSBytes),
				f2(c.PGRecvlogical.CPUSeconds), walsenderCell(c.PGRecvlogical), walsenderCell(c.Pgoutbox), f2(c.Pgoutbox.BrokerCPUSeconds), confirmedCell(c.Pgoutbox))
		}
		p("\nPreparation (not a measurement of pgoutbox): ")
		var prep []string
		for _, c := range r.Catchup {
			prep = append(prep, fmt.Sprintf("%d-event transactions written at %s events/s", c.TxnSize, thousands(int64(c.PrepEventsPerSec))))
		}
		p("%s.\n", strings.Join(prep, "; "))
	}

	if len(r.Latency) > 0 {
		p("\n## Steady-state latency (commit → Kafka append)\n\n")
		p("| target events/s | achieved events/s | events | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | kept up |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n")
		for _, l := range r.Latency {
			if l.Error != "" && l.Received == 0 {
				p("| %s%s | failed: %s |||||||\n", thousands(int64(l.TargetRate)), modeTag(l.Mode), oneLine(l.Error))
				continue
			}
			kept := "yes"
			if !l.KeptUp {
				kept = "**no**"
			}
			q := l.LatencyMs
			p("| %s%s | %s | %s | %s | %s | %s | %s | %s | %s |\n", thousands(int64(l.TargetRate)), modeTag(l.Mode), thousands(int64(l.AchievedRate)),
				thousands(l.Received), f1(q.P50), f1(q.P90), f1(q.P99), f1(q.P999), f1(q.Max), kept)
		}
		p("\n![latency percentiles against rate](latency.png)\n\n")
		p("Resources, and the latency a consumer sees (commit → consumer: until a sarama consumer received the record; machine CPU busy: all CPUs, everything running, while the writers ran):\n\n")
		p("| target events/s | commit → consumer p50 / p99 ms | lag growth ms | last event after writers stopped, s | pgoutbox CPU s | pgoutbox CPU s per 100k events (while writing) | pgoutbox reads / writes / context switches per event (while writing) | pgoutbox peak RSS MB (anon + file at the end of the writes) | walsender CPU s | harness CPU s | machine CPU busy |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, l := range r.Latency {
			if l.Error != "" && l.Received == 0 {
				continue
			}
			w := l.PgoutboxWindow
			p("| %s%s | %s / %s | %s | %s | %s | %s (%s) | %.2f / %.2f / %.2f | %s | %s | %s | %s%% |\n", thousands(int64(l.TargetRate)), modeTag(l.Mode), f1(l.ReceiveLatencyMs.P50), f1(l.ReceiveLatencyMs.P99),
				f0(l.LagGrowthMs), f2(l.DrainSeconds), f2(l.Pgoutbox.CPUSeconds), f2(l.CPUSecondsPer100k), f2(l.WindowCPUSecondsPer100k),
				perEvent(w.ReadSyscalls, l.Committed), perEvent(w.WriteSyscalls, l.Committed), perEvent(w.VoluntarySwitches+w.InvoluntarySwitches, l.Committed), mb(l.Pgoutbox.PeakRSSBytes)+" ("+mb(w.RSSAnonBytes)+" + "+mb(w.RSSFileBytes)+")",
				f2(l.WalsenderCPUSeconds), f2(l.HarnessCPUSeconds), f0(l.MachineCPUBusy*100))
		}
		for _, l := range r.Latency {
			p("\n- %s events/s%s: %s%s", thousands(int64(l.TargetRate)), modeTag(l.Mode), l.KeptUpReason, errorNote(l.Error))
		}
		p("\n")
	}

	b.WriteString(pollSummary(r))
	writeEOSSummary(p, r)

	if len(r.Variants) > 0 {
		summaryVariants(p, r.Variants)
	}
	if r.Versus != nil {
		summaryVersus(p, r.Versus)
	}
	if r.Scaling != nil {
		summaryScaling(p, r.Scaling)
	}
	if r.Writers != nil {
		summaryWriters(p, r.Writers)
	}
	summaryTargets(p, r.Targets)

	if r.Micro != nil {
		p("\n## Micro-benchmarks\n\n`%s`", r.Micro.Command)
		if r.Micro.Error != "" {
			p(" failed: %s", oneLine(r.Micro.Error))
		}
		p("\n\n```text\n%s\n```\n", strings.TrimRight(r.Micro.Output, "\n"))
	}

	p("\n## Notes\n\n")
	for _, n := range r.Notes {
		p("- %s\n", n)
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.ReplaceAll(s, "|", "\\|")
}

// errorNote is " (error: ...)" after a line of the summary, or "" for no
// error.
func errorNote(err string) string {
	if err == "" {
		return ""
	}
	return " (error: " + oneLine(err) + ")"
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = thousands(int64(x))
	}
	return strings.Join(s, ", ")
}

// modeTag marks an exactly-once row.
func modeTag(mode string) string {
	if mode == "exactly-once" {
		return " (exactly-once)"
	}
	return ""
}

// writeEOSSummary puts exactly-once beside at-least-once, for the runs that
// measured both.
func writeEOSSummary(p func(string, ...any), r *Results) {
	var eos bool
	for _, c := range r.Catchup {
		eos = eos || c.PgoutboxEOS != nil
	}
	for _, l := range r.Latency {
		eos = eos || l.Mode == "exactly-once"
	}
	if !eos {
		return
	}
	p("\n## Exactly-once beside at-least-once\n\n")
	p("Each exactly-once run follows its at-least-once run. Catch-up: at-least-once is done at the last acknowledgement, exactly-once when a read_committed consumer (run by the harness, its CPU on the same machine) has every event. Latency: at-least-once's consumer reads uncommitted, exactly-once's read_committed, so commit → consumer includes the Kafka transaction's commit; commit → append does not.\n\n")
	if len(r.Catchup) > 0 {
		p("| catch-up, events per txn | at-least-once: last ack s / slot confirmed s | exactly-once: all visible s | exactly-once events/s | exactly-once / at-least-once | CPU s at-least-once / exactly-once |\n|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.Catchup {
			if c.PgoutboxEOS == nil || c.Error != "" {
				continue
			}
			p("| %d | %s / %s | %s | %s | %s | %s / %s |\n", c.TxnSize, f2(c.Pgoutbox.WallSeconds), f2(c.Pgoutbox.ConfirmedSeconds), f2(c.PgoutboxEOS.WallSeconds),
				thousands(int64(c.PgoutboxEOS.EventsPerSec)), f2(c.RatioEOS), f2(c.Pgoutbox.CPUSeconds), f2(c.PgoutboxEOS.CPUSeconds))
		}
		p("\n")
	}
	if len(r.Latency) > 0 {
		p("| events/s | mode | commit → append p50 / p99 ms | commit → consumer p50 / p99 ms | duplicates | kept up |\n|---:|:---|---:|---:|---:|:---:|\n")
		for _, l := range r.Latency {
			if l.Error != "" && l.Received == 0 {
				continue
			}
			p("| %s | %s | %s / %s | %s / %s | %d | %v |\n", thousands(int64(l.TargetRate)), l.Mode, f1(l.LatencyMs.P50), f1(l.LatencyMs.P99),
				f1(l.ReceiveLatencyMs.P50), f1(l.ReceiveLatencyMs.P99), l.Duplicates, l.KeptUp)
		}
	}
}
