package poll

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrBucketsMismatch is returned by Rebalance when another instance on the
// table runs with a different poll.buckets: the two would hash keys into
// different buckets, and one key could be published by both at once.
var ErrBucketsMismatch = errors.New("poll: another instance on the table uses a different poll.buckets")

// ErrNotOwnSession is returned by Rebalance when the session does not hold
// the locks it took (its member lock, its buckets): its statements reach
// another server session than the one that took them, as through a pooler
// in transaction mode, or something released them (a pooler's DISCARD
// ALL, pg_advisory_unlock_all()). Other instances may own its buckets
// then: the relay stops.
var ErrNotOwnSession = errors.New("poll: the session does not hold the advisory locks it took")

// ErrDestinationMismatch is returned by Rebalance when an instance on the
// table that joined before this one publishes to another destination
// (Destination): the two would split the table's events between their
// destinations, each marking the rows it sent published, so that neither
// destination gets them all, and nothing says so.
var ErrDestinationMismatch = errors.New("poll: another instance on the table publishes to another destination")

// Destination is a fingerprint of where an instance publishes the table's
// rows: hashes of its Kafka cluster (the sorted brokers) and of the
// settings that decide the topics. No setting's value is in it, only
// hashes, so secrets in them do not reach pg_locks. The zero value is no
// fingerprint: an instance joined without one checks none.
//
// Other server sessions cannot read a session's settings (the mark), so
// an instance shows its fingerprint by holding shared advisory locks
// whose keys are the hashes, in namespaces of the table and of the
// fingerprint's format (destFormat): an instance whose format differs, or
// that predates fingerprints, shows none that this one can read, and is
// accepted (Ownership.Unknown) rather than stopping a rolling upgrade.
type Destination struct {
	Kafka, Router int32 // in [1, 2^31): 0 is "none"
}

// destFormat names the format of Destination's hashes in their lock
// namespaces: change it when what is hashed, or how, changes.
const destFormat = "v1"

// Fingerprint hashes the text of one part of a Destination (kind: "kafka"
// or "router") into a lock key in [1, 2^31).
func Fingerprint(kind, text string) int32 {
	f := fnv.New32a()
	f.Write([]byte("pgoutbox.poll.destination." + destFormat + "." + kind + "\x00" + text))
	return int32(f.Sum32()%(1<<31-1)) + 1
}

// destKey is the first key of the advisory locks that show the members'
// Destinations of one kind ("kafka", "router"), in destFormat.
func destKey(kind, table string) int32 {
	return lockKey("destination."+destFormat+"."+kind, table)
}

// Foreign is an instance on the table with another Destination.
type Foreign struct {
	PID             uint32
	ApplicationName string
	// Kafka and Router say which part differs.
	Kafka, Router bool
}

// Membership is an instance's place among the instances relaying one
// table, and the key buckets it owns.
//
// Every instance holds a session-level advisory lock in the table's member
// namespace (its key carries the instance's bucket count), and one in the
// table's bucket namespace for each bucket it owns. The server releases
// all of them when the session ends, however it ends (a clean stop, a
// crash, a lost connection the server noticed), and only then: a lock is
// never released while its holder's claim transaction is still open,
// because the transaction ends first. So a bucket has one owner at a time,
// and a new owner's first claim starts after the previous owner's last one
// ended. See DESIGN.md.
//
// Concurrency: a Membership belongs to the goroutine that owns its
// connection (the claimer's).
type Membership struct {
	conn     *pgx.Conn
	table    string
	buckets  int
	bucketNS int32
	memberNS int32
	self     int32 // this instance's member key: buckets<<16 | random
	pid      uint32
	// dest is this instance's Destination, shown by shared locks in the
	// namespaces kafkaNS and routerNS.
	dest              Destination
	kafkaNS, routerNS int32
	// mark is this instance's value of sessionMark on its server session,
	// set when it joined: a session that answers with another (or none) is
	// not one this instance has to itself.
	mark  string
	owned []int // sorted
}

// Ownership is the outcome of a rebalance.
type Ownership struct {
	Members int // instances on the table, this one included
	Target  int // buckets this instance should own
	Owned   []int
	// Gained and Released are the buckets taken and given up this time.
	Gained, Released []int
	// Unknown are the PIDs of instances that show no Destination this one
	// can read (an earlier version's, or one whose format differs): they
	// count as members, their destination unchecked.
	Unknown []uint32
	// Foreign are instances with another Destination that joined after
	// this one (they stop at their first rebalance, before they claim):
	// not counted as members.
	Foreign []Foreign
}

// Join takes the member lock of this instance on conn. It owns no bucket
// until the first Rebalance.
func Join(ctx context.Context, conn *pgx.Conn, table string, buckets int) (*Membership, error) {
	return JoinTo(ctx, conn, table, buckets, Destination{})
}

// JoinTo is Join for an instance that publishes to dest: it shows dest to
// the other instances, and its Rebalance checks theirs.
func JoinTo(ctx context.Context, conn *pgx.Conn, table string, buckets int, dest Destination) (*Membership, error) {
	bucketNS, memberNS := lockKeys(table)
	m := &Membership{conn: conn, table: table, buckets: buckets, bucketNS: bucketNS, memberNS: memberNS, pid: conn.PgConn().PID(),
		mark: strconv.FormatUint(rand.Uint64(), 36), dest: dest, kafkaNS: destKey("kafka", table), routerNS: destKey("router", table)}
	if dest != (Destination{}) {
		// Before the member lock: another instance that sees this one as
		// a member sees its destination too.
		// Shared: the instances with the same destination hold the same
		// keys, and nothing takes them exclusively.
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared($1::int, $2::int) AND pg_try_advisory_lock_shared($3::int, $4::int)",
			m.kafkaNS, dest.Kafka, m.routerNS, dest.Router).Scan(&ok); err != nil {
			return nil, fmt.Errorf("poll: show the destination of this instance of %s: %w", table, err)
		} else if !ok {
			return nil, fmt.Errorf("poll: show the destination of this instance of %s: another session holds the advisory lock (%d, %d) or (%d, %d) exclusively; pgoutbox takes them shared only: find the holder in pg_locks", table, m.kafkaNS, dest.Kafka, m.routerNS, dest.Router)
		}
	}
	for range 16 { // a collision of the random parts is rare; a few tries end it
		key := int32(buckets<<16 | rand.IntN(1<<16))
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int, $2::int) FROM set_config($3, $4, false)", memberNS, key, sessionMark, m.mark).Scan(&ok); err != nil {
			return nil, fmt.Errorf("poll: join the instances of %s: %w", table, err)
		}
		if ok {
			m.self = key
			return m, nil
		}
	}
	return nil, fmt.Errorf("poll: join the instances of %s: no free member key after 16 tries", table)
}

// Owned returns the buckets this instance owns; nil when it owns them all
// (no bucket filter is needed then).
func (m *Membership) Owned() []int {
	if len(m.owned) == m.buckets {
		return nil
	}
	return m.owned
}

// Count is how many buckets this instance owns.
func (m *Membership) Count() int { return len(m.owned) }

// sessionMark is the setting a poll instance marks its server session with
// when it joins. Advisory locks belong to a server session, not to a
// client: through a pooler in transaction mode, instances whose statements
// reach the same server session hold each other's locks (and a crashed
// one's stay held for as long as the pooler keeps the session, its buckets
// never claimed again), and one whose statements reach another session
// holds none. The locks cannot tell the first apart; the mark can: the
// last instance to join overwrites it.
const sessionMark = "pgoutbox.poll_member"

// lockHolder is one granted advisory lock of a table.
type lockHolder struct {
	ns, key int32
	pid     uint32
	mine    bool // held by the session that read it
}

// readLocks reads the table's granted advisory locks, and the value of
// sessionMark on the server session that read them ("" if unset).
func readLocks(ctx context.Context, conn *pgx.Conn, bucketNS, memberNS int32, more ...int32) ([]lockHolder, string, error) {
	var mark string
	var locks []lockHolder
	rows, err := conn.Query(ctx, `SELECT coalesce(current_setting($2, true), ''), l.* FROM (SELECT 1) one
		LEFT JOIN (SELECT classid::bigint::int, objid::bigint::int, pid, pid = pg_backend_pid() FROM pg_locks
			WHERE locktype = 'advisory' AND objsubid = 2 AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid IN (SELECT unnest($1::int[])::oid)) l(ns, key, pid, mine) ON true`, append([]int32{bucketNS, memberNS}, more...), sessionMark)
	if err != nil {
		return nil, "", err
	}
	var ns, key *int32
	var pid *uint32
	var mine *bool
	_, err = pgx.ForEachRow(rows, []any{&mark, &ns, &key, &pid, &mine}, func() error {
		if ns != nil {
			locks = append(locks, lockHolder{ns: *ns, key: *key, pid: *pid, mine: *mine})
		}
		return nil
	})
	return locks, mark, err
}

// Rebalance looks at the instances on the table and gives up or takes
// buckets so that each owns its share: with M instances ranked by their
// member keys, the first N mod M own N/M+1 buckets and the others N/M.
// Buckets are given up only here, between claim transactions; free ones
// are taken in this instance's order of preference (rendezvous hashing of
// its key and the bucket), so the owners of most buckets do not change
// when an instance joins or leaves.
func (m *Membership) Rebalance(ctx context.Context) (Ownership, error) {
	locks, mark, err := readLocks(ctx, m.conn, m.bucketNS, m.memberNS, m.kafkaNS, m.routerNS)
	if err != nil {
		return Ownership{}, fmt.Errorf("poll: read the instances of %s: %w", m.table, err)
	}
	if mark != m.mark {
		return Ownership{}, fmt.Errorf("%w: the server session relaying %s (PID %d) no longer carries the mark this instance set on it when it joined (%s is %q, not %q): its statements reach a server session that another client uses too, or another one than it joined on, as through a pooler in transaction mode (or a pooler's DISCARD ALL, or a RESET ALL, cleared it); advisory locks, which keep two instances from publishing the same keys at once, belong to server sessions, so they cannot do that here. Connect the poll source directly or through a pooler in session mode that does not reset sessions",
			ErrNotOwnSession, m.table, m.pid, sessionMark, mark, m.mark)
	}
	var members []int32
	memberPID := map[int32]uint32{}
	held := map[int]bool{}
	var selfHeld bool
	holder := map[int]lockHolder{} // the buckets' holders
	dests := map[uint32]Destination{}
	for _, l := range locks {
		switch l.ns {
		case m.memberNS:
			if n := int(l.key >> 16); n != m.buckets {
				return Ownership{}, fmt.Errorf("%w: PID %d runs with poll.buckets=%d, this instance with %d; give every instance the same setting", ErrBucketsMismatch, l.pid, n, m.buckets)
			}
			members = append(members, l.key)
			memberPID[l.key] = l.pid
			selfHeld = selfHeld || (l.key == m.self && l.mine)
		case m.bucketNS:
			if l.key >= 0 && int(l.key) < m.buckets {
				held[int(l.key)] = true
				holder[int(l.key)] = l
			}
		case m.kafkaNS:
			d := dests[l.pid]
			d.Kafka = l.key
			dests[l.pid] = d
		case m.routerNS:
			d := dests[l.pid]
			d.Router = l.key
			dests[l.pid] = d
		}
	}
	// Advisory locks show in pg_locks as soon as they are granted, and this
	// session took its own before: one missing from the view is one the
	// session no longer holds. Then other instances count this one out
	// and take its buckets, while it would go on claiming them: two
	// owners publishing the same keys at once, out of order.
	if err := m.checkHeld(selfHeld, holder); err != nil {
		return Ownership{}, err
	}
	var o Ownership
	if m.dest != (Destination{}) {
		if members, err = m.checkDestinations(ctx, members, memberPID, dests, &o); err != nil {
			return Ownership{}, err
		}
	}
	slices.Sort(members)
	rank := slices.Index(members, m.self)
	o.Members, o.Target = len(members), m.buckets/len(members)
	if rank < m.buckets%len(members) {
		o.Target++
	}
	if excess := len(m.owned) - o.Target; excess > 0 {
		give := m.byPreference(m.owned)
		give = give[len(give)-excess:] // the least preferred
		var held bool
		if err := m.conn.QueryRow(ctx, "SELECT bool_and(pg_advisory_unlock($1::int, b)) FROM unnest($2::int[]) b", m.bucketNS, give).Scan(&held); err != nil {
			return o, fmt.Errorf("poll: give up buckets of %s: %w", m.table, err)
		}
		if !held {
			// The locks stay with the session that took them, and no one
			// claims those buckets while it lives.
			return o, fmt.Errorf("%w: giving up buckets %v of %s, this session held none of them (a pooler in transaction mode between pgoutbox and PostgreSQL?): the poll source keeps its buckets as session locks and needs a server session of its own (a direct connection, or a pooler in session mode)", ErrNotOwnSession, give, m.table)
		}
		m.owned = slices.DeleteFunc(m.owned, func(b int) bool { return slices.Contains(give, b) })
		o.Released = give
	}
	if need := o.Target - len(m.owned); need > 0 {
		var free []int
		for b := range m.buckets {
			if !held[b] && !slices.Contains(m.owned, b) {
				free = append(free, b)
			}
		}
		free = m.byPreference(free)
		free = free[:min(need, len(free))]
		if len(free) > 0 {
			rows, err := m.conn.Query(ctx, "SELECT b FROM unnest($2::int[]) b WHERE pg_try_advisory_lock($1::int, b)", m.bucketNS, free)
			if err != nil {
				return o, fmt.Errorf("poll: take buckets of %s: %w", m.table, err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return o, fmt.Errorf("poll: take buckets of %s: %w", m.table, err)
			}
			for _, b := range got {
				m.owned = append(m.owned, int(b))
				o.Gained = append(o.Gained, int(b))
			}
		}
	}
	sort.Ints(m.owned)
	o.Owned = slices.Clone(m.owned)
	return o, nil
}

// checkDestinations compares the Destinations the other members show with
// this instance's. Members that show none (Ownership.Unknown) are
// accepted: an earlier version, or one whose format differs, during a
// rolling upgrade. Of the members that show one, the one whose server
// session started first (then the lowest PID) sets the table's
// destination: this instance stops, before it claims, when its own
// differs (ErrDestinationMismatch, naming both and what differs), and
// otherwise leaves the members whose destination differs out of the
// shares (Ownership.Foreign): they stop at their own rebalance. So a
// misconfigured copy that joins stops, and the instances it joined go on.
// It returns the members that count.
func (m *Membership) checkDestinations(ctx context.Context, members []int32, memberPID map[int32]uint32, dests map[uint32]Destination, o *Ownership) ([]int32, error) {
	var differ []uint32
	for _, key := range members {
		pid := memberPID[key]
		d, ok := dests[pid]
		switch {
		case key == m.self:
		case !ok || d.Kafka == 0 || d.Router == 0:
			o.Unknown = append(o.Unknown, pid)
		case d != m.dest:
			differ = append(differ, pid)
		}
	}
	if len(differ) == 0 {
		return members, nil
	}
	// Who came first: the server sessions' start. An instance joins on
	// its session soon after it opens it.
	pids := []int64{int64(m.pid)}
	for pid, d := range dests {
		if pid != m.pid && d.Kafka != 0 && d.Router != 0 {
			pids = append(pids, int64(pid))
		}
	}
	type session struct {
		pid     uint32
		app     string
		started *time.Time // NULL for another role's without pg_read_all_stats
	}
	rows, err := m.conn.Query(ctx, "SELECT pid, coalesce(application_name, ''), backend_start FROM pg_stat_activity WHERE pid = ANY($1::int[])", pids)
	if err != nil {
		return nil, fmt.Errorf("poll: read the sessions of the instances of %s: %w", m.table, err)
	}
	sessions := map[uint32]session{}
	var sn session
	if _, err := pgx.ForEachRow(rows, []any{&sn.pid, &sn.app, &sn.started}, func() error {
		sessions[sn.pid] = sn
		return nil
	}); err != nil {
		return nil, fmt.Errorf("poll: read the sessions of the instances of %s: %w", m.table, err)
	}
	first := m.pid
	for pid := range sessions {
		a, b := sessions[pid].started, sessions[first].started
		// An unknown start counts as later than a known one.
		switch {
		case a != nil && (b == nil || a.Before(*b)):
			first = pid
		case (a == nil) == (b == nil) && (a == nil || a.Equal(*b)) && pid < first:
			first = pid
		}
	}
	// A session gone since pg_locks was read is not in pg_stat_activity
	// (nor first): it holds nothing any more.
	foreign := func(pid uint32) Foreign {
		d := dests[pid]
		return Foreign{PID: pid, ApplicationName: sessions[pid].app, Kafka: d.Kafka != m.dest.Kafka, Router: d.Router != m.dest.Router}
	}
	if d := dests[first]; first != m.pid && d != m.dest {
		f := foreign(first)
		return nil, fmt.Errorf("%w: the instance on %s with PID %d (application_name %q, its session started %s) publishes to %s than this instance (PID %d, application_name %q, started %s), and was there first (its server session started earlier); both would mark the rows they claim published, each destination getting some of the table's events, so this instance claims nothing, and waits until the other has left (as the old instances of a rolling update that changes these settings do). Give every instance on the table the same kafka.brokers (listed alike: the list's hash is compared), router settings that decide topics (route.by.field, route.topic.regex, route.topic.replacement, route.topic, the table's routes entry) and relay.dead.letter.topic; or give each deployment an outbox table of its own",
			ErrDestinationMismatch, m.table, f.PID, f.ApplicationName, when(sessions[first].started), f.What(), m.pid, sessions[m.pid].app, when(sessions[m.pid].started))
	}
	for _, pid := range differ {
		o.Foreign = append(o.Foreign, foreign(pid))
	}
	return slices.DeleteFunc(members, func(key int32) bool { return slices.Contains(differ, memberPID[key]) }), nil
}

// when formats a session's start ("unknown": not visible to this role).
func when(t *time.Time) string {
	if t == nil {
		return "unknown"
	}
	return t.Format(time.RFC3339Nano)
}

// What says what differs: "another Kafka cluster", "another router
// configuration", or both.
func (f Foreign) What() string {
	var parts []string
	if f.Kafka {
		parts = append(parts, "another Kafka cluster (kafka.brokers)")
	}
	if f.Router {
		parts = append(parts, "another router configuration (the settings that decide topics)")
	}
	return strings.Join(parts, " and ")
}

// checkHeld fails, wrapping ErrNotOwnSession, when this instance's
// session no longer holds its member lock (selfHeld) or a bucket it owns
// (holder: each bucket's holder, as pg_locks showed it).
func (m *Membership) checkHeld(selfHeld bool, holder map[int]lockHolder) error {
	var lost []int
	var others []string
	for _, b := range m.owned {
		h, ok := holder[b]
		if ok && h.mine {
			continue
		}
		lost = append(lost, b)
		if ok {
			others = append(others, fmt.Sprintf("bucket %d by PID %d", b, h.pid))
		}
	}
	if selfHeld && len(lost) == 0 {
		return nil
	}
	what := fmt.Sprintf("its member lock (key %d)", m.self)
	if selfHeld {
		what = fmt.Sprintf("the locks of buckets %v", lost)
	} else if len(lost) > 0 {
		what += fmt.Sprintf(" and the locks of buckets %v", lost)
	}
	taken := ""
	if len(others) > 0 {
		taken = "; held now: " + strings.Join(others, ", ")
	}
	return fmt.Errorf("%w: the session relaying %s (PID %d) no longer holds %s%s: something released its advisory locks (pg_advisory_unlock_all(), a pooler's DISCARD ALL, a pooler in transaction mode), so other instances may claim its buckets while it does; stopping rather than publish the same keys twice at once. Connect the poll source directly or through a pooler in session mode that does not reset sessions",
		ErrNotOwnSession, m.table, m.pid, what, taken)
}

// byPreference returns buckets sorted by this instance's preference, most
// preferred first.
func (m *Membership) byPreference(buckets []int) []int {
	w := func(b int) uint64 { return mix64(uint64(uint32(m.self))<<32 | uint64(uint32(b))) }
	out := slices.Clone(buckets)
	slices.SortFunc(out, func(a, b int) int {
		wa, wb := w(a), w(b)
		switch {
		case wa > wb:
			return -1
		case wa < wb:
			return 1
		}
		return a - b
	})
	return out
}

// mix64 is splitmix64's finalizer: every input bit moves every output bit,
// so the preferences of two instances for the same buckets are unrelated.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Member is one instance relaying a table, as pg_locks and
// pg_stat_activity show it.
type Member struct {
	PID             uint32 `json:"pid"`
	Buckets         int    `json:"buckets_configured"`
	Owned           int    `json:"buckets_owned"`
	ApplicationName string `json:"application_name"`
	ClientAddr      string `json:"client_addr"`
}

// Members reads the instances relaying table and how many buckets each
// owns (for pgoutbox status, and to see that no poll relay runs).
func Members(ctx context.Context, conn *pgx.Conn, table string) ([]Member, error) {
	bucketNS, memberNS := lockKeys(table)
	locks, _, err := readLocks(ctx, conn, bucketNS, memberNS)
	if err != nil {
		return nil, fmt.Errorf("poll: read the instances of %s: %w", table, err)
	}
	owned := map[uint32]int{}
	var out []Member
	for _, l := range locks {
		switch l.ns {
		case memberNS:
			out = append(out, Member{PID: l.pid, Buckets: int(l.key >> 16)})
		case bucketNS:
			owned[l.pid]++
		}
	}
	for i := range out {
		out[i].Owned = owned[out[i].PID]
		var app, addr *string
		err := conn.QueryRow(ctx, "SELECT application_name, host(client_addr) FROM pg_stat_activity WHERE pid = $1", int64(out[i].PID)).Scan(&app, &addr)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("poll: read the session of PID %d: %w", out[i].PID, err)
		}
		if app != nil {
			out[i].ApplicationName = *app
		}
		if addr != nil {
			out[i].ClientAddr = *addr
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// LockAll takes, on conn, the advisory locks of every bucket of table
// [0, buckets) and returns whether it got them all; when not, it holds
// none. A poll relay holds a bucket's lock while it claims from it, so
// while these are held no poll relay claims rows of table. Release with
// UnlockAll (or by closing conn).
func LockAll(ctx context.Context, conn *pgx.Conn, table string, buckets int) (bool, error) {
	bucketNS, _ := lockKeys(table)
	var got int
	err := conn.QueryRow(ctx, "SELECT count(*) FILTER (WHERE pg_try_advisory_lock($1::int, b)) FROM generate_series(0, $2::int - 1) b", bucketNS, buckets).Scan(&got)
	if err != nil {
		return false, fmt.Errorf("poll: lock the buckets of %s: %w", table, err)
	}
	if got == buckets {
		return true, nil
	}
	return false, UnlockAll(ctx, conn, table, buckets)
}

// UnlockAll releases what LockAll took on conn.
func UnlockAll(ctx context.Context, conn *pgx.Conn, table string, buckets int) error {
	bucketNS, _ := lockKeys(table)
	// pg_advisory_unlock warns about locks this session does not hold: the
	// ones LockAll did not get. Unlock only those held.
	_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1::int, l.objid::bigint::int) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.pid = pg_backend_pid()
		AND l.classid = $1::int::oid AND l.objid::bigint < $2`, bucketNS, buckets)
	if err != nil {
		return fmt.Errorf("poll: unlock the buckets of %s: %w", table, err)
	}
	return nil
}
