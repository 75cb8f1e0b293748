package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/replication"
)

// failoverFacts is what validate reads, on one server, about keeping the
// slot across a promotion.
type failoverFacts struct {
	address      string
	versionNum   int
	inRecovery   bool
	walLevel     string
	syncStandby  string // synchronized_standby_slots (primary)
	syncSlots    string // sync_replication_slots (standby)
	feedback     string // hot_standby_feedback (standby)
	primarySlot  string // primary_slot_name (standby)
	primaryConn  string // primary_conninfo, with its password removed (standby)
	physical     []string
	slotFailover *bool // the slot's failover flag (nil: no such slot)
	slotSynced   bool
	slotTemp     bool
}

const failoverFactsSQL = `SELECT current_setting('server_version_num')::int, pg_is_in_recovery(), current_setting('wal_level'),
	coalesce(current_setting('synchronized_standby_slots', true), ''), coalesce(current_setting('sync_replication_slots', true), ''),
	current_setting('hot_standby_feedback'), current_setting('primary_slot_name'), current_setting('primary_conninfo'),
	ARRAY(SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'physical' ORDER BY 1),
	(SELECT (to_jsonb(s) ->> 'failover')::bool FROM pg_replication_slots s WHERE slot_name = $1),
	coalesce((SELECT (to_jsonb(s) ->> 'synced')::bool FROM pg_replication_slots s WHERE slot_name = $1), false),
	coalesce((SELECT temporary FROM pg_replication_slots WHERE slot_name = $1), false)`

// validateFailover checks, when postgres.slot.failover is on or the DSN
// names several hosts, what keeps the slot across a promotion: on the
// primary and on every standby of the DSN that answers.
func validateFailover(ctx context.Context, v *validation, rc replication.Config) {
	pcfg, err := rc.SQLConfig()
	if err != nil || (!rc.SlotFailover && len(pcfg.Fallbacks) == 0) {
		return
	}
	hosts := []struct {
		host string
		port uint16
	}{{pcfg.Host, pcfg.Port}}
	for _, fb := range pcfg.Fallbacks {
		hosts = append(hosts, struct {
			host string
			port uint16
		}{fb.Host, fb.Port})
	}
	var facts []failoverFacts
	for _, h := range hosts {
		c := pcfg.Copy()
		c.Host, c.Port, c.Fallbacks, c.ValidateConnect = h.host, h.port, nil, nil
		addr := fmt.Sprintf("%s:%d", h.host, h.port)
		conn, err := pgx.ConnectConfig(ctx, c)
		if err != nil {
			v.report(warn("failover "+addr, "not checked: "+oneLine(err), "make the server reachable from here to check it"))
			continue
		}
		f := failoverFacts{address: addr}
		var conninfo string
		err = conn.QueryRow(ctx, failoverFactsSQL, rc.Slot).Scan(&f.versionNum, &f.inRecovery, &f.walLevel, &f.syncStandby,
			&f.syncSlots, &f.feedback, &f.primarySlot, &conninfo, &f.physical, &f.slotFailover, &f.slotSynced, &f.slotTemp)
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			v.report(warn("failover "+addr, "not checked: "+oneLine(err), ""))
			continue
		}
		f.primaryConn = conninfo
		facts = append(facts, f)
	}
	v.report(checkFailover(facts, rc)...)
}

// checkFailover judges what validateFailover read.
func checkFailover(facts []failoverFacts, rc replication.Config) []checkResult {
	var out []checkResult
	var primary *failoverFacts
	var standbys []failoverFacts
	for i := range facts {
		if facts[i].inRecovery {
			standbys = append(standbys, facts[i])
		} else if primary == nil {
			primary = &facts[i]
		}
	}
	if primary == nil {
		return []checkResult{warn("failover", "no server of postgres.dsn accepts writes: the primary was not checked", "")}
	}
	name := "failover primary " + primary.address
	if rc.SlotFailover && primary.versionNum < 170000 {
		return []checkResult{fail(name, fmt.Sprintf("postgres.slot.failover is on, but PostgreSQL %d.%d keeps no logical slot on a standby (17 does)", primary.versionNum/10000, primary.versionNum%10000),
			"upgrade to PostgreSQL 17 or later, or turn postgres.slot.failover off (then a promotion loses the slot: see the README's Database failover section)")}
	}
	if !rc.SlotFailover {
		out = append(out, warn(name, "postgres.dsn names several hosts, but postgres.slot.failover is off: after a promotion the slot is gone and pgoutbox stops",
			"on PostgreSQL 17+: set postgres.slot.failover=true (Debezium: slot.failover) and configure the standby to synchronize it"))
		return out
	}
	switch {
	case primary.slotFailover == nil:
		out = append(out, pass(name, "the slot does not exist yet; pgoutbox will create it as a failover slot"))
	case !*primary.slotFailover:
		out = append(out, warn(name, "the slot is not a failover slot yet; pgoutbox will make it one at start", ""))
	default:
		out = append(out, pass(name, "the slot is a failover slot"))
	}
	listed := strings.Split(primary.syncStandby, ",")
	for i := range listed {
		listed[i] = strings.Trim(strings.TrimSpace(listed[i]), `"`)
	}
	switch {
	case strings.TrimSpace(primary.syncStandby) == "":
		out = append(out, fail(name, "synchronized_standby_slots is empty: pgoutbox may confirm changes a standby has not received, and after a promotion the synchronized slot would be ahead of the new primary's WAL",
			"ALTER SYSTEM SET synchronized_standby_slots = '<the standby's physical slot>'; SELECT pg_reload_conf();"))
	default:
		for _, s := range listed {
			if s != "" && !slices.Contains(primary.physical, s) {
				out = append(out, fail(name, fmt.Sprintf("synchronized_standby_slots names %q, which is not a physical slot on this server", s),
					"create it (SELECT pg_create_physical_replication_slot(...)) and set it as the standby's primary_slot_name, or correct the setting"))
			}
		}
	}
	if primary.walLevel != "logical" {
		out = append(out, fail(name, "wal_level is "+primary.walLevel, "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"))
	}
	if len(standbys) == 0 {
		out = append(out, warn("failover standby", "no standby among the hosts of postgres.dsn answered: its settings were not checked",
			"list the standby in postgres.dsn (host=primary,standby ... target_session_attrs=read-write), which also lets pgoutbox follow a promotion"))
	}
	for _, s := range standbys {
		name := "failover standby " + s.address
		bad := func(what, fix string) { out = append(out, fail(name, what, fix)) }
		if s.syncSlots != "on" {
			bad("sync_replication_slots is "+orNone(s.syncSlots)+": the standby keeps no copy of the slot", "ALTER SYSTEM SET sync_replication_slots = on; SELECT pg_reload_conf();")
		}
		if s.feedback != "on" {
			bad("hot_standby_feedback is off: the primary may remove catalog rows the synchronized slot needs", "ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf();")
		}
		if s.primarySlot == "" {
			bad("primary_slot_name is not set: the standby streams without a physical slot", "set primary_slot_name to a physical slot of the primary that synchronized_standby_slots names")
		} else if !slices.Contains(listed, s.primarySlot) {
			bad(fmt.Sprintf("primary_slot_name %q is not in the primary's synchronized_standby_slots", s.primarySlot),
				fmt.Sprintf("on the primary: ALTER SYSTEM SET synchronized_standby_slots = '%s'; SELECT pg_reload_conf();", s.primarySlot))
		}
		if !strings.Contains(s.primaryConn, "dbname=") {
			bad("primary_conninfo names no dbname: slot synchronization needs one", "add dbname=postgres (or any database) to primary_conninfo")
		}
		if s.walLevel != "logical" {
			bad("wal_level is "+s.walLevel+": after a promotion the server could not decode", "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL")
		}
		switch {
		case primary.slotFailover == nil:
		case !s.slotSynced:
			bad("the slot is not synchronized here yet", "check the settings above and the standby's log (slot sync worker)")
		case s.slotTemp:
			out = append(out, warn(name, "the slot is synchronized but still temporary (the standby has not caught up with it): a promotion now would drop it", "wait for the standby to catch up"))
		default:
			out = append(out, pass(name, "the slot is synchronized and persisted"))
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "not available (before PostgreSQL 17)"
	}
	return s
}
