package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// AtOnce runs create from n goroutines at once, rounds times, each on a
// connection of its own to dsn, every round released by one barrier so
// that they reach the server together: as instances started at the same
// moment do. create is given the round, to name fresh objects in each.
// The test fails, naming how many rounds had a failure and the first of
// them, if any call failed; the rounds stop at timeout.
func AtOnce(t testing.TB, dsn string, n, rounds int, timeout time.Duration, create func(ctx context.Context, conn *pgx.Conn, round int) error) {
	t.Helper()
	conns := make([]*pgx.Conn, n)
	for i := range conns {
		conns[i] = ConnectPG(t, dsn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	failed, ran := 0, 0
	var first error
	for r := 0; r < rounds && ctx.Err() == nil; r++ {
		start := make(chan struct{})
		errs := make([]error, n)
		var ready, done sync.WaitGroup
		for i, conn := range conns {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				if err := create(ctx, conn, r); err != nil {
					errs[i] = fmt.Errorf("creator %d: %w", i, err)
				}
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()
		ran++
		if err := errors.Join(errs...); err != nil {
			failed++
			if first == nil {
				first = fmt.Errorf("round %d: %w", r, err)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d rounds of %d creators at once had a failure; the first:\n%v", failed, ran, n, first)
	}
	if ran < rounds {
		t.Errorf("only %d of %d rounds ran within %s", ran, rounds, timeout)
	}
}
