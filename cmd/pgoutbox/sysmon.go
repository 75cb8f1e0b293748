package main

import (
	"slices"
	"strings"
)

// The Go runtime's monitor thread (sysmon) goes into a deep sleep whenever
// every P is idle, and the next system call wakes it with its shortest
// period (20 µs) again. A relay at a steady, moderate rate goes idle
// between events, so every event pays for that cycle: a futex wake, a few
// short sleeps and a timed futex sleep, four context switches. Measured at
// 1,000 events/s on this project's 2-core VM they were two thirds of the
// process's context switches and about 40% of its CPU (DESIGN.md,
// "The runtime's monitor thread kept awake"; go.dev/issue/18236).
//
// The runtime has no setting for sysmon, but it never deep-sleeps while
// GODEBUG's schedtrace is set, and then it backs off to its longest period
// (10 ms) as it finds nothing to do. So pgoutbox run starts itself again,
// once, with schedtrace set to its largest value, about 24.8 days: the
// runtime then writes one line starting "SCHED" to stderr every 24.8 days
// of the host's uptime, the first at start-up on a host up longer than
// that. A GODEBUG that sets schedtrace itself (schedtrace=0 turns this off)
// is left as it is.
const sysmonSchedtrace = "schedtrace=2147483647"

// sysmonEnv returns environ with GODEBUG's schedtrace set to
// sysmonSchedtrace, and false if environ's GODEBUG sets schedtrace already
// (or the process was started again already).
func sysmonEnv(environ []string) ([]string, bool) {
	godebug := firstGODEBUG(environ)
	if _, set := schedtrace(godebug); set {
		return environ, false
	}
	out := slices.DeleteFunc(slices.Clone(environ), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
	if godebug != "" {
		godebug += ","
	}
	return append(out, "GODEBUG="+godebug+sysmonSchedtrace), true
}

// sysmonState describes the monitor for the start-up log line: "awake"
// with pgoutbox's own setting, "GODEBUG" where the environment's GODEBUG
// sets schedtrace otherwise, "runtime default" where the process could
// not be started again (or is not pgoutbox run's).
func sysmonState(environ []string) string {
	switch v, set := schedtrace(firstGODEBUG(environ)); {
	case !set:
		return "runtime default"
	case "schedtrace="+v == sysmonSchedtrace:
		return "awake"
	default:
		return "GODEBUG"
	}
}

// firstGODEBUG is environ's GODEBUG: the first one counts, for the runtime
// as for os.Getenv.
func firstGODEBUG(environ []string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			return v
		}
	}
	return ""
}

// schedtrace is the value godebug gives schedtrace (the last setting
// counts, as for the runtime) and whether it gives one.
func schedtrace(godebug string) (value string, set bool) {
	for _, setting := range strings.Split(godebug, ",") {
		if v, ok := strings.CutPrefix(setting, "schedtrace="); ok {
			value, set = v, true
		}
	}
	return value, set
}
