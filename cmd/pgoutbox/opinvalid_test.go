package main

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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

// TestRunWarnsThatOpInvalidBehaviorSeesNoUpdates: run says at start what
// validate says, once, naming the publication; nothing with warn, or once
// the publication publishes updates.
func TestRunWarnsThatOpInvalidBehaviorSeesNoUpdates(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	warned := func(extra ...string) int {
		t.Helper()
		cfg, err := loadConfig("", f.environ(f.dsn, extra...))
		if err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zapcore.WarnLevel)
		warnUnseenUpdates(context.Background(), cfg, zap.New(core))
		return logs.FilterMessageSnippet("does not publish updates").FilterField(zap.String("publication", f.publication)).Len()
	}
	if n := warned("PGOUTBOX_ROUTER_TABLE_OP_INVALID_BEHAVIOR=fatal"); n != 1 {
		t.Fatalf("fatal with an inserts-only publication: %d warnings; want 1", n)
	}
	if n := warned(); n != 0 {
		t.Fatalf("the default warn: %d warnings; want none", n)
	}
	f.exec(t, "ALTER PUBLICATION "+f.publication+" SET (publish = 'insert, update')")
	if n := warned("PGOUTBOX_ROUTER_TABLE_OP_INVALID_BEHAVIOR=error"); n != 0 {
		t.Fatalf("a publication of updates: %d warnings; want none", n)
	}
}
