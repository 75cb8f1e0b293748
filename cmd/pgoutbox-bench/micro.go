package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// MicroResult is the output of the Go micro-benchmarks.
type MicroResult struct {
	Command    string       `json:"command"`
	Seconds    float64      `json:"wall_s"`
	Benchmarks []MicroBench `json:"benchmarks"`
	Output     string       `json:"output"`
	Error      string       `json:"error,omitempty"`
}

// MicroBench is one line of `go test -bench` output.
type MicroBench struct {
	Package    string  `json:"package"`
	Name       string  `json:"name"`
	Iterations int64   `json:"iterations"`
	NsPerOp    float64 `json:"ns_per_op"`
	BytesPerOp float64 `json:"bytes_per_op"`
	AllocsOp   float64 `json:"allocs_per_op"`
	MBPerSec   float64 `json:"mb_per_s,omitempty"`
	// Other holds custom metrics (b.ReportMetric), by unit.
	Other map[string]float64 `json:"other,omitempty"`
}

// microTimeout bounds the whole go test -bench run.
const microTimeout = 20 * time.Minute

func runMicro(ctx context.Context, o Options) MicroResult {
	args := append([]string{"test", "-run=^$", "-bench=.", "-benchmem", "-benchtime=" + o.BenchTime}, o.MicroPackages...)
	m := MicroResult{Command: "go " + strings.Join(args, " ")}
	cctx, cancel := context.WithTimeout(ctx, microTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, "go", args...)
	cmd.Dir = o.RepoRoot
	// Integration switches of the test environment have no business here.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PGOUTBOX_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	m.Seconds = time.Since(t0).Seconds()
	m.Output = string(out)
	if err != nil {
		m.Error = fmt.Sprintf("%s: %v", m.Command, err)
	}
	m.Benchmarks = parseBench(m.Output)
	return m
}

// parseBench reads the benchmark lines of `go test -bench` output:
//
//	pkg: github.com/pgoutbox/pgoutbox/checkpoint
//	BenchmarkX-2   	 1000000	      1043 ns/op	  12.5 MB/s	     0 B/op	       0 allocs/op
func parseBench(out string) []MicroBench {
	var res []MicroBench
	pkg := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || len(f)%2 != 0 {
			continue // a benchmark's log line, or one that failed
		}
		iters, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		b := MicroBench{Package: pkg, Name: f[0], Iterations: iters}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				b.NsPerOp = v
			case "B/op":
				b.BytesPerOp = v
			case "allocs/op":
				b.AllocsOp = v
			case "MB/s":
				b.MBPerSec = v
			default:
				if b.Other == nil {
					b.Other = map[string]float64{}
				}
				b.Other[f[i+1]] = v
			}
		}
		res = append(res, b)
	}
	return res
}
