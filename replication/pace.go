package replication

import (
	"errors"
	"net"
	"time"
)

// pacedConn is the replication connection's socket with reads paced while
// the stream is live (receive.batch.wait). The walsender writes, and
// flushes, each message of a transaction on its own (BEGIN, each row,
// COMMIT), so a reader that reads as soon as anything arrives wakes up
// several times per transaction: at 1,000 one-event transactions a second
// that was about 3.6 reads and 1.4 context switches per event, most of
// pgoutbox's CPU (DESIGN.md, "Latency and throughput"). After a read that
// emptied the socket (it returned less than it had room for), the next read
// starts no sooner than wait later, and reads what arrived meanwhile in one
// go: at most wait of latency is added to a message, and a socket that
// keeps more queued than a read takes is read at once.
//
// Waiting is not enough: the socket stays in the runtime's poller, which
// wakes a thread for every message that arrives even though no goroutine
// reads it (measured: about 2 epoll wake-ups per event). So during the
// wait the socket's low-water mark is raised (SO_RCVLOWAT), which keeps
// the kernel from reporting it readable, and put back to 1 byte before the
// next read; that read takes whatever is queued.
//
// A Wake, or the end of the Receive's context, during the wait takes
// effect when the wait ends: at most wait later.
//
// Reads happen on the stream's goroutine only (pgconn reads on the caller's
// goroutine), and so does set.
type pacedConn struct {
	net.Conn
	wait time.Duration
	on   bool
	next time.Time // the earliest start of the next read; zero: at once
	// lowWater sets the socket's low-water mark and reports whether it
	// could; raised says it is above 1 byte now.
	lowWater func(n int) bool
	raised   bool
	// now and sleep are time.Now and time.Sleep but in tests.
	now   func() time.Time
	sleep func(time.Duration)
}

// paceLowWater is the low-water mark while a paced read waits: more than
// arrives in a wait at the rates where the wake-ups cost (beyond it, reads
// come back full and are not paced). Linux makes the socket's receive
// buffer at least twice the mark.
const paceLowWater = 256 << 10

func newPacedConn(nc net.Conn, wait time.Duration) *pacedConn {
	return &pacedConn{Conn: nc, wait: wait, now: time.Now, sleep: time.Sleep,
		lowWater: func(n int) bool { return setRecvLowWater(nc, n) }}
}

func (c *pacedConn) Read(b []byte) (int, error) {
	if !c.on {
		return c.Conn.Read(b)
	}
	if !c.next.IsZero() {
		if d := c.next.Sub(c.now()); d > 0 {
			c.sleep(d)
		}
	}
	// A read that finds nothing queued waits for data: with the mark up
	// it would wait for paceLowWater bytes, so a mark that cannot be put
	// back ends the connection rather than hold messages.
	if !c.lower() {
		return 0, errLowWater
	}
	n, err := c.Conn.Read(b)
	if n > 0 && n < len(b) {
		c.next = c.now().Add(c.wait)
		c.raised = c.lowWater(paceLowWater)
	} else {
		c.next = time.Time{}
	}
	return n, err
}

// set switches pacing on or off. Off, the low-water mark is 1 byte (or
// whatever the stream sets next).
func (c *pacedConn) set(on bool) {
	if !on {
		c.lower()
		c.next = time.Time{}
	}
	c.on = on
}

// lower puts the low-water mark back to 1 byte if the pacing raised it,
// and reports whether the mark is at 1 byte.
func (c *pacedConn) lower() bool {
	if !c.raised {
		return true
	}
	c.raised = !c.lowWater(1)
	return !c.raised
}

var errLowWater = errors.New("replication: could not put the socket's low-water mark (SO_RCVLOWAT) back to 1 byte after a paced wait")

// NetConn returns the socket under the pacing.
func (c *pacedConn) NetConn() net.Conn { return c.Conn }

// underlying returns the connection under TLS and pacing.
func underlying(nc net.Conn) net.Conn {
	for {
		u, ok := unwrap(nc)
		if !ok {
			return nc
		}
		nc = u
	}
}

// pacer returns the pacing of nc, or nil.
func pacer(nc net.Conn) *pacedConn {
	for {
		if p, ok := nc.(*pacedConn); ok {
			return p
		}
		var ok bool
		if nc, ok = unwrap(nc); !ok {
			return nil
		}
	}
}

// unwrap returns the connection under nc (TLS's or the pacing's), and
// false when there is none.
func unwrap(nc net.Conn) (net.Conn, bool) {
	u, ok := nc.(interface{ NetConn() net.Conn })
	if !ok {
		return nc, false
	}
	return u.NetConn(), true
}
