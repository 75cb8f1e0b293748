package poll

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestRebalanceChecksTheMembersDestinations: instances on one table show
// their Destination to each other. One joined without a fingerprint (an
// earlier version, in a rolling upgrade) counts as a member, reported as
// Unknown for a warning, rather than stopping the group. One that joins
// with another destination than the first instance's stops at its
// Rebalance (ErrDestinationMismatch, naming the first's PID and what
// differs), and the first leaves it out of the shares; one with the same
// destination shares the buckets.
func TestRebalanceChecksTheMembersDestinations(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	const buckets, table = 8, "public.outbox"
	a := Destination{Kafka: Fingerprint("kafka", "b:9092"), Router: Fingerprint("router", "topic=a")}
	b := Destination{Kafka: a.Kafka, Router: Fingerprint("router", "topic=b")}
	join := func(dest Destination) (*Membership, uint32) {
		t.Helper()
		conn := testenv.ConnectPG(t, dsn)
		m, err := JoinTo(ctx, conn, table, buckets, dest)
		if err != nil {
			t.Fatal(err)
		}
		return m, conn.PgConn().PID()
	}
	first, firstPID := join(a)
	old, oldPID := join(Destination{})
	same, _ := join(a)
	other, _ := join(b)
	if _, err := other.Rebalance(ctx); !errors.Is(err, ErrDestinationMismatch) ||
		!strings.Contains(err.Error(), "another router configuration") || strings.Contains(err.Error(), "another Kafka cluster") ||
		!strings.Contains(err.Error(), "PID "+strconv.FormatUint(uint64(firstPID), 10)) {
		t.Fatalf("Rebalance of an instance that joined with another router configuration: %v; want ErrDestinationMismatch naming PID %d and the router configuration only", err, firstPID)
	}
	o, err := first.Rebalance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o.Members != 3 || !slices.Equal(o.Unknown, []uint32{oldPID}) || len(o.Foreign) != 1 || !o.Foreign[0].Router || o.Foreign[0].Kafka {
		t.Fatalf("the first instance's Rebalance: %+v; want 3 members (itself, the same destination's and the unfingerprinted one, PID %d, as Unknown) and the other destination's as Foreign", o, oldPID)
	}
	if _, err := same.Rebalance(ctx); err != nil {
		t.Fatalf("Rebalance of an instance with the first's destination: %v", err)
	}
	if _, err := old.Rebalance(ctx); err != nil {
		t.Fatalf("Rebalance of an instance without a fingerprint: %v", err)
	}
}
