package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// The WAL source's instances on one slot stand by for each other: when the
// one streaming ends, any of them may take over. Two deployments on one
// slot name with another kafka.brokers or other topic-deciding router
// settings (two Helm releases, a copy in another region, a blue/green
// pair) split the slot's events between their destinations that way,
// without a word (a Kubernetes review). So, as the poll source does
// (poll.Destination):
//
//   - each instance shows, for as long as it runs, that it is on the slot
//     and where it publishes: a shared advisory lock (the slot's key, the
//     destination's fingerprint) on a connection of its own
//     (replication.JoinSlot);
//   - the session that streams records its destination in the state row;
//   - an instance about to take the slot over whose destination is not
//     the recorded one does not while an instance with the recorded one
//     runs (it stands by, and says so at Error); when none does (a
//     rolling update that changed the destination has ended, or the
//     configuration changed while stopped) it takes over and records its
//     own.

// errOtherDestination ends a session that did not take the slot over
// because the state row records another destination and an instance with
// it runs. It wraps replication.ErrSlotInUse too: Run waits and tries
// again as a standby does, and it is no start-up error.
var errOtherDestination = errors.New("relay: another deployment with another destination runs on the slot")

// otherDestinationLogEvery bounds how often the wait is logged: at Warn
// for its first otherDestinationErrorAfter, at Error after.
const (
	otherDestinationLogEvery   = time.Minute
	otherDestinationErrorAfter = 5 * time.Minute
)

// walDestFormat names the format of a recorded destination: change it
// when what is hashed, or how, changes.
const walDestFormat = "wal-v1"

// walDestination is where the WAL source publishes: the fingerprint of
// its Kafka cluster and of the settings that decide topics (as the poll
// source's poll.Destination), and a description for messages.
type walDestination struct {
	// Key is the objid of the member lock: a hash of Kafka and Router.
	Key           int32
	Kafka, Router int32
	Desc          string
}

// walDestination is the WAL source's destination: the brokers, and the
// topic-deciding settings of the router section and of each outbox
// table whose routes entry changes them.
func (c *Config) walDestination() walDestination {
	section := c.routeText("")
	parts := []string{section}
	for _, t := range slices.Sorted(slices.Values(c.Postgres.QualifiedTables())) {
		if rt := c.routeText(t); rt != section {
			parts = append(parts, t+": "+rt)
		}
	}
	route := strings.Join(parts, "; ")
	d := walDestination{Kafka: poll.Fingerprint("kafka", c.brokersText()), Router: poll.Fingerprint("router", route)}
	d.Key = poll.Fingerprint("wal", fmt.Sprintf("%d/%d", d.Kafka, d.Router))
	d.Desc = "kafka.brokers=" + c.brokersText() + "; " + route
	if len(d.Desc) > 1000 {
		d.Desc = d.Desc[:1000] + "..."
	}
	return d
}

// record is the destination as the state row's destination column holds
// it.
func (d walDestination) record() string {
	return fmt.Sprintf("%s key=%d kafka=%d router=%d; %s", walDestFormat, d.Key, d.Kafka, d.Router, d.Desc)
}

// parseDestination reads a recorded destination; ok is false for one in
// another format (another version's).
func parseDestination(s string) (d walDestination, ok bool) {
	head, desc, _ := strings.Cut(s, "; ")
	var format string
	if n, err := fmt.Sscanf(head, "%s key=%d kafka=%d router=%d", &format, &d.Key, &d.Kafka, &d.Router); err != nil || n != 4 || format != walDestFormat || d.Key == 0 {
		return walDestination{}, false
	}
	d.Desc = desc
	return d, true
}

// differs says what differs between two destinations.
func (d walDestination) differs(o walDestination) string {
	var parts []string
	if d.Kafka != o.Kafka {
		parts = append(parts, "the Kafka cluster (kafka.brokers)")
	}
	if d.Router != o.Router {
		parts = append(parts, "the topics (the router settings that decide them: route.by.field, route.topic.regex, route.topic.replacement, route.topic, routes entries, relay.dead.letter.topic)")
	}
	return strings.Join(parts, " and ")
}

// takeover is what a session about to take the slot over does.
type takeover int

const (
	// takeOver: nothing recorded (a first start, an earlier version's
	// row, a format this version cannot read), or this destination.
	takeOver takeover = iota
	// takeOverChanged: another destination recorded, and no instance with
	// it runs: take over and record this one.
	takeOverChanged
	// waitForRecorded: another destination recorded, and instances with it
	// run (holders): stand by.
	waitForRecorded
)

// decideTakeover decides, from the state row's recorded destination, this
// instance's (own) and the members on the slot, whether a session takes
// the slot over; it returns the recorded destination, and the members
// that publish to it.
func decideTakeover(recorded string, own walDestination, members []replication.SlotMember) (takeover, walDestination, []replication.SlotMember) {
	rec, ok := parseDestination(recorded)
	if !ok || rec.Key == own.Key {
		return takeOver, rec, nil
	}
	var holders []replication.SlotMember
	for _, m := range members {
		if m.Destination == rec.Key {
			holders = append(holders, m)
		}
	}
	if len(holders) == 0 {
		return takeOverChanged, rec, nil
	}
	return waitForRecorded, rec, holders
}

// slotMembers is Run's membership of the slot's instances.
type slotMembers struct {
	dest     walDestination
	member   slotMember // nil: not shown (not yet, or it failed)
	warnedAt time.Time  // the last warning that it failed
	// waitLoggedAt is when the wait for the recorded destination was last
	// logged (at Warn, then Error: otherDestinationErrorAfter).
	waitLoggedAt time.Time
	// waitingSince is when the current wait began (zero: not waiting).
	waitingSince time.Time
}

// joinSlot shows this instance on the slot, unless its member connection
// still answers. It is a guard, not a requirement: a failure is warned
// of (at most once a minute) and tried again at the next session's start.
func (r *Relay) joinSlot(ctx context.Context) {
	m := &r.members
	if m.dest.Key == 0 {
		m.dest = r.cfg.walDestination()
	}
	if m.member != nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		alive := m.member.Alive(pctx)
		cancel()
		if alive || ctx.Err() != nil {
			return
		}
		m.member.Close()
		m.member = nil
	}
	be, ok := r.be.(slotMembership)
	if !ok {
		return
	}
	mem, err := be.JoinSlot(ctx, r.cfg.Postgres, m.dest.Key)
	if ctx.Err() != nil {
		if mem != nil {
			mem.Close()
		}
		return
	}
	now := r.clock.Now()
	if err != nil {
		if m.warnedAt.IsZero() || now.Sub(m.warnedAt) >= time.Minute {
			r.log.Warn("could not show this instance on the slot (an advisory lock on a connection of its own); instances with another destination on this slot cannot see it, and one could take the slot over from this deployment; trying again at the next session's start",
				zap.String("slot", r.cfg.Postgres.Slot), zap.Error(err))
			m.warnedAt = now
		}
		return
	}
	if !m.warnedAt.IsZero() {
		r.log.Info("this instance shows on the slot again", zap.String("slot", r.cfg.Postgres.Slot))
		m.warnedAt = time.Time{}
	}
	m.member = mem
}

// leaveSlot closes the member connection (Run, as it returns).
func (r *Relay) leaveSlot() {
	if r.members.member != nil {
		r.members.member.Close()
		r.members.member = nil
	}
}

// checkDestination is called once Prepare found the slot free, before the
// session takes it over: it returns an error wrapping errOtherDestination
// (and replication.ErrSlotInUse) when the state row records another
// destination and an instance with it runs.
func (r *Relay) checkDestination(ctx context.Context, start replication.Start) error {
	if !start.HadState || start.State.Destination == "" {
		return nil
	}
	own := r.members.dest
	if rec, ok := parseDestination(start.State.Destination); !ok || rec.Key == own.Key {
		return nil
	}
	be, ok := r.be.(slotMembership)
	if !ok {
		return nil
	}
	members, err := be.SlotMembers(ctx, r.cfg.Postgres)
	if err != nil {
		return err
	}
	d, rec, holders := decideTakeover(start.State.Destination, own, members)
	if d != waitForRecorded {
		r.members.waitingSince = time.Time{}
	}
	switch d {
	case takeOverChanged:
		r.log.Info("destination changed: the last session on the slot published elsewhere, and no instance publishing there runs any more (a rolling update that changed the destination ended, or the configuration changed while pgoutbox was stopped); taking the slot over and recording this instance's destination",
			zap.String("slot", r.cfg.Postgres.Slot), zap.String("from", rec.Desc), zap.String("to", own.Desc), zap.String("differs", rec.differs(own)))
		return nil
	case waitForRecorded:
	default:
		return nil
	}
	// The instances with the recorded destination will take the slot
	// (and may move it on).
	r.history.slotBusy()
	var names []string
	for _, h := range holders {
		names = append(names, fmt.Sprintf("PID %d (application_name %q, client %s, backend_start %s)", h.PID, h.ApplicationName, orLocal(h.ClientAddr), startedAt(h.BackendStart)))
	}
	now := r.clock.Now()
	m := &r.members
	if m.waitingSince.IsZero() {
		m.waitingSince = now
	}
	if m.waitLoggedAt.IsZero() || now.Sub(m.waitLoggedAt) >= otherDestinationLogEvery {
		m.waitLoggedAt = now
		// A rolling update that changes the destination waits here for a
		// minute or two, and says so at Warn; a wait that lasts is another
		// deployment on the slot, said at Error.
		log := r.log.Warn
		if now.Sub(m.waitingSince) >= otherDestinationErrorAfter {
			log = r.log.Error
		}
		log("another deployment with another destination is running on this slot, or a rolling update that changes the destination is under way: this instance does not take the slot over while an instance with the destination the state row records runs, so that the slot's events are not split between two destinations (it takes over once they are gone, as at the end of such a rolling update); give every instance on the slot the same kafka.brokers and topic-deciding router settings, or give each deployment a slot (and state row) of its own",
			zap.String("slot", r.cfg.Postgres.Slot), zap.Strings("members", names),
			zap.String("recorded_destination", rec.Desc), zap.String("destination", own.Desc), zap.String("differs", rec.differs(own)),
			zap.Duration("next_log_in", otherDestinationLogEvery), zap.Duration("waiting_for", now.Sub(m.waitingSince)))
	}
	// This instance stands by for a rolling update's sake: the one that
	// changes the destination starts new pods (another destination) while
	// the old ones run, and waits for them to be ready (/rolloutz) before
	// it stops the old ones. Reported as unavailable, they would never
	// be, and the rollout would deadlock; so the report is the ordinary
	// standby check's (can this instance's own takeover work?).
	r.standingBy(ctx, start)
	return fmt.Errorf("%w: %w: slot %q: the state row records %s, this instance publishes to %s (%s differs), and %s run with the recorded one",
		replication.ErrSlotInUse, errOtherDestination, r.cfg.Postgres.Slot, rec.Desc, own.Desc, rec.differs(own), strings.Join(names, ", "))
}

func orLocal(addr string) string {
	if addr == "" {
		return "local"
	}
	return addr
}

func startedAt(t *time.Time) string {
	if t == nil {
		return "unknown"
	}
	return t.Format(time.RFC3339Nano)
}

// liveMember is a member connection (liveBackend.JoinSlot).
type liveMember struct{ conn *pgx.Conn }

func (m liveMember) Alive(ctx context.Context) bool { return m.conn.Ping(ctx) == nil }

func (m liveMember) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = m.conn.Close(ctx)
}

func (b *liveBackend) JoinSlot(ctx context.Context, cfg replication.Config, destination int32) (slotMember, error) {
	conn, err := replication.ConnectSQL(ctx, cfg, "pgoutbox-member", cfg.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	// The server ends the session of a vanished host within about a
	// minute (deadPeerSettings), not the operating system's 2 h 11 min
	// for which its lock would keep the instances of a new destination
	// waiting; and a server-wide idle_session_timeout must not drop the
	// lock of an instance that runs on (it is read again only at the
	// next session's start).
	if _, err := conn.Exec(ctx, deadPeerSettings+`, set_config('idle_session_timeout', '0', false)`); err != nil {
		liveMember{conn}.Close()
		return nil, fmt.Errorf("relay: member connection: set the server's TCP keepalives and idle_session_timeout: %w", err)
	}
	if _, err := replication.JoinSlot(ctx, conn, cfg.Slot, destination); err != nil {
		liveMember{conn}.Close()
		return nil, err
	}
	return liveMember{conn}, nil
}

func (b *liveBackend) SlotMembers(ctx context.Context, cfg replication.Config) (members []replication.SlotMember, err error) {
	err = withSQL(ctx, cfg, "pgoutbox-slot", func(conn *pgx.Conn) error {
		members, err = replication.SlotMembers(ctx, conn, cfg.Slot)
		return err
	})
	return members, err
}

// OtherDestinations reads, on conn, the WAL source's instances on the
// configured slot that publish to another destination than this
// configuration's, and describes each (pgoutbox status warns of them); it
// also returns the destination the slot's state row records when it is
// not this configuration's ("" otherwise).
func (c *Config) OtherDestinations(ctx context.Context, conn *pgx.Conn) (others []string, recorded string, err error) {
	own := c.walDestination()
	members, err := replication.SlotMembers(ctx, conn, c.Postgres.Slot)
	if err != nil {
		return nil, "", err
	}
	var rec walDestination
	if c.Postgres.StateTable != "" {
		if st, had, err := replication.ReadState(ctx, conn, c.Postgres.StateTable, c.Postgres.Slot); err == nil && had {
			if d, ok := parseDestination(st.Destination); ok && d.Key != own.Key {
				rec, recorded = d, d.Desc
			}
		}
	}
	for _, m := range members {
		if m.Destination == own.Key {
			continue
		}
		where := "another destination"
		if rec.Key != 0 && m.Destination == rec.Key {
			where = "the destination the state row records (" + rec.Desc + "; " + rec.differs(own) + " differs)"
		}
		others = append(others, fmt.Sprintf("PID %d (application_name %q, client %s, backend_start %s) publishes to %s",
			m.PID, m.ApplicationName, orLocal(m.ClientAddr), startedAt(m.BackendStart), where))
	}
	return others, recorded, nil
}
