package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestValidateChecksWhatAFailoverSlotNeeds against a real primary and
// standby: set up as they should be, the failover lines pass; then, one at a
// time, a setting is taken away on the primary or the standby and validate
// names it with its fix.
func TestValidateChecksWhatAFailoverSlotNeeds(t *testing.T) {
	env := testenv.RequireExclusive(t)
	if major, _ := env.ServerVersion(t); major < 17 {
		t.Skipf("failover slots need PostgreSQL 17; this is %d", major)
	}
	pair := env.NewPair(t)
	pair.CreateDatabase(t, "app")
	slot := testenv.UniqueName(t, "slot")
	environ := []string{
		"PGOUTBOX_POSTGRES_DSN=" + pair.DSN("app"),
		"PGOUTBOX_POSTGRES_SLOT_NAME=" + slot,
		"PGOUTBOX_POSTGRES_SLOT_FAILOVER=true",
		"PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=public.outbox",
		"PGOUTBOX_KAFKA_BROKERS=" + strings.Join(env.KafkaBrokers, ","),
	}
	exec := func(port int, sql string) {
		t.Helper()
		pair.Exec(t, port, "postgres", sql)
	}
	r := invoke(cmdValidate, nil, environ)
	wantLine(t, r, fmt.Sprintf(`^PASS failover primary 127\.0\.0\.1:%d: the slot does not exist yet; pgoutbox will create it as a failover slot$`, pair.PrimaryPort))
	noLine(t, r, `^FAIL failover`)

	exec(pair.PrimaryPort, "ALTER SYSTEM SET synchronized_standby_slots = ''")
	exec(pair.PrimaryPort, "SELECT pg_reload_conf()")
	exec(pair.StandbyPort, "ALTER SYSTEM SET hot_standby_feedback = off")
	exec(pair.StandbyPort, "SELECT pg_reload_conf()")
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		r = invoke(cmdValidate, nil, environ)
		return strings.Contains(r.stdout, "FAIL failover primary") && strings.Contains(r.stdout, "FAIL failover standby"),
			"validate does not name both yet:\n" + r.String()
	})
	wantLine(t, r, fmt.Sprintf(`^FAIL failover primary 127\.0\.0\.1:%d: synchronized_standby_slots is empty`, pair.PrimaryPort))
	wantLine(t, r, `^  fix: ALTER SYSTEM SET synchronized_standby_slots = `)
	wantLine(t, r, fmt.Sprintf(`^FAIL failover standby 127\.0\.0\.1:%d: hot_standby_feedback is off`, pair.StandbyPort))
	wantLine(t, r, fmt.Sprintf(`^FAIL failover standby 127\.0\.0\.1:%d: primary_slot_name "%s" is not in the primary's synchronized_standby_slots`, pair.StandbyPort, testenv.StandbySlot))
}
