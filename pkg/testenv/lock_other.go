//go:build !unix

package testenv

import (
	"os"
	"time"
)

// Elsewhere than Unix tests do not lock the environment (the scripts need
// bash and /proc anyway).

type lockKind int

const (
	lockShared lockKind = iota
	lockExclusive
)

func flockWait(*os.File, lockKind, time.Duration) error { return nil }

func flockRelease(*os.File) {}
