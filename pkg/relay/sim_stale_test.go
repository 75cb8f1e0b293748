package relay

import (
	"errors"
	"strings"
	"testing"
)

// TestSimulatedRefusalFromStaleMetadataIsRetriedBeforePoison: sarama checks
// a record's explicit partition against the partition count it cached (for
// up to ten minutes), so a record placed on a partition added since is
// refused as if the partition did not exist. That refusal was poison at
// once: under dead-letter the event went to the dead-letter topic instead
// of its own, under fail the relay stopped. The session now ends and the
// next, with a new producer and fresh metadata, sends it again; refused
// again, it is poison. The harness stands in for sarama: a real one cannot
// be made to hold stale metadata on demand.
func TestSimulatedRefusalFromStaleMetadataIsRetriedBeforePoison(t *testing.T) {
	for _, policy := range []string{"fail", "dead-letter"} {
		for _, refusals := range []int{1, -1} {
			for seed := uint64(1); seed <= 30; seed++ {
				w := newSimWorld(seed)
				w.failAfter, w.tooLarge, w.missing, w.catChange, w.faulty = false, false, "", 0, false
				w.cfg.Relay.PoisonPolicy = policy
				w.verbose, w.log = *simLog, t.Logf
				var target string
				for _, e := range w.wal {
					for _, ev := range e.events {
						if target == "" && ev.emits() {
							target = ev.id
						}
					}
				}
				w.staleRefusals = map[string]int{target: refusals}
				err := w.run()
				if w.err != nil {
					t.Fatalf("%s, %d refusals, seed %d: %v", policy, refusals, seed, w.err)
				}
				switch {
				case refusals == 1:
					// Fresh metadata knows the partition: delivered, to its
					// own topic.
					if err != nil || w.dlq[target] || !w.delivered[target] {
						t.Fatalf("%s, refused once, seed %d: Run returned %v, delivered %v, dead-lettered %v; want %s delivered to its topic",
							policy, seed, err, w.delivered[target], w.dlq[target], target)
					}
					if err := w.check(); err != nil {
						t.Fatalf("%s, refused once, seed %d: %v", policy, seed, err)
					}
				case policy == "fail":
					var fe *FatalError
					var pe *ProduceError
					if !errors.As(err, &fe) || !errors.As(err, &pe) || pe.EventID != target || !strings.Contains(err.Error(), "does not exist") {
						t.Fatalf("fail, always refused, seed %d: Run returned %v; want a fatal error naming %s", seed, err, target)
					}
				default:
					if err != nil || !w.dlq[target] {
						t.Fatalf("dead-letter, always refused, seed %d: Run returned %v, dead-lettered %v", seed, err, w.dlq[target])
					}
				}
			}
		}
	}
}
