package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/router"
)

// txnConfig is a transactional producer's configuration for the
// environment, with an offsets topic and a transactional id of the test's
// own.
func txnConfig(t *testing.T, env *testenv.Env) (Config, SlotIdentity) {
	name := testenv.UniqueName(t, "txn")
	cfg := Config{Brokers: env.KafkaBrokers, ExactlyOnce: true, OffsetsTopic: "pgoutbox.offsets." + name}
	id := SlotIdentity{SystemIdentifier: "7000000000000000001", Database: "db", Slot: name, Timeline: 4}
	cfg.TransactionalID = id.TransactionalID()
	return cfg, id
}

// readCommitted reads a partition to its end with iso.
func readCommitted(t *testing.T, env *testenv.Env, topic string, p int32, iso sarama.IsolationLevel) []PartitionRecord {
	t.Helper()
	out, err := readFor(env, topic, p, iso, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readFor(env *testenv.Env, topic string, p int32, iso sarama.IsolationLevel, d time.Duration) ([]PartitionRecord, error) {
	sc := sarama.NewConfig()
	sc.Version = sarama.V4_0_0_0
	client, err := sarama.NewClient(env.KafkaBrokers, sc)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []PartitionRecord
	err = ReadPartition(ctx, client, topic, p, 0, end, iso, func(r PartitionRecord) { out = append(out, r) })
	return out, err
}

func commitOrFail(t *testing.T, p *TxnProducer, lsn uint64) CommitResult {
	t.Helper()
	p.Commit(lsn, time.Now(), TxnMark{})
	select {
	case res := <-p.Commits():
		if res.LSN != lsn {
			t.Fatalf("commit result for %X, want %X", res.LSN, lsn)
		}
		return res
	case <-time.After(time.Minute):
		t.Fatal("no commit result within a minute")
	}
	return CommitResult{}
}

// fenceAfterAck sends one record with p (send), waits for its ack, and
// then starts another producer with p's transactional id, which fences p;
// the test closes it at its end.
func fenceAfterAck(t *testing.T, p *TxnProducer, send func(), cfg Config, id SlotIdentity, log *zap.Logger) *TxnProducer {
	t.Helper()
	send()
	if a := <-p.Acks(); a.Err != nil {
		t.Fatal(a.Err)
	}
	next, err := NewTransactional(context.Background(), cfg, id, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close(context.Background()) })
	return next
}

// TestTransactionalProducerCommitsStoresAndFences runs the transactional
// producer against the real Kafka: records and the offsets record become
// visible to read_committed together at the commit; a new producer with the
// same transactional id reads the stored position back, fences the old one
// (whose next commit fails as fenced) and aborts its open transaction.
func TestTransactionalProducerCommitsStoresAndFences(t *testing.T) {
	env := testenv.Require(t)
	topic := testenv.UniqueName(t, "eos")
	env.CreateTopic(t, topic, 1)
	cfg, id := txnConfig(t, env)
	ctx := context.Background()
	if err := EnsureOffsetsTopic(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := EnsureOffsetsTopic(ctx, cfg); err != nil {
		t.Fatalf("a second time: %v", err)
	}
	log := zaptest.NewLogger(t)
	p1, err := NewTransactional(ctx, cfg, id, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close(context.Background())
	if _, ok := p1.Stored(); ok {
		t.Fatal("a new slot has a stored position")
	}
	send := func(p *TxnProducer, v string) {
		p.Send(&router.Record{Topic: topic, Key: []byte("k"), Value: []byte(v), Partition: -1, Timestamp: time.Now()}, Meta{})
	}
	send(p1, "a")
	send(p1, "b")
	for range 2 {
		if a := <-p1.Acks(); a.Err != nil {
			t.Fatal(a.Err)
		}
	}
	// Before the commit, read_committed sees nothing, and reading to the
	// end waits for the transaction.
	if got, err := readFor(env, topic, 0, sarama.ReadCommitted, 2*time.Second); len(got) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read_committed sees %d records before the commit (%v)", len(got), err)
	}
	if res := commitOrFail(t, p1, 0x1000); res.Err != nil {
		t.Fatal(res.Err)
	}
	if got := readCommitted(t, env, topic, 0, sarama.ReadCommitted); len(got) != 2 {
		t.Fatalf("read_committed sees %d records after the commit, want 2", len(got))
	}
	// An open transaction of p1, then p2 starts: it reads 0x1000 and
	// fences p1, whose open transaction is aborted.
	p2 := fenceAfterAck(t, p1, func() { send(p1, "c") }, cfg, id, log)
	if lsn, ok := p2.Stored(); !ok || lsn != 0x1000 {
		t.Fatalf("stored %X %v, want 1000", lsn, ok)
	}
	res := commitOrFail(t, p1, 0x2000)
	if res.Err == nil || !IsFenced(res.Err) {
		t.Fatalf("the fenced producer's commit: %v, want fenced", res.Err)
	}
	send(p2, "d")
	if res := commitOrFail(t, p2, 0x3000); res.Err != nil {
		t.Fatal(res.Err)
	}
	var values []string
	for _, r := range readCommitted(t, env, topic, 0, sarama.ReadCommitted) {
		values = append(values, string(r.Value))
	}
	if len(values) != 3 || values[2] != "d" {
		t.Fatalf("read_committed: %q, want a b d", values)
	}
	if got := readCommitted(t, env, topic, 0, sarama.ReadUncommitted); len(got) != 4 {
		t.Fatalf("read_uncommitted: %d records, want 4 (c aborted but there)", len(got))
	}
	p3, err := NewTransactional(ctx, cfg, id, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p3.Close(context.Background())
	if lsn, _ := p3.Stored(); lsn != 0x3000 || p3.StoredTimeline() != id.Timeline {
		t.Fatalf("stored %X on timeline %d, want 3000 on %d", lsn, p3.StoredTimeline(), id.Timeline)
	}
}

// TestTransactionalProducerWithoutOffsetsTopicSaysSo checks the error of a
// missing offsets topic.
func TestTransactionalProducerWithoutOffsetsTopicSaysSo(t *testing.T) {
	env := testenv.Require(t)
	cfg, id := txnConfig(t, env)
	_, err := NewTransactional(context.Background(), cfg, id, zaptest.NewLogger(t))
	if !errors.Is(err, ErrOffsetsTopicMissing) {
		t.Fatalf("got %v, want ErrOffsetsTopicMissing", err)
	}
}

// TestTombstoneInOffsetsTopicForgetsThePosition: a tombstone for the slot's
// key (the documented way to start exactly-once afresh) reads as no
// position.
func TestTombstoneInOffsetsTopicForgetsThePosition(t *testing.T) {
	env := testenv.Require(t)
	cfg, id := txnConfig(t, env)
	ctx := context.Background()
	if err := EnsureOffsetsTopic(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	p, err := NewTransactional(ctx, cfg, id, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if res := commitOrFail(t, p, 0x5000); res.Err != nil {
		t.Fatal(res.Err)
	}
	_ = p.Close(ctx)
	env.Tombstone(t, cfg.OffsetsTopic, id.Key())
	p2, err := NewTransactional(ctx, cfg, id, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close(ctx)
	if lsn, ok := p2.Stored(); ok {
		t.Fatalf("stored %X after a tombstone, want none", lsn)
	}
}

// TestReadPartitionNamesAnOpenTransactionItWaitsFor: another producer's
// transaction left open in a partition (a relay killed while it committed,
// sharing the offsets topic) holds the last stable offset, and a
// read_committed read to the end waits for it. The start of every relay
// on that offsets topic ended with "context deadline exceeded" and no
// cause (found by the exactly-once review); the error now names the open
// transaction, what ends it, and the way not to wait for others.
func TestReadPartitionNamesAnOpenTransactionItWaitsFor(t *testing.T) {
	env := testenv.Require(t)
	topic := testenv.UniqueName(t, "lso")
	env.CreateTopic(t, topic, 1)
	sc := sarama.NewConfig()
	sc.Version = sarama.V4_0_0_0
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Return.Successes = true
	sc.Producer.Transaction.ID = topic
	sc.Producer.Transaction.Timeout = time.Minute
	sc.Net.MaxOpenRequests = 1
	p, err := sarama.NewSyncProducer(env.KafkaBrokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("open")}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.AbortTxn() }()
	_, err = readFor(env, topic, 0, sarama.ReadCommitted, 2*time.Second)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last stable offset stayed at") ||
		!strings.Contains(err.Error(), "transaction.timeout.ms") || !strings.Contains(err.Error(), "kafka.offsets.topic") {
		t.Fatalf("read to the end past an open transaction: %v; want an error naming the open transaction, what ends it and kafka.offsets.topic", err)
	}
}
