package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
)

// newPollFixture is newFixture with the outbox table completed for the
// poll source by its migration (the way `pgoutbox migrate` does it on an
// existing table), and a workload whose transactions never delete their
// rows before committing: the poll source reads the table, so such rows
// are never seen (they are an event of the WAL source only).
func newPollFixture(t *testing.T, env *testenv.Env, partitions int) *fixture {
	t.Helper()
	f := newFixture(t, env, partitions)
	f.shape.DeletePct = 0
	cfg := relay.DefaultConfig()
	p := migrations.PollParams{Table: "public.outbox", Notify: true, Channel: cfg.Poll.Channel("public.outbox")}
	if err := migrations.ApplyPoll(context.Background(), f.conn, p); err != nil {
		t.Fatal(err)
	}
	return f
}

// pollTopic creates, with one partition, the topic the fixture's rows go
// to when their aggregatetype is the slot's name.
func (f *fixture) pollTopic(t *testing.T) string {
	t.Helper()
	topic := "outbox.event." + f.slot
	f.env.CreateTopic(t, topic, 1)
	return topic
}

// pollConfig is config for the poll source, with quick rebalancing.
func (f *fixture) pollConfig() relay.Config {
	cfg := f.config()
	cfg.Relay.Source = relay.SourcePoll
	cfg.Poll.RebalanceInterval = 100 * time.Millisecond
	return cfg
}

// pollEnviron is environ for the binary on the poll source.
func (f *fixture) pollEnviron(extra ...string) []string {
	env := append(f.environ(), "PGOUTBOX_RELAY_SOURCE=poll", "PGOUTBOX_POLL_REBALANCE_INTERVAL=100ms")
	return append(env, extra...)
}

// unpublished counts the rows of the fixture's outbox with published_at NULL.
func (f *fixture) unpublished(t testing.TB) int {
	t.Helper()
	var n int
	if err := f.checkDB.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE published_at IS NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pollMembers reads the instances relaying the fixture's outbox.
func (f *fixture) pollMembers(t testing.TB) []poll.Member {
	t.Helper()
	ms, err := poll.Members(context.Background(), f.checkDB, "public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// waitBalanced waits until n instances relay the outbox and own its
// buckets between them, each its share (buckets/n, rounded either way).
func (f *fixture) waitBalanced(t testing.TB, n, buckets int) {
	t.Helper()
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		ms := f.pollMembers(t)
		total := 0
		var owned []string
		for _, m := range ms {
			total += m.Owned
			owned = append(owned, fmt.Sprint(m.Owned))
			if m.Owned < buckets/n || m.Owned > (buckets+n-1)/n {
				return false, fmt.Sprintf("%d instances own %s buckets", len(ms), strings.Join(owned, ", "))
			}
		}
		return len(ms) == n && total == buckets, fmt.Sprintf("%d instances own %s of %d buckets", len(ms), strings.Join(owned, ", "), buckets)
	})
}

// runBalanced runs n in-process relays of cfg until the test ends, waits
// until they share the buckets, and returns their stop functions.
func (f *fixture) runBalanced(t *testing.T, cfg relay.Config, n int) []func() error {
	t.Helper()
	stops := make([]func() error, n)
	for i := range stops {
		stops[i] = runRelay(t, cfg)
	}
	f.waitBalanced(t, n, cfg.Poll.Buckets)
	return stops
}

// writeEvents runs the fixture's workload until it wrote want events (at
// most maxTxns transactions).
func writeEvents(t *testing.T, w *outboxtest.Writer, want, maxTxns int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < maxTxns && w.Events() < want; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if w.Events() < want {
		t.Fatalf("writer produced only %d events in %d transactions", w.Events(), maxTxns)
	}
}
