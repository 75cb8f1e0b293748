package main

import (
	"strings"
	"testing"
)

// TestValidateWarnsThatOpInvalidBehaviorSeesNoUpdates: with a publication
// of inserts only, router.table.op.invalid.behavior=fatal never stops
// anything: updates are not decoded.
func TestValidateWarnsThatOpInvalidBehaviorSeesNoUpdates(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)

	r := invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_ROUTER_TABLE_OP_INVALID_BEHAVIOR=fatal"))
	wantLine(t, r, `^WARN router\.table\.op\.invalid\.behavior: router\.table\.op\.invalid\.behavior is fatal, but publication "`+f.publication+`" does not publish updates: an UPDATE of an outbox row is not seen at all`)
	if r := invoke(cmdValidate, nil, f.environ(f.dsn)); strings.Contains(r.stdout, "WARN router.table.op.invalid.behavior") {
		t.Fatalf("warned with the default warn:\n%s", r)
	}
	f.exec(t, "ALTER PUBLICATION "+f.publication+" SET (publish = 'insert, update')")
	r = invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_ROUTER_TABLE_OP_INVALID_BEHAVIOR=fatal"))
	noLine(t, r, `^WARN router\.table\.op\.invalid\.behavior`)
}
