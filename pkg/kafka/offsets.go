package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// SlotIdentity names the replication slot whose position the offsets topic
// keeps: the server's system identifier (shared by a primary and its
// physical standbys), the database and the slot.
type SlotIdentity struct {
	SystemIdentifier string
	Database         string
	Slot             string
	// Timeline is the server's timeline, written with each position (not
	// part of the key): a position from another timeline may lie past
	// where that timeline forked from this one.
	Timeline int32
}

// Key is the key of the slot's record in the offsets topic.
func (id SlotIdentity) Key() []byte {
	return []byte("pgoutbox/" + id.SystemIdentifier + "/" + id.Database + "/" + id.Slot)
}

// TransactionalID is the transactional.id every instance relaying this slot
// uses when kafka.transactional.id is not set.
func (id SlotIdentity) TransactionalID() string {
	return "pgoutbox-" + id.SystemIdentifier + "-" + id.Database + "-" + id.Slot
}

// offsetValue is the JSON value of an offsets record.
type offsetValue struct {
	LSN              string `json:"lsn"`
	SystemIdentifier string `json:"system_identifier"`
	Database         string `json:"database"`
	Slot             string `json:"slot"`
	TransactionalID  string `json:"transactional_id"`
	// Timeline: the server's timeline when the position was written (0
	// in records of versions before it was written).
	Timeline int32 `json:"timeline,omitempty"`
	// At: a time of the server's clock (RFC 3339) by which every
	// transaction committing before the position had committed: the
	// latest commit time the relay had read, or a keepalive's. Empty in
	// records of versions before it was written, or when not known.
	At string `json:"at,omitempty"`
	// Last: the last transaction (or non-transactional message) the relay
	// read at or below the position. Absent in records of versions before
	// it was written, and before the slot's first transaction.
	Last *offsetMark `json:"last,omitempty"`
}

// offsetMark is a TxnMark in an offsets record.
type offsetMark struct {
	LSN        string `json:"lsn"`
	XID        uint32 `json:"xid,omitempty"`
	CommitTime string `json:"commit_time,omitempty"`
	// ContentHash: a message's (TxnMark.Hash), in hex.
	ContentHash string `json:"content_hash,omitempty"`
}

// TxnMark names one transaction the relay read from the slot: where its
// commit record begins (a Begin's FinalLSN), its xid and its commit time;
// or, with XID 0, a non-transactional message, by its LSN and a hash of
// its prefix and content. A database put back to an earlier point and
// written again past it would need to commit a transaction at that very
// position, with that xid, at that microsecond (or write a message with
// those bytes ending there) to be taken for the one Kafka got.
type TxnMark struct {
	LSN  uint64
	XID  uint32
	Time time.Time
	Hash uint64
}

// MessageMark names a non-transactional message ending at lsn.
func MessageMark(lsn uint64, prefix string, content []byte) TxnMark {
	h := fnv.New64a()
	h.Write([]byte(prefix))
	h.Write([]byte{0})
	h.Write(content)
	return TxnMark{LSN: lsn, Hash: h.Sum64()}
}

// IsZero says no transaction is named.
func (m TxnMark) IsZero() bool { return m.LSN == 0 }

// Message says the mark names a non-transactional message (xid 0: no
// transaction has it).
func (m TxnMark) Message() bool { return m.XID == 0 }

// Is says whether o is the transaction (or message) m names.
func (m TxnMark) Is(o TxnMark) bool {
	return m.LSN == o.LSN && m.XID == o.XID && m.Time.Equal(o.Time) && m.Hash == o.Hash
}

func (m TxnMark) String() string {
	if m.Message() {
		return fmt.Sprintf("the non-transactional message at %s", formatLSN(m.LSN))
	}
	return fmt.Sprintf("transaction %d committing at %s at %s", m.XID, formatLSN(m.LSN), m.Time.UTC().Format(time.RFC3339Nano))
}

func encodeOffset(id SlotIdentity, txnID string, lsn uint64, at time.Time, last TxnMark) []byte {
	v := offsetValue{LSN: formatLSN(lsn), SystemIdentifier: id.SystemIdentifier,
		Database: id.Database, Slot: id.Slot, TransactionalID: txnID, Timeline: id.Timeline}
	if !at.IsZero() {
		v.At = at.UTC().Format(time.RFC3339Nano)
	}
	if !last.IsZero() {
		v.Last = &offsetMark{LSN: formatLSN(last.LSN), XID: last.XID}
		if !last.Time.IsZero() {
			v.Last.CommitTime = last.Time.UTC().Format(time.RFC3339Nano)
		}
		if last.Hash != 0 {
			v.Last.ContentHash = strconv.FormatUint(last.Hash, 16)
		}
	}
	b, _ := json.Marshal(v)
	return b
}

// storedOffset is what an offsets record says.
type storedOffset struct {
	lsn      uint64
	timeline int32
	at       time.Time
	last     TxnMark
}

func decodeOffset(b []byte) (storedOffset, error) {
	var v offsetValue
	if err := json.Unmarshal(b, &v); err != nil {
		return storedOffset{}, fmt.Errorf("not a pgoutbox offsets record: %w", err)
	}
	lsn, err := parseLSN(v.LSN)
	if err != nil {
		return storedOffset{}, err
	}
	o := storedOffset{lsn: lsn, timeline: v.Timeline}
	if v.At != "" {
		if o.at, err = time.Parse(time.RFC3339Nano, v.At); err != nil {
			return storedOffset{}, fmt.Errorf("at %q: %w", v.At, err)
		}
	}
	if v.Last != nil {
		if o.last.LSN, err = parseLSN(v.Last.LSN); err != nil {
			return storedOffset{}, fmt.Errorf("last: %w", err)
		}
		o.last.XID = v.Last.XID
		if v.Last.ContentHash != "" {
			if o.last.Hash, err = strconv.ParseUint(v.Last.ContentHash, 16, 64); err != nil {
				return storedOffset{}, fmt.Errorf("last content_hash %q: %w", v.Last.ContentHash, err)
			}
		}
		if v.Last.CommitTime != "" {
			if o.last.Time, err = time.Parse(time.RFC3339Nano, v.Last.CommitTime); err != nil {
				return storedOffset{}, fmt.Errorf("last commit_time %q: %w", v.Last.CommitTime, err)
			}
		}
	}
	return o, nil
}

func formatLSN(l uint64) string { return fmt.Sprintf("%X/%X", l>>32, uint32(l)) }

func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%q is not an LSN", s)
	}
	return h<<32 | l, nil
}

// ErrOffsetsTopicMissing is the error of a stored-position read or a
// transactional producer whose offsets topic does not exist.
var ErrOffsetsTopicMissing = errors.New("kafka: the offsets topic does not exist")

// EnsureOffsetsTopic creates cfg.OffsetsTopic if it does not exist: one
// partition, compacted, the brokers' default replication factor and
// min.insync.replicas. It fails, saying what to do, when the topic cannot
// be created or exists without cleanup.policy=compact.
func EnsureOffsetsTopic(ctx context.Context, cfg Config) error {
	cfg.Defaults()
	topic := cfg.OffsetsTopic
	states, err := CheckTopics(ctx, cfg, []string{topic})
	if err != nil {
		return err
	}
	if st := states[0]; st.Err == nil {
		return checkCompacted(ctx, cfg, topic)
	} else if !errors.Is(st.Err, ErrTopicMissing) {
		return fmt.Errorf("kafka: offsets topic %q: %w", topic, st.Err)
	}
	_, admin, err := newAdmin(cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	compact := "compact"
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: -1,
		ConfigEntries: map[string]*string{"cleanup.policy": &compact}}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("kafka: create the offsets topic %q (kafka.offsets.topic; exactly-once mode keeps the slot's position there): %w; create it yourself (one partition, cleanup.policy=compact) or grant CREATE on it", topic, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		states, err := CheckTopics(ctx, cfg, []string{topic})
		if err == nil && states[0].Err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kafka: the offsets topic %q was created but is not in the metadata: %v", topic, errors.Join(err, ctx.Err()))
		}
		time.Sleep(100 * time.Millisecond) // metadata propagation; bounded by deadline
	}
}

func checkCompacted(ctx context.Context, cfg Config, topic string) error {
	_, admin, err := newAdmin(cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"cleanup.policy"}})
	if err != nil {
		// Not every user may describe configs; the topic exists.
		return nil
	}
	for _, e := range entries {
		if e.Name == "cleanup.policy" && !strings.Contains(e.Value, "compact") {
			return fmt.Errorf("kafka: offsets topic %q has cleanup.policy=%s: exactly-once mode keeps one record per slot there and needs it compacted, or retention would delete the slot's position (kafka-configs --alter --add-config cleanup.policy=compact)", topic, e.Value)
		}
	}
	return nil
}

// offsetsPartition is the partition of the offsets topic that holds key:
// the one the producer's partitioner sends it to.
func offsetsPartition(client sarama.Client, topic string, key []byte) (int32, error) {
	parts, err := client.Partitions(topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) || (err == nil && len(parts) == 0) {
		return 0, fmt.Errorf("%w: %q (kafka.offsets.topic): run pgoutbox migrate, or create it (one partition, cleanup.policy=compact)", ErrOffsetsTopicMissing, topic)
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: partitions of the offsets topic %q: %w", topic, err)
	}
	return newPartitioner(topic).Partition(&sarama.ProducerMessage{Topic: topic, Key: sarama.ByteEncoder(key), Partition: -1}, int32(len(parts)))
}

// readStored reads the last committed record with key from the offsets
// topic, with read_committed isolation, up to the partition's end as it is
// now (the high-water mark): called after InitProducerId fenced earlier
// producers of the transactional id, so that every transaction of theirs
// is decided and nothing can be committed for key meanwhile. The end is
// read backwards in growing windows, as the record sought is usually near
// it. It waits (within ctx) while open transactions of other producers
// hold the last stable offset below that end.
func readStored(ctx context.Context, client sarama.Client, topic string, key []byte) (o storedOffset, found bool, err error) {
	p, err := offsetsPartition(client, topic, key)
	if err != nil {
		return storedOffset{}, false, err
	}
	end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		return storedOffset{}, false, fmt.Errorf("kafka: end offset of %s/%d: %w", topic, p, err)
	}
	start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
	if err != nil {
		return storedOffset{}, false, fmt.Errorf("kafka: start offset of %s/%d: %w", topic, p, err)
	}
	window := int64(256)
	for hi := end; hi > start; window *= 4 {
		from := max(start, hi-window)
		v, ok, err := scanCommitted(ctx, client, topic, p, key, from, hi)
		if err != nil {
			return storedOffset{}, false, err
		}
		if ok && v == nil {
			// A tombstone: the slot's position was deleted on purpose, to
			// start exactly-once afresh from the slot's own.
			return storedOffset{}, false, nil
		}
		if ok {
			o, err := decodeOffset(v)
			if err != nil {
				return storedOffset{}, false, fmt.Errorf("kafka: offsets topic %q, key %q: %w", topic, key, err)
			}
			return o, true, nil
		}
		hi = from
	}
	return storedOffset{}, false, nil
}

// scanCommitted returns the value of the last committed record with key in
// [from, to) of a partition (nil for a tombstone).
func scanCommitted(ctx context.Context, client sarama.Client, topic string, p int32, key []byte, from, to int64) (value []byte, found bool, err error) {
	err = ReadPartition(ctx, client, topic, p, from, to, sarama.ReadCommitted, func(r PartitionRecord) {
		if string(r.Key) == string(key) {
			value, found = r.Value, true
		}
	})
	return value, found, err
}

// PartitionRecord is a record ReadPartition read.
type PartitionRecord struct {
	Offset     int64
	Key, Value []byte
	Headers    []*sarama.RecordHeader
	Timestamp  time.Time
}

// ReadPartition calls fn for every record in [from, to) of a partition, in
// offset order, as a consumer with isolation iso sees them: with
// ReadCommitted, the records of committed transactions and those written
// outside transactions, and none of aborted ones. It returns once it has
// read past to-1 (control records included), waiting, within ctx, while the
// last stable offset is below to (a transaction still open). Tools and
// tests use it to read a partition to a known end, which a consumer of
// transactional records cannot count its way to (markers take offsets).
func ReadPartition(ctx context.Context, client sarama.Client, topic string, p int32, from, to int64, iso sarama.IsolationLevel, fn func(PartitionRecord)) error {
	next := from
	var stuckAt, stable int64 = -1, -1 // waiting for the last stable offset: where
	for next < to {
		if err := ctx.Err(); err != nil {
			if stuckAt >= 0 {
				return fmt.Errorf("kafka: read %s/%d: the partition's last stable offset stayed at %d, below its records up to %d: a transaction another producer opened there is still open (a relay or a tool stopped while it committed, writing to this topic too); the transaction coordinator aborts it after that producer's transaction.timeout.ms, and the read goes on then (give each slot an offsets topic of its own, kafka.offsets.topic, not to wait for others): %w",
					topic, p, stable, to, context.Cause(ctx))
			}
			return fmt.Errorf("kafka: read %s/%d: %w", topic, p, context.Cause(ctx))
		}
		broker, err := client.Leader(topic, p)
		if err != nil {
			return fmt.Errorf("kafka: leader of %s/%d: %w", topic, p, err)
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 50, MinBytes: 1, MaxBytes: 4 << 20, Isolation: iso}
		req.AddBlock(topic, p, next, 1<<20, -1)
		res, err := broker.Fetch(req)
		if err != nil {
			_ = client.RefreshMetadata(topic)
			return fmt.Errorf("kafka: fetch %s/%d at %d: %w", topic, p, next, err)
		}
		block := res.GetBlock(topic, p)
		if block == nil {
			return fmt.Errorf("kafka: fetch %s/%d at %d: %w", topic, p, next, sarama.ErrIncompleteResponse)
		}
		if block.Err == sarama.ErrOffsetOutOfRange && next < block.LogStartOffset {
			next = block.LogStartOffset // compacted or deleted meanwhile
			continue
		}
		if block.Err != sarama.ErrNoError {
			return fmt.Errorf("kafka: fetch %s/%d at %d: %w", topic, p, next, block.Err)
		}
		before := next
		aborted := slices.Clone(block.AbortedTransactions)
		slices.SortFunc(aborted, func(a, b *sarama.AbortedTransaction) int { return int(a.FirstOffset - b.FirstOffset) })
		abortedPIDs := map[int64]bool{}
		for _, recs := range block.RecordsSet {
			b := recs.RecordBatch
			if b == nil || b.PartialTrailingRecord {
				break
			}
			last := b.FirstOffset + int64(b.LastOffsetDelta)
			for len(aborted) > 0 && aborted[0].FirstOffset <= last {
				abortedPIDs[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			if b.Control {
				// An abort marker ends the producer's aborted transaction.
				if len(b.Records) > 0 && len(b.Records[0].Key) >= 4 && b.Records[0].Key[2] == 0 && b.Records[0].Key[3] == 0 {
					delete(abortedPIDs, b.ProducerID)
				}
			} else if !(b.IsTransactional && abortedPIDs[b.ProducerID]) {
				for _, r := range b.Records {
					if off := b.FirstOffset + r.OffsetDelta; off >= next && off < to {
						ts := b.FirstTimestamp.Add(r.TimestampDelta)
						if b.LogAppendTime {
							ts = b.MaxTimestamp
						}
						fn(PartitionRecord{Offset: off, Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: ts})
					}
				}
			}
			next = max(next, last+1)
		}
		if next != before {
			stuckAt = -1
		}
		if next == before {
			// Nothing past next is decided yet (the last stable offset is
			// held by an open transaction), or nothing is left.
			if block.HighWaterMarkOffset <= next {
				break
			}
			stuckAt, stable = next, block.LastStableOffset
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond): // waiting for the LSO; bounded by ctx
			}
		}
	}
	return nil
}
