package replication

import (
	"strings"
	"testing"
	"testing/fstest"
)

// TestCgroupMemoryLimit reads the memory limit the way a container, a
// systemd unit and a bare host present it. The expected values are the
// files' own numbers, written here by hand (unit).
func TestCgroupMemoryLimit(t *testing.T) {
	const unlimitedV1 = "9223372036854771712\n"
	cases := []struct {
		name  string
		self  string
		files map[string]string
		want  int64
	}{
		{"v2 container (cgroup namespace: its group is the root)", "0::/\n",
			map[string]string{"memory.max": "536870912\n"}, 512 << 20},
		{"v2 without a limit", "0::/\n", map[string]string{"memory.max": "max\n"}, 0},
		{"v2 unit under a slice with the smaller limit", "0::/system.slice/pgoutbox.service\n",
			map[string]string{"system.slice/pgoutbox.service/memory.max": "max\n", "system.slice/memory.max": "1073741824\n"}, 1 << 30},
		{"v2 group path not mounted (a container without its own namespace): its root's", "0::/kubepods/pod1/c1\n",
			map[string]string{"memory.max": "268435456\n"}, 256 << 20},
		{"v1 hybrid host, no limit", "12:memory:/process_api/x\n0::/\n",
			map[string]string{"memory/memory.limit_in_bytes": unlimitedV1, "memory/process_api/x/memory.limit_in_bytes": unlimitedV1}, 0},
		{"v1 group with a limit", "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n",
			map[string]string{"memory/memory.limit_in_bytes": unlimitedV1, "memory/docker/abc/memory.limit_in_bytes": "805306368\n"}, 768 << 20},
		{"v1 combined controllers", "3:memory,hugetlb:/\n", map[string]string{"memory/memory.limit_in_bytes": "134217728"}, 128 << 20},
		{"nothing readable", "0::/\n", map[string]string{}, 0},
		{"garbage", "not a cgroup line\n0::/\n", map[string]string{"memory.max": "lots\n"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := fstest.MapFS{}
			for p, v := range c.files {
				root[p] = &fstest.MapFile{Data: []byte(v)}
			}
			if got := cgroupMemoryLimit(c.self, root); got != c.want {
				t.Fatalf("limit %d, want %d", got, c.want)
			}
		})
	}
}

// TestMessageCap checks the cap against the README's sizing (512 MiB
// carries a payload of about 160 MB, 1 GiB about 340 MB), its bounds
// and the setting's precedence (unit).
func TestMessageCap(t *testing.T) {
	if c := capForLimit(512 << 20); c.Bytes < 160_000_000 || c.Bytes > 180_000_000 || !strings.Contains(c.How, "512 MiB") {
		t.Fatalf("512 MiB: %+v", c)
	}
	if c := capForLimit(1 << 30); c.Bytes < 340_000_000 || c.Bytes > 365_000_000 {
		t.Fatalf("1 GiB: %+v", c)
	}
	if c := capForLimit(16 << 20); c.Bytes != 1<<20 {
		t.Fatalf("16 MiB: %+v, want the floor of 1 MiB", c)
	}
	if c := capForLimit(0); c.Bytes != maxMessageBytes {
		t.Fatalf("no limit: %+v", c)
	}
	if c := capForLimit(64 << 30); c.Bytes != maxMessageBytes {
		t.Fatalf("64 GiB: %+v, want PostgreSQL's bound", c)
	}
	// The limit the error tells to set carries the message.
	for _, size := range []int{1, 1 << 20, 99_999_999, 100_000_000, 173_060_631, 500_000_000} {
		if c := capForLimit(LimitFor(size) << 20); c.Bytes < size {
			t.Fatalf("a message of %d bytes: LimitFor says %d MiB, whose cap is %d", size, LimitFor(size), c.Bytes)
		}
	}
	cfg := DefaultConfig()
	cfg.ReceiveMaxMessageBytes = 1 << 20
	if c := cfg.MessageCap(); c.Bytes != 1<<20 || c.How != "the setting postgres.receive.max.message.bytes" {
		t.Fatalf("set: %+v", c)
	}
	cfg.DSN = "postgres://x@127.0.0.1/db"
	for _, bad := range []int{-1, minMessageBytes - 1, maxMessageBytes + 1} {
		cfg.ReceiveMaxMessageBytes = bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "receive.max.message.bytes") {
			t.Fatalf("%d: %v", bad, err)
		}
	}
}
