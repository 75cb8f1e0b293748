package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

// The durability audit: settings under which an event pgoutbox confirmed
// to PostgreSQL (so that it is never sent again) can still be lost, or
// under which the relay cannot keep its promises. validate prints each
// finding with what can be lost and how to fix it; run logs the warnings
// as it starts, and for each topic when it first routes a record to it.
// None stops pgoutbox (validate --strict fails on any warning).

// pgDurability is what the audit reads from PostgreSQL.
type pgDurability struct {
	// maxSlotWALKeep is max_slot_wal_keep_size in bytes; -1 means no
	// limit.
	maxSlotWALKeep int64
	// walSenderTimeout is wal_sender_timeout as this connection's
	// settings give it (its DSN's options included); 0 is off.
	walSenderTimeout time.Duration
	// slotExists, retained and safe describe the slot: the WAL it holds
	// back (current position - restart_lsn) and safe_wal_size (nil when
	// unlimited or lost).
	slotExists bool
	retained   *int64
	safe       *int64
}

func readPGDurability(ctx context.Context, conn *pgx.Conn, slot string) (pgDurability, error) {
	var d pgDurability
	var keepMB, timeoutMS int64
	err := conn.QueryRow(ctx, `SELECT
		(SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
		(SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout')`).Scan(&keepMB, &timeoutMS)
	if err != nil {
		return d, fmt.Errorf("durability settings: %w", err)
	}
	// pg_settings gives them in their units: MB and ms.
	d.maxSlotWALKeep = keepMB
	if keepMB >= 0 {
		d.maxSlotWALKeep = keepMB << 20
	}
	d.walSenderTimeout = time.Duration(timeoutMS) * time.Millisecond
	err = conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END, restart_lsn)::bigint, safe_wal_size
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&d.retained, &d.safe)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return d, fmt.Errorf("slot %q: %w", slot, err)
	default:
		d.slotExists = true
	}
	return d, nil
}

// checkWALKeep judges max_slot_wal_keep_size: no limit lets the slot fill
// the disk; a limit bounds that, and past it the slot is lost.
func checkWALKeep(d pgDurability, slot string) checkResult {
	const name = "durability max_slot_wal_keep_size"
	if d.maxSlotWALKeep < 0 {
		return warn(name, fmt.Sprintf("-1 (no limit): while pgoutbox is stopped or cannot deliver (Kafka down), slot %q keeps every WAL segment written since its confirmed position, without bound; the disk can fill, and a full disk stops PostgreSQL for every application, not just the outbox", slot),
			"set a limit the disk can hold, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf(); — past it the slot is lost (wal_status lost), the events not yet relayed are gone with it and pgoutbox stops; watch retained_wal_bytes in pgoutbox status and the slot warnings in its log")
	}
	limit := d.maxSlotWALKeep
	detail := fmt.Sprintf("%s: slot %q may hold back up to that much WAL", byteCount(&limit), slot)
	switch {
	case !d.slotExists:
		detail += " once it exists"
	case d.safe != nil:
		detail += fmt.Sprintf("; it holds %s, %s to go (safe_wal_size)", byteCount(d.retained), byteCount(d.safe))
	case d.retained != nil:
		detail += fmt.Sprintf("; it holds %s", byteCount(d.retained))
	}
	detail += "; past the limit the slot is lost (wal_status lost): the events not yet relayed are gone with it and pgoutbox stops"
	if d.slotExists && d.retained != nil && limit > 0 && *d.retained*5 >= limit*4 {
		return warn(name, detail+fmt.Sprintf("; it already holds %d%% of the limit", *d.retained*100/limit),
			"let pgoutbox catch up (is it running, does Kafka accept its records?), or raise max_slot_wal_keep_size (ALTER SYSTEM SET max_slot_wal_keep_size = ...; SELECT pg_reload_conf();)")
	}
	return pass(name, detail)
}

// checkWALSenderTimeout judges wal_sender_timeout against the relay's status
// interval: the relay must report well within the timeout, or PostgreSQL
// ends its replication connection.
func checkWALSenderTimeout(timeout, interval time.Duration) checkResult {
	const name = "durability wal_sender_timeout"
	if timeout == 0 {
		return warn(name, "0 (off): PostgreSQL never ends the walsender of a pgoutbox that hangs or whose network path died, so the slot stays active and a standby instance cannot take it over until TCP gives up (which may take hours)",
			"set wal_sender_timeout (ALTER SYSTEM SET wal_sender_timeout = '60s'; SELECT pg_reload_conf();)")
	}
	if interval*2 > timeout {
		return warn(name, fmt.Sprintf("%s, and pgoutbox sends a status update only every %s (postgres.status.update.interval): PostgreSQL ends a replication connection that is silent for wal_sender_timeout (\"terminating walsender process due to replication timeout\"); nothing is lost, but each end restarts the session and sends the transactions not yet confirmed again (duplicates)", timeout, interval),
			fmt.Sprintf("set postgres.status.update.interval to at most %s (half of wal_sender_timeout), or raise wal_sender_timeout (ALTER ROLE ... SET wal_sender_timeout = '60s', or ALTER SYSTEM)", max(timeout/2, time.Millisecond)))
	}
	return pass(name, fmt.Sprintf("%s; pgoutbox sends a status update at least every %s (postgres.status.update.interval), well within it", timeout, interval))
}

// checkStateTable judges postgres.state.table for the WAL source: without
// it nothing records the slot's history, so a slot dropped or lost while
// pgoutbox is stopped is replaced silently, and the events it held are
// never relayed. ok is false when there is nothing to report (the table
// is on, or the poll source, which has no slot, is chosen).
func checkStateTable(cfg relay.Config) (r checkResult, ok bool) {
	if cfg.Relay.Source == relay.SourcePoll || cfg.Postgres.StateTable != "" {
		return r, false
	}
	return warn("durability postgres.state.table", fmt.Sprintf(`"" (off): nothing records slot %q's history, so a slot dropped or lost while pgoutbox is stopped is created again without a word, and the events it still held are never relayed; a publication or outbox table dropped and made again, a slot moved on by something else and a failover to a server behind are not noticed either, and cleanup cannot be held after them`, cfg.Postgres.Slot),
		"set postgres.state.table (the default is public.pgoutbox_state) and run pgoutbox migrate, or give the role CREATE on the schema so that pgoutbox run creates it"), true
}

// checkTopicDurability judges a topic's replication for records
// acknowledged with acks=all: the replication factor, min.insync.replicas
// and unclean leader election. label is "topic" or "dead-letter topic".
func checkTopicDurability(s kafka.TopicState, label string, brokers []string) []checkResult {
	if s.Err != nil {
		return nil // the topic check says what is wrong with it
	}
	name := label + " " + s.Topic + " durability"
	alter := fmt.Sprintf("kafka-configs.sh --bootstrap-server %s --alter --entity-type topics --entity-name %s --add-config ", strings.Join(brokers, ","), s.Topic)
	rf := s.ReplicationFactor
	var out []checkResult
	minISRText, known := s.Configs["min.insync.replicas"]
	minISR, err := strconv.Atoi(minISRText)
	if !known || err != nil {
		out = append(out, warn(name, fmt.Sprintf("replication factor %d; min.insync.replicas and unclean.leader.election.enable unknown: the broker did not describe the topic's configuration to this client", rf),
			fmt.Sprintf("grant this client DescribeConfigs on topic %s, or check by hand: kafka-configs.sh --bootstrap-server %s --describe --entity-type topics --entity-name %s", s.Topic, strings.Join(brokers, ","), s.Topic)))
		minISR = -1
	}
	switch {
	case minISR > rf:
		out = append(out, fail(name, fmt.Sprintf("min.insync.replicas %d exceeds the replication factor %d: the brokers refuse every record (NOT_ENOUGH_REPLICAS); pgoutbox retries for as long as kafka.retry.max allows, restarts, and delivers nothing", minISR, rf),
			fmt.Sprintf("%smin.insync.replicas=%d", alter, max(rf-1, 1))))
	case rf <= 1:
		out = append(out, warn(name, fmt.Sprintf("replication factor %d: each record Kafka acknowledges is on one broker only; if that broker's disk is lost, so are the events, which pgoutbox has confirmed to PostgreSQL and will never send again", rf),
			fmt.Sprintf("give %s three replicas (kafka-reassign-partitions.sh with three brokers per partition), then set min.insync.replicas=2: %smin.insync.replicas=2", s.Topic, alter)))
	case minISR < 0:
	case minISR <= 1:
		out = append(out, warn(name, fmt.Sprintf("replication factor %d but min.insync.replicas %d (Kafka's default): with acks=all a record is acknowledged once the in-sync replicas have it, and they may have shrunk to the leader alone; a leader lost before a follower copied the record loses it, though pgoutbox confirmed it to PostgreSQL", rf, minISR),
			alter+"min.insync.replicas=2"))
	case minISR == rf:
		out = append(out, warn(name, fmt.Sprintf("min.insync.replicas %d equals the replication factor: one broker down stops every write to the topic (NOT_ENOUGH_REPLICAS); nothing is lost, but nothing is delivered until it is back", minISR),
			fmt.Sprintf("%smin.insync.replicas=%d", alter, rf-1)))
	}
	if s.Configs["unclean.leader.election.enable"] == "true" {
		out = append(out, warn(name, "unclean.leader.election.enable is true: when no in-sync replica is left, a replica that is behind may become the leader and the records only the others held are dropped, events pgoutbox confirmed among them",
			alter+"unclean.leader.election.enable=false"))
	}
	if len(out) == 0 {
		out = append(out, pass(name, fmt.Sprintf("replication factor %d, min.insync.replicas %d, unclean leader election off: each acknowledged record is on %d brokers at least", rf, minISR, minISR)))
	}
	return out
}

// checkSharedPrefix warns when another pgoutbox relay of the database
// (another slot in the state table, through another publication) relays
// table-less messages with this relay's messages.prefix: each message goes
// to both relays' topics (replication.PrefixSharers).
func checkSharedPrefix(ctx context.Context, conn *pgx.Conn, cfg relay.Config) (checkResult, bool) {
	rc, prefix := cfg.Postgres, cfg.Messages.Prefix
	if prefix == "" || rc.StateTable == "" || cfg.Relay.Source == relay.SourcePoll {
		return checkResult{}, false
	}
	others, err := replication.PrefixSharers(ctx, conn, rc.StateTable, rc.Slot, prefix, rc.Publication)
	if err != nil || len(others) == 0 {
		return checkResult{}, false
	}
	names := make([]string, len(others))
	for i, o := range others {
		names[i] = fmt.Sprintf("%q (publication %q)", o.Slot, o.Publication)
	}
	return warn("messages.prefix", fmt.Sprintf("another pgoutbox relay of this database also relays table-less messages with prefix %q: slot %s. A message belongs to no table and every slot decodes it, so each one written with this prefix goes to both relays' topics (and stops a relay whose router expects other fields)",
		prefix, strings.Join(names, ", ")), "give each relay a messages.prefix of its own and have its writers use it (pkg/outbox Config.MessagePrefix), or messages.prefix: \"\" for a relay that reads no messages"), true
}

// validatePGDurability reports the PostgreSQL side of the audit.
func validatePGDurability(v *validation, ctx context.Context, conn *pgx.Conn, rc replication.Config) {
	ctx, cancel := context.WithTimeout(ctx, statusQueryTimeout)
	defer cancel()
	d, err := readPGDurability(ctx, conn, rc.Slot)
	if err != nil {
		v.report(fail("durability", "reading the settings failed: "+oneLine(err), "run pgoutbox validate again; if it persists, check the server's log"))
		return
	}
	v.report(checkWALKeep(d, rc.Slot), checkWALSenderTimeout(d.walSenderTimeout, rc.StatusInterval))
}

// startTopics are the topics known before any row is routed: each fixed
// topic of the router and the routes, and the dead-letter topic, labelled.
func startTopics(cfg relay.Config) map[string]string {
	out := map[string]string{}
	if t, ok := fixedTopic(cfg.Router.RouteTopicReplacement); ok {
		out[t] = "topic"
	}
	if cfg.Router.RouteTopic != "" {
		out[cfg.Router.RouteTopic] = "topic"
	}
	for _, opts := range cfg.Routes {
		if t := opts["route.topic"]; t != "" {
			out[t] = "topic"
		}
		if t, ok := fixedTopic(opts["route.topic.replacement"]); ok {
			out[t] = "topic"
		}
	}
	if cfg.Relay.PoisonPolicy == "dead-letter" {
		out[cfg.Relay.DeadLetterTopic] = "dead-letter topic"
	}
	return out
}

// auditTimeout bounds each part of the audit run does.
const auditTimeout = time.Minute

// maxAudited bounds the topics run audits as they are first routed to.
const maxAudited = 1000

// durabilityAudit is run's audit: it logs a warning per finding, off the
// relay's goroutine. Run audits PostgreSQL and the topics known at start;
// the observer it wraps hands it each other topic the relay routes to,
// once.
//
// Concurrency: Routed runs on the relay's goroutine and only hands the
// topic over (dropped if the queue is full); Run, on a goroutine of its
// own, asks the servers.
type durabilityAudit struct {
	cfg   relay.Config
	log   *zap.Logger
	start map[string]string // topic → label
	queue chan string
	// seen is the relay goroutine's own.
	seen map[string]bool
}

func newDurabilityAudit(cfg relay.Config, log *zap.Logger) *durabilityAudit {
	a := &durabilityAudit{cfg: cfg, log: log, start: startTopics(cfg), queue: make(chan string, 64), seen: map[string]bool{}}
	for t := range a.start {
		a.seen[t] = true
	}
	return a
}

// Start logs the findings of the configuration alone, at once, on the
// caller's goroutine: run calls it before it starts the relay.
func (a *durabilityAudit) Start() {
	if r, ok := checkStateTable(a.cfg); ok {
		a.report([]checkResult{r})
	}
}

// Run audits until ctx ends.
func (a *durabilityAudit) Run(ctx context.Context) {
	a.postgres(ctx)
	a.topics(ctx, a.start)
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-a.queue:
			a.topics(ctx, map[string]string{t: "topic"})
		}
	}
}

// Observe returns o, with Routed also handing each new topic to the audit.
// It keeps o's optional interfaces, which the relay finds by type
// assertion (relay.PollObserver, relay.CatalogObserver): the poll source's
// progress reached the metrics, and so /readyz, only through them (without
// it, every poll relay run by pgoutbox run was reported stalled, and its
// claims, buckets and instances stayed 0).
func (a *durabilityAudit) Observe(o relay.Observer) relay.Observer {
	return auditObserver{Observer: o, a: a}
}

type auditObserver struct {
	relay.Observer
	a *durabilityAudit
}

var (
	_ relay.PollObserver    = auditObserver{}
	_ relay.CatalogObserver = auditObserver{}
)

// PublicationAltered implements relay.CatalogObserver for o's observer.
func (o auditObserver) PublicationAltered(publication string) {
	if co, ok := o.Observer.(relay.CatalogObserver); ok {
		co.PublicationAltered(publication)
	}
}

// PollProgress implements relay.PollObserver for o's observer.
func (o auditObserver) PollProgress(p relay.PollProgress) {
	if po, ok := o.Observer.(relay.PollObserver); ok {
		po.PollProgress(p)
	}
}

// CleanedUp implements relay.PollObserver for o's observer.
func (o auditObserver) CleanedUp(rows int64) {
	if po, ok := o.Observer.(relay.PollObserver); ok {
		po.CleanedUp(rows)
	}
}

func (o auditObserver) Routed(table, topic string) {
	o.Observer.Routed(table, topic)
	if a := o.a; !a.seen[topic] && len(a.seen) < maxAudited {
		a.seen[topic] = true
		select {
		case a.queue <- topic:
		default:
		}
	}
}

func (a *durabilityAudit) report(rs []checkResult) {
	for _, r := range rs {
		if r.Status == checkPass {
			continue
		}
		a.log.Warn("durability: "+r.Detail, zap.String("check", r.Name), zap.String("fix", r.Fix))
	}
}

func (a *durabilityAudit) postgres(ctx context.Context) {
	if a.cfg.Relay.Source == relay.SourcePoll {
		return // no slot and no walsender: nothing of replication to audit
	}
	rc := a.cfg.Postgres
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	conn, err := replication.ConnectSQL(ctx, rc, "pgoutbox-audit", rc.ConnectTimeout)
	if err != nil {
		a.log.Debug("durability audit: connect to PostgreSQL", zap.Error(err))
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	d, err := readPGDurability(ctx, conn, rc.Slot)
	if err != nil {
		a.log.Debug("durability audit: read PostgreSQL's settings", zap.Error(err))
		return
	}
	a.report([]checkResult{checkWALKeep(d, rc.Slot), checkWALSenderTimeout(d.walSenderTimeout, rc.StatusInterval)})
	if r, ok := checkSharedPrefix(ctx, conn, a.cfg); ok {
		a.report([]checkResult{r})
	}
}

func (a *durabilityAudit) topics(ctx context.Context, labels map[string]string) {
	if len(labels) == 0 {
		return
	}
	names := make([]string, 0, len(labels))
	for t := range labels {
		names = append(names, t)
	}
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	states, err := kafka.CheckTopics(ctx, a.cfg.Kafka, names)
	if err != nil {
		a.log.Debug("durability audit: ask Kafka about topics", zap.Strings("topics", names), zap.Error(err))
		return
	}
	for _, s := range states {
		a.report(checkTopicDurability(s, labels[s.Topic], a.cfg.Kafka.Brokers))
	}
}
