package poll

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Listener LISTENs on a table's notification channel on a connection of
// its own and turns each notification into a wake-up. It posts a wake-up
// too each time it (re)connects, since a notification sent while it was
// not listening is lost; the claim loop's poll interval covers the time in
// between.
//
// Concurrency: one goroutine, started by Listen and ended by Stop, owns
// the connection. Wake may be read from any goroutine.
type Listener struct {
	wake   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Connector opens a connection; the Listener closes it.
type Connector func(ctx context.Context) (*pgx.Conn, error)

// Reconnection backoff of the listener.
const (
	listenBackoff    = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// Listen starts listening on channel.
func Listen(connect Connector, channel string, log *zap.Logger) *Listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{wake: make(chan struct{}, 1), cancel: cancel}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.run(ctx, connect, channel, log)
	}()
	return l
}

// Wake delivers one value after any number of notifications since the
// last one was read.
func (l *Listener) Wake() <-chan struct{} { return l.wake }

// Stop ends the listener and waits for it to close its connection.
func (l *Listener) Stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *Listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *Listener) run(ctx context.Context, connect Connector, channel string, log *zap.Logger) {
	backoff := listenBackoff
	failures := 0
	for ctx.Err() == nil {
		connected, err := l.listen(ctx, connect, channel)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff, failures = listenBackoff, 0
		}
		failures++
		if failures == 1 || failures%60 == 0 {
			log.Warn("listening for the outbox table's notifications failed; claiming every poll.interval until it works again",
				zap.String("channel", channel), zap.Int("failures", failures), zap.Error(err))
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// listen connects, LISTENs and waits for notifications until the
// connection fails or ctx ends; connected says it got as far as listening.
func (l *Listener) listen(ctx context.Context, connect Connector, channel string) (connected bool, err error) {
	conn, err := connect(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return false, err
	}
	l.signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		l.signal()
	}
}
