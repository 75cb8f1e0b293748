package kafka

import (
	"context"
	"net"
	"sync"

	"github.com/IBM/sarama"
)

// cancelDialer dials the connections of one call (a probe, a topic check)
// and closes them when the call's context ends. sarama's Broker holds its
// lock for a whole request, response included, so Broker.Close from another
// goroutine waits for the answer, or for kafka.read.timeout when the broker
// does not answer (a paused or overloaded broker); closing the socket under
// the request ends it at once.
type cancelDialer struct {
	ctx context.Context
	d   net.Dialer

	mu    sync.Mutex
	conns []*trackedConn
}

// withCancel returns a copy of sc whose connections end when ctx does, and
// a function that releases ctx's watch. A proxy of the caller's own is kept
// as it is (pkg/kafka sets none).
func withCancel(ctx context.Context, sc *sarama.Config) (*sarama.Config, func()) {
	if sc.Net.Proxy.Enable {
		return sc, func() {}
	}
	d := &cancelDialer{ctx: ctx, d: net.Dialer{Timeout: sc.Net.DialTimeout, KeepAlive: sc.Net.KeepAlive, LocalAddr: sc.Net.LocalAddr}}
	c := *sc
	c.Net.Proxy.Enable = true
	c.Net.Proxy.Dialer = d
	stop := context.AfterFunc(ctx, d.closeAll)
	return &c, func() { stop() }
}

func (d *cancelDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := d.d.DialContext(d.ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.ctx.Err(); err != nil {
		_ = c.Close()
		return nil, err
	}
	tc := &trackedConn{Conn: c, d: d}
	d.conns = append(d.conns, tc)
	return tc, nil
}

func (d *cancelDialer) closeAll() {
	d.mu.Lock()
	conns := d.conns
	d.conns = nil
	d.mu.Unlock()
	for _, c := range conns {
		_ = c.Conn.Close()
	}
}

// trackedConn leaves its dialer's list when closed, so that a long-lived
// client (the producer's) that reconnects now and then does not keep every
// connection it ever made.
type trackedConn struct {
	net.Conn
	d *cancelDialer
}

func (c *trackedConn) Close() error {
	c.d.mu.Lock()
	for i, o := range c.d.conns {
		if o == c {
			c.d.conns = append(c.d.conns[:i], c.d.conns[i+1:]...)
			break
		}
	}
	c.d.mu.Unlock()
	return c.Conn.Close()
}
