package poll

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestRebalanceStopsWhenTheSessionLostItsLocks: two instances share the
// buckets; then the first one's session loses its advisory locks without
// ending (as a pooler's DISCARD ALL, or pg_advisory_unlock_all(), does),
// or only one bucket's. The second instance takes what is free; the
// first one's next Rebalance must fail with ErrNotOwnSession, naming what
// it lost, and not go on claiming buckets that now have another owner.
// It once took its missing member lock for a race of the view with its
// own lock, kept its buckets, and the two published the same keys at once.
func TestRebalanceStopsWhenTheSessionLostItsLocks(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	const buckets = 8
	for _, c := range []struct {
		name string
		lose func(c1 *pgx.Conn, m1 *Membership) string // runs on the first's session; returns what its error must name
	}{
		{"every lock", func(c1 *pgx.Conn, m1 *Membership) string {
			exec(t, c1, "SELECT pg_advisory_unlock_all()")
			return "member lock"
		}},
		{"one bucket", func(c1 *pgx.Conn, m1 *Membership) string {
			b := m1.owned[0]
			exec(t, c1, "SELECT pg_advisory_unlock($1::int, $2::int)", m1.bucketNS, b)
			return "buckets [" + strconv.Itoa(b) + "]"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c1, c2 := testenv.ConnectPG(t, dsn), testenv.ConnectPG(t, dsn)
			join := func(conn *pgx.Conn) *Membership {
				t.Helper()
				// A table of its own: the server ends the previous case's
				// sessions, and releases their locks, only a moment after
				// their connections close.
				m, err := Join(ctx, conn, "public.outbox_"+strings.ReplaceAll(c.name, " ", "_"), buckets)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			m1, m2 := join(c1), join(c2)
			rebalance := func(m *Membership) Ownership {
				t.Helper()
				o, err := m.Rebalance(ctx)
				if err != nil {
					t.Fatalf("rebalance: %v", err)
				}
				return o
			}
			// The first takes all, gives half up, the second takes it.
			rebalance(m1)
			rebalance(m2)
			rebalance(m1)
			rebalance(m2)
			if m1.Count() != buckets/2 || m2.Count() != buckets/2 {
				t.Fatalf("not balanced: the first owns %v, the second %v", m1.owned, m2.owned)
			}
			want := c.lose(c1, m1)
			o2 := rebalance(m2)
			o1, err := m1.Rebalance(ctx)
			if !errors.Is(err, ErrNotOwnSession) || !strings.Contains(err.Error(), want) {
				var both []int
				for _, b := range o1.Owned {
					if slices.Contains(o2.Owned, b) {
						both = append(both, b)
					}
				}
				t.Fatalf("the first instance's Rebalance after its session lost %s: %v (owned by both: %v); want ErrNotOwnSession naming %q", c.name, err, both, want)
			}
		})
	}
}

// TestRebalanceStopsOnASessionSharedWithAnotherInstance: through a pooler
// in transaction mode, two instances' statements can reach one server
// session. Advisory locks belong to the session, so each then holds the
// other's: neither Rebalance's view of the locks nor a lock taken again
// tells them apart, and a crashed instance's buckets stay held for as
// long as the pooler keeps the session, never claimed again. (Simulated
// here without a pooler: a second instance joins on the first one's
// connection, as the pooler would have it.) The first instance's next
// Rebalance must fail with ErrNotOwnSession; so must one on a session whose
// settings were reset (DISCARD ALL, which also drops the locks). Before
// the session mark, the first went on as if alone.
func TestRebalanceStopsOnASessionSharedWithAnotherInstance(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	const buckets = 8
	c1 := testenv.ConnectPG(t, dsn)
	m1, err := Join(ctx, c1, "public.outbox", buckets)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := m1.Rebalance(ctx); err != nil || len(o.Owned) != buckets {
		t.Fatalf("the first instance alone: %+v, %v; want every bucket", o, err)
	}
	m2, err := Join(ctx, c1, "public.outbox", buckets)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Rebalance(ctx); !errors.Is(err, ErrNotOwnSession) || !strings.Contains(err.Error(), "pooler in transaction mode") {
		t.Fatalf("the first instance's Rebalance once a second joined on its server session: %v; want ErrNotOwnSession naming a pooler in transaction mode", err)
	}
	// The session is the second's now, as far as it can tell; a reset
	// takes it from the second too.
	if _, err := m2.Rebalance(ctx); err != nil {
		t.Fatalf("the second instance, the last to mark the session: %v", err)
	}
	exec(t, c1, "RESET ALL")
	if _, err := m2.Rebalance(ctx); !errors.Is(err, ErrNotOwnSession) {
		t.Fatalf("Rebalance after RESET ALL cleared the session's settings: %v; want ErrNotOwnSession", err)
	}
}

func exec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
