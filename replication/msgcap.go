package replication

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// The cap on one message from the walsender (receive.max.message.bytes).
// pgoutput sends each row whole, in one message, and pgoutbox decodes and
// routes it whole before any size check can refuse it: a row larger than
// the memory the process may use got it OOM-killed, then the standby that
// took over, at the same message, in a loop that named no event. Read
// against a cap, the message's length comes first, before its body, so the
// relay can stop on it loudly instead (see MessageTooLargeError).
const (
	// maxMessageBytes is the largest message body pgx reads
	// (pgproto3's own default, PostgreSQL's 1 GB bound on a message).
	maxMessageBytes = 0x3fffffff - 1
	// minMessageBytes is the smallest cap one may set: catalog and
	// keepalive messages, and the rows of any sane outbox, are far smaller.
	minMessageBytes = 64 << 10
	// memoryBase and memoryPerByteTenths are what a row of n bytes of
	// payload costs at its peak, measured (README.md, Sizing): a 48 MB
	// payload peaked at 112 MiB, a 64 MB one at 145 MiB, about
	// 2.3 × n + 30 MiB. That must fit under the 80% of the limit the chart
	// gives GOMEMLIMIT (goMemLimitPercent), the rest being the margin the
	// garbage collector works in. (The README and the chart give the same
	// rule, and LimitFor its inverse.)
	memoryBase          = 30 << 20
	memoryPerByteTenths = 23
	memoryUsablePercent = 80
)

// MessageCap is the cap on one message from the walsender and how it was
// chosen, for the error that names it.
type MessageCap struct {
	Bytes int
	// How says what set Bytes: the setting, or the memory limit it was
	// derived from.
	How string
}

// MessageCap returns the cap of c.ReceiveMaxMessageBytes: itself when set;
// otherwise derived from the memory limit of the process's control group
// (a container's resources.limits.memory), so that a message the process
// could not hold stops the relay, naming where, before it is read; without
// such a limit, pgx's own bound (about 1 GiB).
func (c Config) MessageCap() MessageCap {
	if c.ReceiveMaxMessageBytes > 0 {
		return MessageCap{Bytes: c.ReceiveMaxMessageBytes, How: "the setting postgres.receive.max.message.bytes"}
	}
	self, _ := os.ReadFile("/proc/self/cgroup")
	return capForLimit(cgroupMemoryLimit(string(self), os.DirFS("/sys/fs/cgroup")))
}

// capForLimit is the cap derived from a memory limit of limit bytes (0:
// none known).
func capForLimit(limit int64) MessageCap {
	if limit <= 0 {
		return MessageCap{Bytes: maxMessageBytes, How: "PostgreSQL's bound on a message (no memory limit found to derive it from)"}
	}
	n := (limit*memoryUsablePercent/100 - memoryBase) * 10 / memoryPerByteTenths
	// Never below Kafka's own default record size: a limit that small
	// leaves nothing to judge by.
	n = min(max(n, 1<<20), maxMessageBytes)
	return MessageCap{Bytes: int(n), How: fmt.Sprintf("the memory limit of %d MiB (a message needs about 2.3 times its size plus 30 MiB, under 80%% of the limit)", limit>>20)}
}

// LimitFor is the smallest memory limit, in MiB, whose derived cap takes
// a message of size bytes (capForLimit's inverse, rounded up, with a MiB
// to spare): what the error that stops on such a message tells to set.
func LimitFor(size int) int64 {
	need := (int64(size)*memoryPerByteTenths/10 + memoryBase) * 100 / memoryUsablePercent
	return need>>20 + 2
}

// cgroupMemoryLimit is the smallest memory limit set on the control group
// the process is in (self: /proc/self/cgroup) or any of its ancestors,
// read from root (/sys/fs/cgroup): cgroup v2's memory.max, v1's
// memory.limit_in_bytes. In a container the group's own path may not be
// mounted (its root is): the files that are missing are passed over. 0:
// no limit found.
func cgroupMemoryLimit(self string, root fs.FS) int64 {
	var best int64
	consider := func(dir, file string) {
		for {
			if b, err := fs.ReadFile(root, path.Join(dir, file)); err == nil {
				v := strings.TrimSpace(string(b))
				// "max" (v2), or v1's unlimited: the largest page-aligned
				// int64.
				if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && n < 1<<62 && (best == 0 || n < best) {
					best = n
				}
			}
			if dir == "." {
				return
			}
			dir = path.Dir(dir)
		}
	}
	for line := range strings.Lines(self) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		rel := strings.TrimPrefix(path.Clean("/"+parts[2]), "/")
		if rel == "" {
			rel = "."
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			consider(rel, "memory.max")
		case hasController(parts[1], "memory"):
			consider(path.Join("memory", rel), "memory.limit_in_bytes")
		}
	}
	return best
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// MessageTooLargeError is a message from the walsender longer than the
// cap the stream reads with (Config.MessageCap): its body was not read.
// The stream is unusable afterwards. Every new session would meet the same
// message, so the relay stops on it.
type MessageTooLargeError struct {
	Slot  string
	Size  int // the message's body, in bytes
	Cap   MessageCap
	After LSN // the last WAL position received before it
}

func (e *MessageTooLargeError) Error() string {
	return fmt.Sprintf("replication: slot %q: the walsender sent a message of %d bytes after WAL %s, more than the %d bytes pgoutbox reads in one message (a cap set by %s)",
		e.Slot, e.Size, e.After, e.Cap.Bytes, e.Cap.How)
}
