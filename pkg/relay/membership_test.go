package relay

import (
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/replication"
)

func TestWALDestinationFollowsBrokersAndTopicSettingsOnly(t *testing.T) {
	base := DefaultConfig()
	base.Postgres.Tables = []string{"public.outbox"}
	base.Kafka.Brokers = []string{"b:9092", "a:9092"}
	x := base.walDestination()

	same := base
	same.Kafka.Brokers = []string{" A:9092", "b:9092"} // listed otherwise, one cluster
	same.Router.EventKeyField = "other_key"            // shapes records, not where they go
	if d := same.walDestination(); d != x {
		t.Fatalf("destination changed with settings that do not decide where events go: %+v, was %+v", d, x)
	}

	brokers := base
	brokers.Kafka.Brokers = []string{"c:9092"}
	topics := base
	topics.Router.RouteTopicReplacement = "devf_y.${routedByValue}"
	route := base
	route.Routes = map[string]map[string]string{"outbox": {"route.topic": "devf_fixed"}}
	for name, c := range map[string]Config{"brokers": brokers, "topics": topics, "routes entry": route} {
		d := c.walDestination()
		if d.Key == x.Key {
			t.Errorf("%s: another destination has the same key %d", name, d.Key)
		}
		if got, want := x.differs(d) != "", true; got != want {
			t.Errorf("%s: differs says nothing", name)
		}
	}
	if w := x.differs(brokers.walDestination()); !strings.Contains(w, "kafka.brokers") || strings.Contains(w, "topics") {
		t.Errorf("brokers differ: %q", w)
	}
	if w := x.differs(topics.walDestination()); strings.Contains(w, "kafka.brokers") || !strings.Contains(w, "topics") {
		t.Errorf("topics differ: %q", w)
	}
	if !strings.Contains(topics.walDestination().Desc, "devf_y.${routedByValue}") || !strings.Contains(x.Desc, "a:9092,b:9092") {
		t.Errorf("descriptions lack the settings: %q, %q", topics.walDestination().Desc, x.Desc)
	}
}

func TestRecordedDestinationRoundTrips(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Kafka.Brokers = []string{"a:9092"}
	d := cfg.walDestination()
	got, ok := parseDestination(d.record())
	if !ok || got != d {
		t.Fatalf("parse(record) = %+v, %v; want %+v", got, ok, d)
	}
	for _, s := range []string{"", "garbage", "wal-v2 key=1 kafka=2 router=3; x", "wal-v1 key=0 kafka=2 router=3; x"} {
		if _, ok := parseDestination(s); ok {
			t.Errorf("parse(%q) ok; want not (another format: taken over as before)", s)
		}
	}
}

func TestTakeoverWaitsOnlyWhileTheRecordedDestinationRuns(t *testing.T) {
	x := walDestination{Key: 10, Kafka: 1, Router: 2, Desc: "x"}
	y := walDestination{Key: 20, Kafka: 1, Router: 3, Desc: "y"}
	memberX := replication.SlotMember{PID: 100, Destination: x.Key}
	memberY := replication.SlotMember{PID: 200, Destination: y.Key}
	for _, c := range []struct {
		name     string
		recorded string
		own      walDestination
		members  []replication.SlotMember
		want     takeover
		holders  []uint32
	}{
		{"nothing recorded (first start, an earlier version)", "", y, []replication.SlotMember{memberX}, takeOver, nil},
		{"a format this version cannot read", "wal-v9 whatever", y, []replication.SlotMember{memberX}, takeOver, nil},
		{"the same destination", x.record(), x, []replication.SlotMember{memberX, memberY}, takeOver, nil},
		{"another destination, none of its instances left", x.record(), y, []replication.SlotMember{memberY}, takeOverChanged, nil},
		{"another destination, no members at all", x.record(), y, nil, takeOverChanged, nil},
		{"another destination whose instances run", x.record(), y, []replication.SlotMember{memberY, memberX, {PID: 101, Destination: x.Key}}, waitForRecorded, []uint32{100, 101}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, _, holders := decideTakeover(c.recorded, c.own, c.members)
			var pids []uint32
			for _, h := range holders {
				pids = append(pids, h.PID)
			}
			if d != c.want || !slices.Equal(pids, c.holders) {
				t.Fatalf("decideTakeover = %d, holders %v; want %d, %v", d, pids, c.want, c.holders)
			}
		})
	}
}
