package relay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
)

// TestExactlyOncePoisonSaysTheTopicWasDeleted: in exactly-once mode, a
// record Kafka refuses as of an unknown topic (UNKNOWN_TOPIC_OR_PARTITION,
// after sarama's metadata retries) is handled by session.failed and
// eosSession.failedAck. The first refusal forgets the topic and restarts
// with fresh metadata (no poison yet). Refused again (with
// kafka.auto.create.topics, where no topic checker asks between the two),
// it is poison that says the topic was deleted, as in at-least-once mode:
// with fail, the fatal error; with dead-letter, the reason the next session
// dead-letters it with (Relay.poisoned). Before, exactly-once mode's
// dead-letter reason was sarama's "does not exist on this broker" alone.
func TestExactlyOncePoisonSaysTheTopicWasDeleted(t *testing.T) {
	const deletedSays = "was deleted while the relay ran"
	const topic, eventID = "orders", "00000000-0000-4000-8000-0000000003a1"
	const lsn = checkpoint.LSN(0x5000)
	for _, policy := range []string{"fail", "dead-letter"} {
		t.Run(policy, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Postgres.DSN, cfg.Kafka.Brokers, cfg.Kafka.ExactlyOnce = "postgres://eos", []string{"eos:9092"}, true
			cfg.Kafka.AutoCreateTopics = true
			cfg.Relay.PoisonPolicy = policy
			if policy == "dead-letter" {
				cfg.Relay.DeadLetterTopic = "orders.dlq"
			}
			r, err := New(cfg, zap.NewNop(), withBackend(forkBackend{}, realClock{}))
			if err != nil {
				t.Fatal(err)
			}
			r.topics.ok[topic] = 0
			s := &session{r: r, log: zap.NewNop(), clock: realClock{}, tr: checkpoint.New(0)}
			s.eos = &eosSession{s: s}
			// refused sends the transaction's one record and has Kafka
			// refuse it as of an unknown topic.
			refused := func() error {
				t.Helper()
				id, err := s.tr.Begin()
				if err != nil {
					t.Fatal(err)
				}
				if err := s.tr.Add(1); err != nil {
					t.Fatal(err)
				}
				// The same transaction, read again after the restart:
				// the session names it by its commit LSN (commitLSN);
				// the tracker, new here, wants its ends ascending.
				if err := s.tr.Commit(lsn + checkpoint.LSN(id)); err != nil {
					t.Fatal(err)
				}
				s.commits, s.commitsBase = []checkpoint.LSN{lsn}, id
				return s.failed(id, kafka.Ack{EventID: []byte(eventID), Topic: topic, Partition: 0, Offset: -1, Sent: time.Now().Add(-3 * time.Second),
					Err: &kafka.ProduceError{Topic: topic, Partition: 0, Err: sarama.ErrUnknownTopicOrPartition}})
			}

			err = refused()
			var fe *FatalError
			if err == nil || errors.As(err, &fe) || strings.Contains(err.Error(), deletedSays) {
				t.Fatalf("first refusal: want a restart with fresh metadata, not poison, got %v", err)
			}
			if _, ok := r.topics.ok[topic]; ok {
				t.Fatal("the refused topic is still known to exist")
			}
			if _, ok := r.topics.deletedSince(topic); !ok {
				t.Fatal("the refused topic is not marked deleted")
			}
			if !r.staleRetried[lsn] {
				t.Fatal("the transaction's restart with fresh metadata is not recorded")
			}

			err = refused()
			key := poisonKey{lsn: lsn, topic: topic, id: eventID}
			if policy == "fail" {
				if !errors.As(err, &fe) {
					t.Fatalf("refused again: want a fatal error, got %v", err)
				}
				for _, want := range []string{topic, eventID, deletedSays} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("fatal error does not say %q: %v", want, err)
					}
				}
				return
			}
			if err == nil || errors.As(err, &fe) {
				t.Fatalf("refused again: want the restart that aborts the Kafka transaction, got %v", err)
			}
			reason, ok := r.poisoned[key]
			if !ok {
				t.Fatalf("refused again: no dead-letter reason recorded for %v (%v)", key, r.poisoned)
			}
			for _, want := range []string{topic, deletedSays} {
				if !strings.Contains(reason, want) {
					t.Errorf("dead-letter reason does not say %q: %s", want, reason)
				}
			}
		})
	}
}
