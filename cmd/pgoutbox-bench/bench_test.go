package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestSmokeRunWritesWellFormedResults runs every scenario of the harness in
// smoke mode against the test environment and checks the outputs' form:
// numbers present and positive, the PNG decodable. It asserts nothing about
// performance.
func TestSmokeRunWritesWellFormedResults(t *testing.T) {
	env := testenv.Require(t)
	if env.PGBin == "" {
		t.Fatal("PGOUTBOX_TEST_PG_BIN is not set: pg_recvlogical is needed")
	}
	o := smokeOptions(t, env, ScenarioCatchup, ScenarioLatency, ScenarioPoll) // micro-benchmarks: too slow for a test
	// A bound for a loaded machine (the harness's own waits are longer);
	// the smoke run takes well under a minute when the machine is quiet.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("smoke run took %s", time.Since(t0).Round(time.Millisecond))

	// results.json round-trips into Results.
	data, err := os.ReadFile(filepath.Join(o.Out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got Results
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if got.Mode != "smoke" || got.Machine.NumCPU <= 0 || got.Machine.MemTotalBytes <= 0 || got.Versions.PostgreSQL == "" || got.Versions.Kafka == "" {
		t.Errorf("machine or versions incomplete: %+v %+v", got.Machine, got.Versions)
	}
	if len(got.Catchup) != len(o.TxnSizes) {
		t.Fatalf("%d catch-up results, want %d", len(got.Catchup), len(o.TxnSizes))
	}
	for _, c := range got.Catchup {
		positive(t, "catch-up "+itoa(c.TxnSize), map[string]float64{
			"pg_recvlogical wall_s": c.PGRecvlogical.WallSeconds, "pg_recvlogical events_per_s": c.PGRecvlogical.EventsPerSec,
			"pgoutbox wall_s": c.Pgoutbox.WallSeconds, "pgoutbox events_per_s": c.Pgoutbox.EventsPerSec,
			"pgoutbox cpu_s": c.Pgoutbox.CPUSeconds, "pgoutbox peak_rss": float64(c.Pgoutbox.PeakRSSBytes),
			"pgoutbox cpu per 100k": c.Pgoutbox.CPUSecondsPer100k, "ratio": c.Ratio, "wal bytes": float64(c.WALBytes),
			"records in kafka": float64(c.Pgoutbox.RecordsInKafka),
		})
		if c.Error != "" || c.Pgoutbox.RecordsInKafka != int64(c.Events) || c.StartLSN == "" || c.EndLSN == "" {
			t.Errorf("catch-up %d: %+v", c.TxnSize, c)
		}
	}
	if len(got.Latency) != len(o.Rates) {
		t.Fatalf("%d latency results, want %d", len(got.Latency), len(o.Rates))
	}
	for _, l := range got.Latency {
		q := l.LatencyMs
		positive(t, "latency "+itoa(l.TargetRate), map[string]float64{
			"events committed": float64(l.Committed), "events received": float64(l.Received), "achieved rate": l.AchievedRate,
			"p50": q.P50, "p90": q.P90, "p99": q.P99, "p99.9": q.P999, "max": q.Max,
			"pgoutbox cpu_s": l.Pgoutbox.CPUSeconds, "pgoutbox peak_rss": float64(l.Pgoutbox.PeakRSSBytes),
		})
		if !(q.P50 <= q.P90 && q.P90 <= q.P99 && q.P99 <= q.P999 && q.P999 <= q.Max) {
			t.Errorf("latency %d: percentiles out of order: %+v", l.TargetRate, q)
		}
		if l.Error != "" || l.Missing != 0 || len(l.Timeline) == 0 {
			t.Errorf("latency %d: error %q, %d missing, %d timeline entries", l.TargetRate, l.Error, l.Missing, len(l.Timeline))
		}
	}

	if len(got.PollCatchup) != len(o.PollInstances) || len(got.PollLatency) != len(pollVariants)*len(o.PollRates) || got.TriggerCost == nil {
		t.Fatalf("poll results: %d catch-ups (want %d), %d latency runs (want %d), trigger cost %v",
			len(got.PollCatchup), len(o.PollInstances), len(got.PollLatency), len(pollVariants)*len(o.PollRates), got.TriggerCost)
	}
	for _, c := range got.PollCatchup {
		positive(t, "poll catch-up "+itoa(c.Instances), map[string]float64{"wall_s": c.WallSeconds, "events_per_s": c.EventsPerSec,
			"published_s": c.PublishedSeconds, "cpu_s": c.CPUSeconds, "records": float64(c.RecordsInKafka)})
		if c.Error != "" || c.RecordsInKafka != int64(c.Events) {
			t.Errorf("poll catch-up %d: %+v", c.Instances, c)
		}
	}
	for _, l := range got.PollLatency {
		positive(t, "poll latency "+l.Source, map[string]float64{"received": float64(l.Received), "p50": l.ReceiveLatencyMs.P50, "p99": l.ReceiveLatencyMs.P99})
		if l.Error != "" || l.Missing != 0 || !strings.HasPrefix(l.Source, "poll") {
			t.Errorf("poll latency %s at %d: error %q, %d missing", l.Source, l.TargetRate, l.Error, l.Missing)
		}
	}
	if tc := got.TriggerCost; tc.Error != "" || !(tc.WithTxPerSec > 0 && tc.WithoutTxPerSec > 0) || tc.ListenerReceived == 0 {
		t.Errorf("trigger cost: %+v", tc)
	}

	sum, err := os.ReadFile(res.Files.Summary)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Machine", "## Versions", "## Catch-up throughput", "## Steady-state latency", "latency.png", "Smoke mode",
		"## Poll source: catch-up", "## Poll source: steady-state latency", "## Poll source: what the notification trigger costs"} {
		if !bytes.Contains(sum, []byte(want)) {
			t.Errorf("summary.md lacks %q", want)
		}
	}
	f, err := os.Open(res.Files.Plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("latency.png: %v", err)
	}
	if b := img.Bounds(); b.Dx() != plotW || b.Dy() != plotH {
		t.Errorf("latency.png is %v", b)
	}
}

func positive(t *testing.T, what string, values map[string]float64) {
	t.Helper()
	for k, v := range values {
		if !(v > 0) {
			t.Errorf("%s: %s = %v, want > 0", what, k, v)
		}
	}
}

func itoa(n int) string { return thousands(int64(n)) }

// buildPgoutbox builds cmd/pgoutbox into the test's temporary directory.
// smokeOptions is SmokeOptions on the test environment: the test's own
// database, a pgoutbox built for the test, a fresh output directory, and
// only the scenarios given.
func smokeOptions(t *testing.T, env *testenv.Env, scenarios ...string) Options {
	t.Helper()
	o := SmokeOptions()
	o.PGDSN, o.PGBin, o.Brokers = env.NewDatabase(t), env.PGBin, env.KafkaBrokers
	o.Database = "" // the test's own database
	o.Pgoutbox, o.Out, o.RepoRoot = buildPgoutbox(t), t.TempDir(), "../.."
	o.Scenarios = map[string]bool{}
	for _, s := range scenarios {
		o.Scenarios[s] = true
	}
	o.Log = testWriter{t}
	return o
}

func buildPgoutbox(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pgoutbox")
	out, err := exec.Command("go", "build", "-o", path, "github.com/pgoutbox/pgoutbox/cmd/pgoutbox").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./cmd/pgoutbox: %v\n%s", err, out)
	}
	return path
}

// testWriter sends the harness's progress to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestLatencyPlotDecodesForAnyNumberOfRates(t *testing.T) {
	mk := func(rate float64, p50 float64) LatencyResult {
		return LatencyResult{TargetRate: int(rate), AchievedRate: rate, Received: 100,
			LatencyMs: Percentiles{P50: p50, P90: p50 * 2, P99: p50 * 5, P999: p50 * 9, Max: p50 * 20}}
	}
	for name, rs := range map[string][]LatencyResult{
		"none":   nil,
		"one":    {mk(200, 3)},
		"three":  {mk(1000, 2.5), mk(4980, 3.1), mk(15000, 40)},
		"failed": {{TargetRate: 1000, Error: "boom"}},
		"sub-ms": {mk(1000, 0.02), mk(2000, 0.03)},
	} {
		var buf bytes.Buffer
		if err := writeLatencyPlot(&buf, rs, "full"); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		img, err := png.Decode(&buf)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if img.Bounds().Dx() != plotW {
			t.Errorf("%s: bounds %v", name, img.Bounds())
		}
	}
}

func TestFontHasEveryCharacterOfThePlotLabels(t *testing.T) {
	labels := "PGOUTBOX LATENCY, COMMIT TO CONSUMER PERCENTILES AGAINST ACHIEVED WRITE RATE, SINGLE-EVENT TRANSACTIONS" +
		"SMOKE RUN: THE NUMBERS MEAN NOTHING WRITE RATE, EVENTS/S (LOG) LATENCY, MS (LOG) NO LATENCY DATA P50 P90 P99 P99.9 0123456789"
	for _, r := range labels {
		if _, ok := glyphs[r]; !ok {
			t.Errorf("no glyph for %q", r)
		}
	}
	for r, g := range glyphs {
		for i, row := range g {
			if len(row) != glyphW || strings.Trim(row, ".#") != "" {
				t.Errorf("glyph %q row %d is %q", r, i, row)
			}
		}
	}
}

func TestParseBench(t *testing.T) {
	out := `goos: linux
pkg: github.com/pgoutbox/pgoutbox/replication
cpu: AMD EPYC
BenchmarkDecodeInsert-2        	  500000	      2139 ns/op	 146.81 MB/s	     720 B/op	      22 allocs/op
BenchmarkDecodeBeginCommit-2   	 7000000	       164.3 ns/op	      96 B/op	       2 allocs/op
BenchmarkCustom-2   	 100	       10 ns/op	  3.5 records/req
PASS
ok  	github.com/pgoutbox/pgoutbox/replication	2.021s
pkg: github.com/pgoutbox/pgoutbox/pkg/relay
BenchmarkMessageRow-2   	  200000	      8232 ns/op	  39.11 MB/s	    2104 B/op	      43 allocs/op
`
	got := parseBench(out)
	if len(got) != 4 {
		t.Fatalf("%d benchmarks: %+v", len(got), got)
	}
	if b := got[0]; b.Package != "github.com/pgoutbox/pgoutbox/replication" || b.Name != "BenchmarkDecodeInsert-2" || b.Iterations != 500000 ||
		b.NsPerOp != 2139 || b.MBPerSec != 146.81 || b.BytesPerOp != 720 || b.AllocsOp != 22 {
		t.Errorf("first: %+v", b)
	}
	if b := got[2]; b.Other["records/req"] != 3.5 {
		t.Errorf("custom metric: %+v", b)
	}
	if b := got[3]; b.Package != "github.com/pgoutbox/pgoutbox/pkg/relay" || b.AllocsOp != 43 {
		t.Errorf("last: %+v", b)
	}
}

func TestParseStatCPU(t *testing.T) {
	stat := "4242 (pg out) box) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 12 0 5000 100000 2000\n"
	got, err := parseStatCPU([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if want := 325 / clockTicks(); got != want {
		t.Errorf("cpu = %v, want %v", got, want)
	}
	if _, err := parseStatCPU([]byte("1 (x) S 1 2")); err == nil {
		t.Error("short stat: no error")
	}
}

func TestPercentilesNearestRank(t *testing.T) {
	v := make([]float64, 1000)
	for i := range v {
		v[len(v)-1-i] = float64(i + 1) // 1000 .. 1, unsorted
	}
	p := percentiles(v)
	if p.P50 != 500 || p.P90 != 900 || p.P99 != 990 || p.P999 != 999 || p.Max != 1000 || p.Mean != 500.5 {
		t.Errorf("%+v", p)
	}
	if p := percentiles([]float64{7}); p.P50 != 7 || p.P999 != 7 || p.Max != 7 {
		t.Errorf("one value: %+v", p)
	}
}

func TestSummarizeFlagsMissingEventsLateArrivalsAndGrowingLag(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	end := start.Add(10 * time.Second)
	// 1000 events at 100 events/s; lag(i) in µs; the first drop events lost.
	mk := func(lag func(i int) int64, drop int, lastRecv time.Time) *LatencyResult {
		n := 1000
		d := latencyData{committed: make([]bool, n), commitUS: make([]int64, n), recvUS: make([]int64, n), consumeUS: make([]int64, n),
			start: start, writersEnd: end, lastRecv: lastRecv, keepUpBound: 2 * time.Second, drainTimeout: 30 * time.Second}
		for i := range n {
			d.committed[i] = true
			d.commitUS[i] = start.UnixMicro() + int64(i)*10_000
			if i >= drop {
				d.recvUS[i] = d.commitUS[i] + lag(i)
				d.consumeUS[i] = d.commitUS[i] + 2*lag(i)
			}
		}
		r := &LatencyResult{}
		r.summarize(d)
		return r
	}

	r := mk(func(int) int64 { return 5000 }, 0, end.Add(100*time.Millisecond))
	if !r.KeptUp || r.Missing != 0 || r.LatencyMs.P50 != 5 || r.ReceiveLatencyMs.P50 != 10 || len(r.Timeline) != 10 || r.Timeline[3].Events != 100 || math.Abs(r.LagGrowthMs) > 1e-6 {
		t.Errorf("steady: %+v", r)
	}
	r = mk(func(i int) int64 { return int64(i) * 1000 }, 0, end) // the lag grows by 1 ms per event: 100 ms/s
	if r.KeptUp || !strings.Contains(r.KeptUpReason, "lag grew") || math.Abs(r.LagGrowthMs-999) > 1 {
		t.Errorf("growing lag: %v %s", r.LagGrowthMs, r.KeptUpReason)
	}
	r = mk(func(int) int64 { return 5000 }, 0, end.Add(3*time.Second))
	if r.KeptUp || !strings.Contains(r.KeptUpReason, "after the writers stopped") {
		t.Errorf("late: %s", r.KeptUpReason)
	}
	r = mk(func(int) int64 { return 5000 }, 10, end)
	if r.KeptUp || r.Missing != 10 || r.Received != 990 {
		t.Errorf("missing: %+v", r)
	}
}

func TestParseFlagsSmokeDefaultsAndOverrides(t *testing.T) {
	o, err := parseFlags([]string{"--smoke", "--pg-dsn", "postgres://x@127.0.0.1/db", "--pg-bin", "/usr/bin", "--kafka", "a:1,b:2",
		"--rates", "100,2_000", "--duration", "2s", "--pgoutbox-env", "PGOUTBOX_KAFKA_FLUSH_FREQUENCY=5ms"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !o.Smoke || o.Events != 2000 || len(o.Rates) != 2 || o.Rates[1] != 2000 || o.Duration != 2*time.Second ||
		len(o.Brokers) != 2 || len(o.PgoutboxEnv) != 1 || o.BenchTime != "100x" {
		t.Errorf("%+v", o)
	}
	if _, err := parseFlags([]string{"--pg-dsn", "x", "--kafka", "k", "--pg-bin", "b", "--scenarios", "bogus"}, &bytes.Buffer{}); err == nil {
		t.Error("unknown scenario accepted")
	}
	if _, err := parseFlags([]string{"--pg-dsn", "x", "--kafka", "k", "--pg-bin", "b", "--pgoutbox-env", "FOO=1"}, &bytes.Buffer{}); err == nil {
		t.Error("non-pgoutbox env accepted")
	}
}

// TestSmokeScalingAndWritersWriteWellFormedResults runs the scaling and
// writers scenarios, trimmed to a few seconds, against the test
// environment and checks the outputs' form; nothing about performance.
func TestSmokeScalingAndWritersWriteWellFormedResults(t *testing.T) {
	env := testenv.Require(t)
	if env.PGBin == "" {
		t.Fatal("PGOUTBOX_TEST_PG_BIN is not set: pg_recvlogical is needed")
	}
	o := smokeOptions(t, env, ScenarioScaling, ScenarioWriters)
	o.ScalePayloads, o.ScaleTxnSizes, o.ScaleTopics = []int{3000}, []int{50}, []int{3}
	o.Events = 300
	o.WriterDuration, o.WriterWarmup = 300*time.Millisecond, 100*time.Millisecond
	o.WriterFsync = []string{"off"} // fsync=on would change the shared server for every test
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Scaling == nil || len(res.Scaling.Points) != 3 {
		t.Fatalf("scaling: %+v", res.Scaling)
	}
	for _, p := range res.Scaling.Points {
		positive(t, "scaling "+p.Dimension, map[string]float64{
			"events": float64(p.Events), "wal": float64(p.WALBytes), "pgoutbox events/s": p.Pgoutbox.EventsPerSec,
			"pg_recvlogical events/s": p.PGRecvlogical.EventsPerSec, "rss": float64(p.Pgoutbox.PeakRSSBytes), "ratio": p.Ratio,
		})
		if p.Error != "" || p.Pgoutbox.RecordsInKafka != int64(p.Events) {
			t.Errorf("scaling %s: %+v", p.Dimension, p)
		}
	}
	if p := res.Scaling.Points[0]; p.PayloadBytes != 3000 || p.WALBytes < int64(p.Events*p.PayloadBytes) {
		t.Errorf("payload point: %d events of %d bytes in %d bytes of WAL: the padding was compressed?", p.Events, p.PayloadBytes, p.WALBytes)
	}
	if p := res.Scaling.Points[2]; p.Topics != 3 || p.Events != 300 {
		t.Errorf("topics point: %+v", p)
	}
	w := res.Writers
	if w == nil || len(w.Points) != 2*len(writerModes) {
		t.Fatalf("writers: %+v", w)
	}
	for _, p := range w.Points {
		positive(t, "writers "+p.Variant+" "+p.Mode, map[string]float64{"tps": p.TPS, "wal per txn": p.WALBytesPerTxn, "vs business": p.VsBusiness, "p50": p.LatencyMs.P50})
		if p.Errors != 0 {
			t.Errorf("writers %s %s: %d errors", p.Variant, p.Mode, p.Errors)
		}
		if p.Mode == writerBusiness && p.VsBusiness != 1 {
			t.Errorf("business alone: vs business %v", p.VsBusiness)
		}
	}
	sum, err := os.ReadFile(res.Files.Summary)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Scaling", "## Writers", "table-delete-after-insert"} {
		if !bytes.Contains(sum, []byte(want)) {
			t.Errorf("summary.md lacks %q", want)
		}
	}
}

// TestSmokeDebeziumScenario runs the debezium scenario in smoke mode
// against the real Debezium on Kafka Connect. It needs the jars
// (PGOUTBOX_DEBEZIUM_LIBS, as make test-debezium sets it) and takes a few
// minutes, so it skips without them.
func TestSmokeDebeziumScenario(t *testing.T) {
	libs := testenv.DebeziumLibs(t)
	env := testenv.Require(t)
	o := smokeOptions(t, env, ScenarioDebezium)
	o.DebeziumLibs = libs
	o.TxnSizes = []int{10}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	v := res.Versus
	// Both at once in each setting, then each alone.
	if v == nil || len(v.Catchup) != 1 || len(v.Latency) != 3 || v.Debezium == "" || v.KafkaConnect == "" {
		t.Fatalf("%+v", v)
	}
	if a := v.Latency[2]; !a.Alone || a.Pgoutbox.Phase == nil || a.Debezium.Phase == nil || a.Pgoutbox.Phase.Committed == 0 || a.Debezium.Phase.Committed == 0 || len(a.Order) != 2 {
		t.Errorf("alone: %+v", a)
	}
	c := v.Catchup[0]
	for name, r := range map[string]ReaderResult{"pg_recvlogical": c.PGRecvlogical, "debezium": c.Debezium, "pgoutbox": c.Pgoutbox} {
		positive(t, "catch-up "+name, map[string]float64{"wall": r.WallSeconds, "events/s": r.EventsPerSec, "cpu": r.CPUSeconds, "rss": float64(r.PeakRSSBytes)})
	}
	if c.Debezium.RecordsInKafka != int64(c.Events) || c.Pgoutbox.RecordsInKafka != int64(c.Events) || c.Pgoutbox.ConfirmedAfterLastSeconds < 0 {
		t.Errorf("catch-up: %+v", c)
	}
	for _, l := range v.Latency {
		if l.Error != "" || l.Pgoutbox.Missing != 0 || l.Debezium.Missing != 0 || l.Pgoutbox.Received == 0 || l.Debezium.Received == 0 {
			t.Errorf("latency %s: %+v", l.Setting, l)
		}
	}
	if len(res.Targets) == 0 {
		t.Error("no targets checked")
	}
}

func TestVersusOrderAlternates(t *testing.T) {
	a, b := versusOrder(0), versusOrder(1)
	if len(a) != 3 || a[0] != readerRecvlogical || b[0] != readerPgoutbox || a[1] != readerDebezium || b[1] != readerDebezium {
		t.Errorf("%v %v", a, b)
	}
	for i := range a {
		if a[i] != b[len(b)-1-i] {
			t.Errorf("run 2 is not run 1 reversed: %v %v", a, b)
		}
	}
}

func TestTargetsTakeTheWorstMeasurement(t *testing.T) {
	mkR := func(eps, drain float64, rss int64, busy float64) ReaderResult {
		return ReaderResult{EventsPerSec: eps, DrainEventsPerSec: drain, PeakRSSBytes: rss, WalsenderBusy: busy}
	}
	r := &Results{Versus: &VersusResult{
		Catchup: []VersusCatchup{
			{Run: 1, TxnSize: 1, SpeedupFromStart: 6, RSSRatio: 30, Debezium: mkR(1, 1, 300<<20, 0.5), Pgoutbox: mkR(6, 6, 10<<20, 0.95)},
			{Run: 2, TxnSize: 1, SpeedupFromStart: 4, RSSRatio: 25, Debezium: mkR(1, 1, 250<<20, 0.5), Pgoutbox: mkR(4, 4, 10<<20, 0.85)},
		},
		Latency: []VersusLatency{
			{Run: 1, Rate: 1000, Setting: "defaults", P99Ratio: 0.5},
			{Run: 1, Rate: 1000, Setting: "poll.interval.ms=10", P99Ratio: 0.15},
			{Run: 1, Rate: 1000, Setting: "poll.interval.ms=10", P99Ratio: 0.3, Alone: true},
			{Run: 2, Rate: 1000, Setting: "poll.interval.ms=10", P99Ratio: 0.1, Alone: true},
		},
	}}
	got := map[string]Target{}
	for _, tg := range targets(r) {
		key := strings.SplitN(tg.Name, ":", 2)[0]
		if strings.HasPrefix(key, "latency") {
			key = tg.Name[strings.LastIndex(tg.Name, ", ")+2:]
		}
		got[key] = tg
	}
	if tg := got["catch-up, 1-event transactions"]; tg.Value != 4 || tg.Met {
		t.Errorf("catch-up: %+v", tg)
	}
	if tg := got["both running at once"]; tg.Value != 0.15 || !tg.Met {
		t.Errorf("latency at once (the default-setting run must not count): %+v", tg)
	}
	if tg := got["each running alone"]; tg.Value != 0.3 || tg.Met {
		t.Errorf("latency alone (the worst run counts): %+v", tg)
	}
	if tg := got["peak RSS in the catch-up"]; tg.Value != 25 || !tg.Met {
		t.Errorf("rss: %+v", tg)
	}
	if tg := got["walsender busy during pgoutbox's drain, 1-event transactions"]; tg.Value != 0.85 || tg.Met {
		t.Errorf("walsender: %+v", tg)
	}
}

func TestProcStatusFields(t *testing.T) {
	status := []byte("Name:\tpgoutbox\nVmHWM:\t   25600 kB\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n")
	if v, ok := statusField(status, "VmHWM:"); !ok || v != 25600 {
		t.Errorf("VmHWM = %d, %v", v, ok)
	}
	if v, _ := statusField(status, "voluntary_ctxt_switches:"); v != 12 {
		t.Errorf("voluntary = %d (the nonvoluntary line must not match)", v)
	}
	if _, ok := statusField(status, "VmRSS:"); ok {
		t.Error("missing field found")
	}
	// The benchmark's own process: every counter readable (once it has
	// used a clock tick of CPU).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if cpu, _ := readCPUSeconds(os.Getpid()); cpu > 0 {
			break
		}
	}
	st, err := readProcStats(os.Getpid())
	if err != nil || st.CPUSeconds <= 0 || st.PeakRSSBytes <= 0 || st.ReadSyscalls <= 0 || st.VoluntarySwitches <= 0 {
		t.Errorf("%+v, %v", st, err)
	}
	// The resident set's split: both parts read, and together no more
	// than the peak (RssAnon + RssFile + RssShmem is VmRSS <= VmHWM).
	if st.RSSAnonBytes <= 0 || st.RSSFileBytes <= 0 || st.RSSAnonBytes+st.RSSFileBytes > st.PeakRSSBytes {
		t.Errorf("anon %d + file %d, peak %d", st.RSSAnonBytes, st.RSSFileBytes, st.PeakRSSBytes)
	}
	if d := st.since(ProcStats{CPUSeconds: 0.5, ReadSyscalls: 1, RSSAnonBytes: 1}); d.PeakRSSBytes != st.PeakRSSBytes || d.ReadSyscalls != st.ReadSyscalls-1 ||
		d.RSSAnonBytes != st.RSSAnonBytes || d.RSSFileBytes != st.RSSFileBytes {
		t.Errorf("since: %+v", d)
	}
	if got := rssSplit(ProcStats{RSSAnonBytes: 9 << 20, RSSFileBytes: 17 << 20}); got != "anon 9 MB + file 17 MB at the end of the writes" {
		t.Errorf("rssSplit = %q", got)
	}
	if got := rssSplit(ProcStats{}); !strings.Contains(got, "not read") {
		t.Errorf("rssSplit of nothing = %q", got)
	}
}

func TestRandomPadIsLettersAndDigits(t *testing.T) {
	p := randomPad(4096)
	if len(p) != 4096 || strings.Trim(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") != "" {
		t.Errorf("pad %q...", p[:32])
	}
	if p == randomPad(4096) {
		t.Error("two pads alike")
	}
}
