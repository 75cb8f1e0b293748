package replication

import (
	"net"
	"syscall"
	"time"
)

// setRecvLowWater sets SO_RCVLOWAT on the TCP socket under c: the kernel
// then wakes a reader waiting for data only once n bytes are queued (a
// read of whatever is queued still returns at once). It reports false
// where that is not possible (not TCP).
func setRecvLowWater(c net.Conn, n int) bool {
	tc, ok := underlying(c).(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); err != nil {
		return false
	}
	return serr == nil
}

// tcpUserTimeout is TCP_USER_TIMEOUT (linux/tcp.h).
const tcpUserTimeout = 18

// setUserTimeout makes the kernel end the connection when data it sent
// stays unacknowledged for d: a server that vanished (a network partition,
// a frozen host) is then noticed within d, since status updates are sent
// every few seconds, instead of after the kernel's retries (about 15
// minutes).
func setUserTimeout(fd uintptr, d time.Duration) error {
	return syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d.Milliseconds()))
}
