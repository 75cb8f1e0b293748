//go:build !linux

package replication

import (
	"net"
	"time"
)

// setRecvLowWater is only implemented on Linux; elsewhere reads wake for
// every message.
func setRecvLowWater(net.Conn, int) bool { return false }

// setUserTimeout is only implemented on Linux.
func setUserTimeout(uintptr, time.Duration) error { return nil }
