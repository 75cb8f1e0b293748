package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestSysmonEnvSetsScheduleTraceOnlyWhereGODEBUGLeavesItUnset(t *testing.T) {
	cases := []struct {
		name    string
		environ []string
		want    string // GODEBUG afterwards; "" = environ unchanged
	}{
		{"no GODEBUG", []string{"PATH=/bin"}, sysmonSchedtrace},
		{"other settings kept", []string{"GODEBUG=gctrace=1,madvdontneed=0"}, "gctrace=1,madvdontneed=0," + sysmonSchedtrace},
		{"empty GODEBUG", []string{"GODEBUG="}, sysmonSchedtrace},
		{"the user's schedtrace", []string{"GODEBUG=schedtrace=1000"}, ""},
		{"turned off", []string{"GODEBUG=gctrace=1,schedtrace=0"}, ""},
		{"the last setting counts", []string{"GODEBUG=schedtrace=0,schedtrace=5"}, ""},
		{"started again already", []string{"GODEBUG=" + sysmonSchedtrace}, ""},
		{"the first GODEBUG counts", []string{"GODEBUG=gctrace=1", "GODEBUG=schedtrace=0"}, "gctrace=1," + sysmonSchedtrace},
		{"the first GODEBUG counts, set", []string{"GODEBUG=schedtrace=0", "GODEBUG=gctrace=1"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env, changed := sysmonEnv(c.environ)
			if changed != (c.want != "") {
				t.Fatalf("changed = %v, want %v", changed, c.want != "")
			}
			if !changed {
				if !slices.Equal(env, c.environ) {
					t.Fatalf("environment changed to %q", env)
				}
				return
			}
			var godebug []string
			for _, kv := range env {
				if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
					godebug = append(godebug, v)
				}
			}
			if len(godebug) != 1 || godebug[0] != c.want {
				t.Fatalf("GODEBUG %q, want one %q", godebug, c.want)
			}
			if len(env) != len(c.environ)+1-countPrefix(c.environ, "GODEBUG=") {
				t.Fatalf("other variables lost or added: %q from %q", env, c.environ)
			}
		})
	}
}

func countPrefix(environ []string, prefix string) int {
	n := 0
	for _, kv := range environ {
		if strings.HasPrefix(kv, prefix) {
			n++
		}
	}
	return n
}

// The built binary, as users run it: `pgoutbox run` starts itself again
// with the setting, and the start-up line of the process that runs says
// so; a GODEBUG that sets schedtrace keeps it.
func TestRunStartsItselfWithTheMonitorKeptAwake(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("pgoutbox starts itself again only on Linux")
	}
	bin := filepath.Join(t.TempDir(), "pgoutbox")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	base := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
	for _, c := range []struct {
		name, godebug, want string
	}{
		{"default", "", `"sysmon":"awake"`},
		{"opted out", "GODEBUG=schedtrace=0", `"sysmon":"GODEBUG"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, "run", "--dsn", "postgres://x@127.0.0.1:1/db?connect_timeout=2", "--brokers", "127.0.0.1:1", "--log-format", "json")
			cmd.Env = base
			if c.godebug != "" {
				cmd.Env = append(slices.Clone(base), c.godebug)
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != exitStartup {
				t.Fatalf("exit: %v, want code %d (PostgreSQL unreachable)\n%s", err, exitStartup, out)
			}
			var start string
			for line := range strings.Lines(string(out)) {
				if strings.Contains(line, "pgoutbox starting") {
					start = line
				}
			}
			if !strings.Contains(start, c.want) {
				t.Fatalf("start-up line %q lacks %s\n%s", start, c.want, out)
			}
			if strings.Contains(string(out), "SCHED ") && c.godebug == "" && uptimeDays(t) < 24.8 {
				t.Fatalf("the runtime wrote a scheduler trace on a host up %.1f days:\n%s", uptimeDays(t), out)
			}
		})
	}
}

func uptimeDays(t *testing.T) float64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	var s float64
	if _, err := fmt.Sscan(string(b), &s); err != nil {
		t.Fatal(err)
	}
	return s / 86400
}

func TestSysmonStateReadsGODEBUGAsTheRuntimeDoes(t *testing.T) {
	for environ, want := range map[string]string{
		"PATH=/bin":                                     "runtime default",
		"GODEBUG=gctrace=1," + sysmonSchedtrace:         "awake",
		"GODEBUG=schedtrace=0," + sysmonSchedtrace:      "awake", // the last setting counts
		"GODEBUG=" + sysmonSchedtrace + ",schedtrace=0": "GODEBUG",
		"GODEBUG= schedtrace=0":                         "runtime default", // not a setting the runtime knows
	} {
		if got := sysmonState([]string{environ}); got != want {
			t.Errorf("sysmonState(%q) = %q, want %q", environ, got, want)
		}
	}
}
