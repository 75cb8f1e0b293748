//go:build unix

package testenv

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

type lockKind int

const (
	lockShared    lockKind = syscall.LOCK_SH
	lockExclusive lockKind = syscall.LOCK_EX
)

// flockWait takes the lock, polling so that the wait is bounded.
func flockWait(f *os.File, how lockKind, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), int(how)|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not free after %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func flockRelease(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
