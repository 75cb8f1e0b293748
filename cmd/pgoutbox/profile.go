package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
)

// Profiling for performance work: PGOUTBOX_CPUPROFILE=file writes a CPU
// profile of the whole run, PGOUTBOX_MEMPROFILE=file a heap profile (live
// heap after a final GC, and allocations since the start: go tool pprof
// -sample_index=alloc_objects) when `pgoutbox run` returns, and
// PGOUTBOX_TRACE=file an execution trace (go tool trace; -pprof=sync or
// net tells where goroutines wait). All are off
// unless set; they are development aids, not configuration. The benchmark
// passes them with --pgoutbox-env.
const (
	envCPUProfile = "PGOUTBOX_CPUPROFILE"
	envMemProfile = "PGOUTBOX_MEMPROFILE"
	envTrace      = "PGOUTBOX_TRACE"
)

// startProfiles starts what environ asks for and returns the function that
// finishes the profiles; errors go to stderr and leave the run alone.
func startProfiles(environ []string, stderr io.Writer) (stop func()) {
	var cpu, mem, tr string
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, envTrace+"="); ok {
			tr = v
		}
		if v, ok := strings.CutPrefix(kv, envCPUProfile+"="); ok {
			cpu = v
		}
		if v, ok := strings.CutPrefix(kv, envMemProfile+"="); ok {
			mem = v
		}
	}
	// start creates path and starts writing to it; nil when path is empty
	// or that failed (said on stderr).
	start := func(path, env string, begin func(io.Writer) error) *os.File {
		if path == "" {
			return nil
		}
		f, err := os.Create(path)
		if err == nil {
			if err = begin(f); err != nil {
				_ = f.Close()
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: %s: %v\n", env, err)
			return nil
		}
		return f
	}
	cpuFile := start(cpu, envCPUProfile, pprof.StartCPUProfile)
	traceFile := start(tr, envTrace, trace.Start)
	return func() {
		if traceFile != nil {
			trace.Stop()
			_ = traceFile.Close()
		}
		if cpuFile != nil {
			pprof.StopCPUProfile()
			_ = cpuFile.Close()
		}
		if mem != "" {
			runtime.GC()
			f, err := os.Create(mem)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
			if err != nil {
				fmt.Fprintf(stderr, "pgoutbox: %s: %v\n", envMemProfile, err)
			}
		}
	}
}
