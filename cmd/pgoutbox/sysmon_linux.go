package main

import (
	"os"
	"syscall"
)

// keepSysmonAwake starts pgoutbox run again, in the same process, with
// sysmonEnv's GODEBUG (see sysmon.go). It returns only where it does not:
// GODEBUG sets schedtrace already, or the executable cannot be found or
// run again; the run then goes on with the runtime's default.
func keepSysmonAwake() {
	env, ok := sysmonEnv(os.Environ())
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, env) // returns only if it failed
}
