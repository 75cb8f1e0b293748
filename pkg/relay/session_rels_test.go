package relay

import (
	"testing"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/replication"
)

// TestRelationsAnnouncedAgainAreNotKept: pgoutput announces a table again
// after every invalidation of its cached catalog entry (autovacuum's
// statistics, any DDL), each time as a new Relation. The session kept the
// class of every one for its whole life: memory that grew with the
// session's age on a busy outbox. Only the latest of each table is kept.
func TestRelationsAnnouncedAgainAreNotKept(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Postgres.DSN, cfg.Kafka.Brokers = "postgres://rels", []string{"rels:9092"}
	r, err := New(cfg, zap.NewNop(), withBackend(takenBackend{}, realClock{}))
	if err != nil {
		t.Fatal(err)
	}
	s := &session{r: r, log: zap.NewNop(), rels: map[*replication.Relation]relClass{}, relByID: map[uint32]*replication.Relation{}}
	var outbox, other *replication.Relation
	for range 1000 {
		outbox = &replication.Relation{ID: 1001, Namespace: "public", Name: "outbox", Table: "public.outbox", Columns: simColumns, Types: simTypes}
		s.classified(outbox, relClass{table: "public.outbox"})
		other = &replication.Relation{ID: 1002, Namespace: "public", Name: "other", Table: "public.other", Columns: []string{"note"}, Types: []uint32{25}}
		s.classified(other, relClass{other: true})
	}
	if len(s.rels) != 2 {
		t.Fatalf("%d relation classes kept after 1,000 announcements of two tables; want 2", len(s.rels))
	}
	if c, ok := s.rels[outbox]; !ok || c.table != "public.outbox" {
		t.Fatalf("the latest outbox relation's class is %+v (kept: %v)", c, ok)
	}
	if c, ok := s.rels[other]; !ok || !c.other {
		t.Fatalf("the latest other relation's class is %+v (kept: %v)", c, ok)
	}
}
