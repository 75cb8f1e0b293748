package relay

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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

// TestSimulatedStaleMetadataRetriesEachTransactionOnce: two transactions,
// each with a record Kafka always refuses for a partition the topic lacks,
// under dead-letter. Each is retried once with fresh metadata, then
// dead-lettered: two restarts in all. With one retried transaction
// remembered (not each), the second's refusal replaced the first's, the
// first was taken for stale again in the next session, and the relay
// restarted over and over (up to 98 times here) with a warning each time.
// Refused at Send, as sarama's partitioner refuses before any request, and
// at delivery.
func TestSimulatedStaleMetadataRetriesEachTransactionOnce(t *testing.T) {
	for _, atSend := range []bool{true, false} {
		played := 0
		for seed := uint64(1); seed <= 40; seed++ {
			w := newSimWorld(seed)
			w.failAfter, w.tooLarge, w.missing, w.catChange, w.faulty = false, false, "", 0, false
			w.cfg.Relay.PoisonPolicy = "dead-letter"
			w.log, w.verbose = t.Logf, *simLog
			w.staleAtSend = atSend
			core, logs := observer.New(zapcore.WarnLevel)
			w.logger = zap.New(core)
			// Two records of one key, in two transactions.
			byKey := map[string][]string{}
			for _, e := range w.wal {
				seen := map[string]bool{}
				for _, ev := range e.events {
					if e.kind == 't' && ev.emits() && !ev.message && !seen[ev.key] {
						seen[ev.key] = true
						byKey[ev.key] = append(byKey[ev.key], ev.id)
					}
				}
			}
			var targets []string
			for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
				if len(byKey[k]) >= 2 && targets == nil {
					targets = byKey[k][:2]
				}
			}
			if targets == nil {
				continue
			}
			played++
			w.staleRefusals = map[string]int{targets[0]: -1, targets[1]: -1}
			if err := w.run(); err != nil || w.err != nil {
				t.Fatalf("refused at send %v, seed %d: %v %v", atSend, seed, err, w.err)
			}
			if n := logs.FilterMessageSnippet("restarting with fresh metadata").Len(); n != 2 {
				t.Fatalf("refused at send %v, seed %d: %d restarts with fresh metadata for 2 transactions, want 2", atSend, seed, n)
			}
			if !w.dlq[targets[0]] || !w.dlq[targets[1]] {
				t.Fatalf("refused at send %v, seed %d: dead-lettered %v, want %v", atSend, seed, w.dlq, targets)
			}
		}
		if played < 20 {
			t.Fatalf("refused at send %v: the script played out in %d of 40 seeds", atSend, played)
		}
	}
}
