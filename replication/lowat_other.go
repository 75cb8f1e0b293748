//go:build !linux

package replication

import "net"

// setRecvLowWater is only implemented on Linux; elsewhere reads wake for
// every message.
func setRecvLowWater(net.Conn, int) bool { return false }
