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
	dsn := env.NewDatabase(t)
	bin := buildPgoutbox(t)
	out := t.TempDir()

	o := SmokeOptions()
	o.PGDSN, o.PGBin, o.Brokers = dsn, env.PGBin, env.KafkaBrokers
	o.Database = "" // the test's own database
	o.Pgoutbox, o.Out, o.RepoRoot = bin, out, "../.."
	o.Scenarios = map[string]bool{ScenarioCatchup: true, ScenarioLatency: true, ScenarioPoll: true} // micro-benchmarks: too slow for a test
	o.Log = testWriter{t}
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
	data, err := os.ReadFile(filepath.Join(out, "results.json"))
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
