package testenv

import (
	"testing"
	"time"
)

// Eventually calls cond every interval until it reports done, and fails the
// test with cond's last status if that takes longer than timeout. Use it to
// wait for state that other processes reach (a row replicated, a slot
// confirmed, a broker back), rather than sleeping a guessed time.
func Eventually(t testing.TB, timeout, interval time.Duration, cond func() (done bool, status string)) {
	t.Helper()
	if interval <= 0 {
		interval = 50 * time.Millisecond
	}
	deadline := time.Now().Add(timeout)
	for {
		done, status := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: not done after %s: %s", timeout, status)
		}
		time.Sleep(interval)
	}
}
