package relay

import (
	"context"
	"strconv"
	"testing"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollConnectionsMakeTheServerFindAVanishedClientWithinAMinute: the
// poll source's connections (the claim session's among them, which holds
// the buckets' locks) ask the server to probe an idle client and to give
// up on one that acknowledges nothing, so that a relay host that vanished
// without closing its connections frees its buckets within a minute. With
// the operating system's keepalives that took 2 h 11 min. A real partition
// cannot be made on loopback: the settings in effect are what is checked.
func TestPollConnectionsMakeTheServerFindAVanishedClientWithinAMinute(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Relay.Source = SourcePoll
	cfg.Postgres.DSN = env.NewDatabase(t)
	cfg.Postgres.Tables = []string{"public.outbox"}
	cfg.Kafka.Brokers = []string{"127.0.0.1:1"}
	r, err := New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := (&pollRunner{r: r}).connect(ctx, "pgoutbox-poll")
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn(conn)
	show := func(name string) int {
		t.Helper()
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s = %q: %v", name, v, err)
		}
		return n
	}
	idle, interval, count, user := show("tcp_keepalives_idle"), show("tcp_keepalives_interval"), show("tcp_keepalives_count"), show("tcp_user_timeout")
	if idle <= 0 || interval <= 0 || count <= 0 || idle+interval*count > 60 || user <= 0 || user > 60000 {
		t.Fatalf("tcp_keepalives_idle %d s, _interval %d s, _count %d, tcp_user_timeout %d ms: want keepalives that find a vanished client within 60 s (the operating system's 7200 s, 75 s and 9 take 2 h 11 min)",
			idle, interval, count, user)
	}
}
