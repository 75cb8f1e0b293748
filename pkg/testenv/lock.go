package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The environment lock is a readers-writer lock across processes (go test
// runs packages in parallel), made of two flock(2) files in the
// environment's directory:
//
//   - a shared holder (Require) passes through the turnstile (exclusive,
//     held briefly), then holds the main lock shared for the test;
//   - an exclusive holder (RequireExclusive) holds the turnstile and then the
//     main lock exclusively for the test.
//
// An exclusive waiter sits in the turnstile, so new shared holders queue
// behind it instead of starving it. Locks within one process are
// reentrant along the test tree: a subtest of a test that holds the lock
// takes none, since waiting there would wait on its own parent.
//
// The Kafka cluster has a lock of its own (lockCluster), made the same way:
// a test that stops a cluster node does not keep out the tests that use
// only PostgreSQL and the single broker.
const lockTimeout = 10 * time.Minute

// Lock names: the file names' infix ("" for the environment's own lock).
const (
	lockMain    = ""
	lockCluster = "-cluster"
)

var held = struct {
	sync.Mutex
	shared    map[heldKey]int // Require calls holding a shared lock
	exclusive map[heldKey]int // RequireExclusive calls holding it
}{shared: map[heldKey]int{}, exclusive: map[heldKey]int{}}

type heldKey struct{ lock, test string }

// covers reports whether a lock held by a test covers test name: the same
// test or one of its subtests.
func covers(holders map[heldKey]int, lock, name string) bool {
	for h := range holders {
		if h.lock == lock && (name == h.test || strings.HasPrefix(name, h.test+"/")) {
			return true
		}
	}
	return false
}

func (e *Env) lock(t testing.TB, exclusive bool) { e.lockNamed(t, lockMain, exclusive) }

func (e *Env) lockNamed(t testing.TB, lock string, exclusive bool) {
	t.Helper()
	if e.Dir == "" {
		return
	}
	name := t.Name()
	held.Lock()
	byExclusive, byShared := covers(held.exclusive, lock, name), covers(held.shared, lock, name)
	held.Unlock()
	if byExclusive || (byShared && !exclusive) {
		return
	}
	if byShared {
		t.Fatal("testenv: RequireExclusive (or RequireClusterExclusive) in a test that already called Require (RequireCluster): call the exclusive one instead")
	}

	open := func(base string) *os.File {
		f, err := os.OpenFile(filepath.Join(e.Dir, base), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatalf("testenv: environment lock: %v", err)
		}
		return f
	}
	wait := func(f *os.File, how lockKind) {
		if err := flockWait(f, how, lockTimeout); err != nil {
			_ = f.Close()
			t.Fatalf("testenv: waiting for the environment lock %s: %v (a test that stops or pauses the servers holds it, or one that shares them)", f.Name(), err)
		}
	}

	turnstile := open(".lock" + lock + "-turnstile")
	wait(turnstile, lockExclusive)
	mainLock := open(".lock" + lock)
	if exclusive {
		wait(mainLock, lockExclusive)
	} else {
		wait(mainLock, lockShared)
		flockRelease(turnstile)
		_ = turnstile.Close()
		turnstile = nil
	}

	counts := held.shared
	if exclusive {
		counts = held.exclusive
	}
	key := heldKey{lock, name}
	held.Lock()
	counts[key]++
	held.Unlock()
	t.Cleanup(func() {
		held.Lock()
		if counts[key]--; counts[key] == 0 {
			delete(counts, key)
		}
		held.Unlock()
		flockRelease(mainLock)
		_ = mainLock.Close()
		if turnstile != nil {
			flockRelease(turnstile)
			_ = turnstile.Close()
		}
	})
}
