package main

import (
	"context"
	"fmt"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
)

// ScalingResult is the scaling table: catch-up throughput and memory of
// pgoutbox (and pg_recvlogical's rate on the same backlog, for the
// decoding limit) as one dimension changes and the others stay at their
// base values.
type ScalingResult struct {
	// The base point: payload padding, events per transaction, topics.
	// The topic dimension uses TopicsTxnSize events per transaction.
	BasePayloadBytes int `json:"base_payload_bytes"`
	BaseTxnSize      int `json:"base_txn_size"`
	TopicsTxnSize    int `json:"topics_txn_size"`
	// MaxPayloadBytes bounds a point's payload bytes (Options.ScaleBytes):
	// large payloads get fewer events.
	MaxPayloadBytes int64        `json:"max_payload_bytes"`
	Points          []ScalePoint `json:"points"`
}

// ScalePoint is one backlog of the scaling table, drained by
// pg_recvlogical and by pgoutbox from slots copied at one LSN.
type ScalePoint struct {
	Dimension    string `json:"dimension"` // payload, txn_size or topics
	PayloadBytes int    `json:"payload_bytes"`
	TxnSize      int    `json:"txn_size"`
	Topics       int    `json:"topics"`
	Events       int    `json:"events"`
	WALBytes     int64  `json:"wal_bytes"`

	PGRecvlogical ReaderResult `json:"pg_recvlogical"`
	Pgoutbox      ReaderResult `json:"pgoutbox"`
	// PayloadMBPerSec is pgoutbox's rate in payload padding bytes;
	// Ratio its events/s over pg_recvlogical's.
	PayloadMBPerSec float64 `json:"pgoutbox_payload_mb_per_s"`
	Ratio           float64 `json:"ratio_pgoutbox_to_pg_recvlogical"`

	Error string `json:"error,omitempty"`
}

// scaleTopicsTxnSize is the transaction size of the topic dimension: with
// one event per transaction decoding is the limit and hides the topics'
// cost.
const scaleTopicsTxnSize = 100

func (h *harness) scaling(ctx context.Context, res *Results) []error {
	o := h.o
	s := &ScalingResult{BasePayloadBytes: o.PayloadBytes, BaseTxnSize: 1, TopicsTxnSize: scaleTopicsTxnSize, MaxPayloadBytes: o.ScaleBytes}
	res.Scaling = s
	var points []ScalePoint
	for _, p := range o.ScalePayloads {
		points = append(points, ScalePoint{Dimension: "payload", PayloadBytes: p, TxnSize: s.BaseTxnSize, Topics: 1})
	}
	for _, t := range o.ScaleTxnSizes {
		points = append(points, ScalePoint{Dimension: "txn_size", PayloadBytes: o.PayloadBytes, TxnSize: t, Topics: 1})
	}
	for _, k := range o.ScaleTopics {
		points = append(points, ScalePoint{Dimension: "topics", PayloadBytes: o.PayloadBytes, TxnSize: scaleTopicsTxnSize, Topics: k})
	}
	var failed []error
	for i, p := range points {
		if ctx.Err() != nil {
			return append(failed, ctx.Err())
		}
		// Events: o.Events, fewer when the payload bytes would exceed
		// the budget, a whole number of transactions, at least one.
		n := min(int64(o.Events), max(o.ScaleBytes/int64(max(p.PayloadBytes, 1)), 1))
		n = max(n/int64(p.TxnSize), 1) * int64(p.TxnSize)
		p.Events = int(n)
		if err := h.scalePoint(ctx, i, &p); err != nil {
			p.Error = err.Error()
			h.logf("scaling %s: FAILED: %v", p.label(), err)
			failed = append(failed, fmt.Errorf("scaling %s: %w", p.label(), err))
		}
		s.Points = append(s.Points, p)
	}
	return failed
}

func (p ScalePoint) label() string {
	return fmt.Sprintf("%s (payload %d B, %d-event transactions, %d topics, %d events)", p.Dimension, p.PayloadBytes, p.TxnSize, p.Topics, p.Events)
}

func (h *harness) scalePoint(ctx context.Context, i int, p *ScalePoint) error {
	tag := fmt.Sprintf("sc%d", i)
	spec := backlogSpec{aggType: h.name(tag), size: p.TxnSize, events: p.Events, pad: randomPad(p.PayloadBytes), topics: p.Topics}
	h.logf("scaling %s", p.label())
	var topics []string
	for _, a := range spec.aggTypes() {
		topics = append(topics, "outbox.event."+a)
	}
	h.mu.Lock()
	h.topics = append(h.topics, topics...)
	h.mu.Unlock()
	if err := kafka.CreateTopicsWithConfig(h.kcfg, topics, int32(h.o.Partitions), 1, nil); err != nil {
		return err
	}
	slotRecv, slotRelay := h.name(tag, "recv"), h.name(tag, "relay")
	defer h.dropSlot(context.WithoutCancel(ctx), slotRecv)
	defer h.dropSlot(context.WithoutCancel(ctx), slotRelay)
	start, err := h.createSlots(ctx, slotRecv, slotRelay)
	if err != nil {
		return err
	}
	bl, err := h.writeBacklog(ctx, spec, start)
	if err != nil {
		return err
	}
	p.WALBytes = bl.WALBytes
	h.logf("  wrote %d events in %.1f s, %d MB of WAL", p.Events, bl.PrepSeconds, bl.WALBytes>>20)
	if p.PGRecvlogical, err = h.runRecvlogical(ctx, slotRecv, bl, p.Events); err != nil {
		return err
	}
	if p.Pgoutbox, err = h.runRelayCatchup(ctx, slotRelay, topics, bl, p.Events, tag, nil); err != nil {
		return err
	}
	p.Ratio = p.Pgoutbox.EventsPerSec / p.PGRecvlogical.EventsPerSec
	p.PayloadMBPerSec = p.Pgoutbox.EventsPerSec * float64(p.PayloadBytes) / (1 << 20)
	h.logf("  pg_recvlogical %.0f events/s; pgoutbox %.0f events/s (%.1f MB/s of payload, %.2fx), peak RSS %d MB, walsender %.0f%% busy",
		p.PGRecvlogical.EventsPerSec, p.Pgoutbox.EventsPerSec, p.PayloadMBPerSec, p.Ratio, p.Pgoutbox.PeakRSSBytes>>20, p.Pgoutbox.WalsenderBusy*100)
	if _, err := h.admin.Exec(ctx, "TRUNCATE "+outboxTable); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	// Topics of many points would pile up on the broker.
	if len(topics) > 1 {
		if err := deleteTopics(h, topics); err != nil {
			h.logf("  deleting topics: %v", err)
		}
	}
	return nil
}

// deleteTopics deletes topics now rather than at the teardown.
func deleteTopics(h *harness, topics []string) error {
	h.mu.Lock()
	keep := h.topics[:0]
	drop := map[string]bool{}
	for _, t := range topics {
		drop[t] = true
	}
	for _, t := range h.topics {
		if !drop[t] {
			keep = append(keep, t)
		}
	}
	h.topics = keep
	h.mu.Unlock()
	return kafkatest.DeleteTopics(h.kcfg, topics)
}
