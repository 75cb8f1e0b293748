package main

import (
	"testing"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
)

// optionalObserver implements the relay's optional observer interfaces
// and counts their calls.
type optionalObserver struct {
	relay.NopObserver
	progress, cleaned, altered int
}

func (o *optionalObserver) PollProgress(relay.PollProgress) { o.progress++ }
func (o *optionalObserver) CleanedUp(int64)                 { o.cleaned++ }
func (o *optionalObserver) PublicationAltered(string)       { o.altered++ }

// TestAuditObserverKeepsTheOptionalInterfaces: the durability audit wraps
// pgoutbox run's observer (the metrics). The relay finds its optional
// interfaces by type assertion, so a wrapper that only embeds
// relay.Observer hid them: every poll relay run by pgoutbox run was
// reported stalled, its progress never reaching the metrics (an
// observability prober). The wrapper passes each on.
func TestAuditObserverKeepsTheOptionalInterfaces(t *testing.T) {
	inner := &optionalObserver{}
	o := newDurabilityAudit(relay.DefaultConfig(), zap.NewNop()).Observe(inner)
	po, ok := o.(relay.PollObserver)
	if !ok {
		t.Fatal("the audit's observer is no relay.PollObserver")
	}
	co, ok := o.(relay.CatalogObserver)
	if !ok {
		t.Fatal("the audit's observer is no relay.CatalogObserver")
	}
	po.PollProgress(relay.PollProgress{Table: "public.outbox", Committed: true})
	po.CleanedUp(3)
	co.PublicationAltered("pgoutbox")
	if inner.progress != 1 || inner.cleaned != 1 || inner.altered != 1 {
		t.Fatalf("passed on: %d progress reports, %d cleanups, %d publication changes; want 1 each", inner.progress, inner.cleaned, inner.altered)
	}
	// An observer without them is not made to look as if it had them
	// wrongly: the calls are dropped.
	plain := newDurabilityAudit(relay.DefaultConfig(), zap.NewNop()).Observe(relay.NopObserver{})
	plain.(relay.PollObserver).PollProgress(relay.PollProgress{})
	plain.(relay.CatalogObserver).PublicationAltered("pgoutbox")
}
