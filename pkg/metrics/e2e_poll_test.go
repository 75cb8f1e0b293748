package metrics_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/metrics"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollSourceBacklogAndReadinessFollowARealRelay: rows written an hour
// ago while no relay ran make the backlog old: the backlog gauges show
// them and /readyz fails naming the backlog; a relay on the poll source
// publishes them, and then /readyz passes, the gauges fall to 0, and the
// claim and bucket series follow the relay.
func TestPollSourceBacklogAndReadinessFollowARealRelay(t *testing.T) {
	env := testenv.Require(t)
	e := newE2E(t, env, metrics.DefaultConfig())
	ctx := context.Background()
	cfg := e.relayConfig()
	cfg.Relay.Source = relay.SourcePoll
	if err := migrations.ApplyPoll(ctx, e.conn, migrations.PollParams{Table: "public.outbox", Notify: true, Channel: cfg.Poll.Channel("public.outbox")}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := e.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
			VALUES (gen_random_uuid(), $1, $2, 'T', '{}', now() - interval '1 hour')`, e.shape.AggregateTypes[0], fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	table, err := cfg.PollTable()
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.m.PollBacklog(bctx, cfg.Postgres, table, 100*time.Millisecond, e.log)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		f := scrape(t, e.srv.URL)
		return f.value("pgoutbox_outbox_unpublished_rows") == 20 && f.value("pgoutbox_outbox_oldest_unpublished_age_seconds") > 3500,
			fmt.Sprintf("unpublished %v, oldest %v s", f.value("pgoutbox_outbox_unpublished_rows"), f.value("pgoutbox_outbox_oldest_unpublished_age_seconds"))
	})
	e.m.SessionStarted(0) // as if a session ran, to see the backlog's reason rather than "not streaming"
	if code, body := e.readyz(t); code != http.StatusServiceUnavailable || !strings.Contains(body, "backlog: the oldest unpublished row of public.outbox was written 1h0m0s ago") {
		t.Fatalf("/readyz %d %q; want 503 naming the backlog", code, body)
	}
	e.m.SessionEnded(nil)

	e.runRelay(t, cfg)
	body := e.waitReady(t, time.Minute, "after the relay published the backlog")
	if !strings.Contains(body, "polling public.outbox") || !strings.Contains(body, "64 of 64 buckets owned, 1 instances") {
		t.Fatalf("/readyz says %q", body)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		f := scrape(t, e.srv.URL)
		return f.value("pgoutbox_outbox_unpublished_rows") == 0 && f.value("pgoutbox_poll_rows_published_total") == 20 &&
				f.value("pgoutbox_poll_buckets_owned") == 64 && f.value("pgoutbox_poll_instances") == 1 && f.value("pgoutbox_poll_claims_total") > 0,
			fmt.Sprintf("unpublished %v, published %v, buckets %v", f.value("pgoutbox_outbox_unpublished_rows"), f.value("pgoutbox_poll_rows_published_total"), f.value("pgoutbox_poll_buckets_owned"))
	})
}
