package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Variant is a pgoutbox configuration measured beside others in one run:
// extra KEY=VALUE settings on top of --pgoutbox-env.
type Variant struct {
	Name string   `json:"name"`
	Env  []string `json:"env"`
}

// VariantResult is one variant's pass over the catch-up and latency
// scenarios in one run.
type VariantResult struct {
	Variant
	Run     int             `json:"run"`
	Catchup []CatchupResult `json:"catchup"`
	Latency []LatencyResult `json:"latency"`
}

// parseVariant parses NAME=KEY=VALUE,KEY=VALUE (NAME= for none).
func parseVariant(s string) (Variant, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" || !validIdent(name) {
		return Variant{}, fmt.Errorf("--variant %q: want NAME=KEY=VALUE,... with a NAME of lower-case letters, digits and _", s)
	}
	v := Variant{Name: name, Env: []string{}}
	for _, kv := range strings.Split(rest, ",") {
		if kv == "" {
			continue
		}
		if !strings.Contains(kv, "=") {
			return v, fmt.Errorf("--variant %q: %q is not KEY=VALUE", s, kv)
		}
		v.Env = append(v.Env, kv)
	}
	return v, nil
}

// variants runs the catch-up and latency scenarios that are enabled once
// per variant and run, the variants' order reversed every other run.
func (h *harness) variants(ctx context.Context, res *Results) []error {
	var failed []error
	for run := range h.o.Runs {
		order := slices.Clone(h.o.Variants)
		if run%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			if ctx.Err() != nil {
				return append(failed, ctx.Err())
			}
			h.variantEnv, h.variantTag = v.Env, fmt.Sprintf("_%s%d", v.Name, run+1)
			h.logf("variant %s, run %d: %s", v.Name, run+1, strings.Join(v.Env, " "))
			vr := VariantResult{Variant: v, Run: run + 1}
			vr.Catchup, vr.Latency = h.walScenarios(ctx, func(name string, err error) {
				if err != nil {
					failed = append(failed, fmt.Errorf("variant %s, run %d: %s: %w", v.Name, run+1, name, err))
				}
			})
			res.Variants = append(res.Variants, vr)
		}
	}
	h.variantEnv, h.variantTag = nil, ""
	return failed
}

func summaryVariants(p func(string, ...any), vs []VariantResult) {
	p("\n## Variants\n\nThe same scenarios with each pgoutbox configuration in turn, the order reversed every other run.\n\n")
	p("| run | variant | settings | catch-up events/s (x pg_recvlogical), walsender busy (waiting for a CPU) | latency: events/s, p50 / p99 ms, CPU s per 100k events, reads / writes / context switches per event |\n|---:|---|---|---|---|\n")
	for _, v := range vs {
		var cu, lat []string
		for _, c := range v.Catchup {
			if c.Error != "" {
				cu = append(cu, fmt.Sprintf("%d: failed", c.TxnSize))
				continue
			}
			cell := fmt.Sprintf("%d-event: %s (%.2fx), %.0f%% (%.0f%% waiting for a CPU)", c.TxnSize, thousands(int64(c.Pgoutbox.EventsPerSec)), c.Ratio,
				c.Pgoutbox.WalsenderBusy*100, c.Pgoutbox.WalsenderRunQueue*100)
			if c.PgoutboxEOS != nil {
				cell += fmt.Sprintf(", exactly-once %s (%.2fx at-least-once)", thousands(int64(c.PgoutboxEOS.EventsPerSec)), c.RatioEOS)
			}
			cu = append(cu, cell)
		}
		for _, l := range v.Latency {
			if l.Error != "" && l.Received == 0 {
				lat = append(lat, fmt.Sprintf("%d%s: failed", l.TargetRate, modeTag(l.Mode)))
				continue
			}
			w := l.PgoutboxWindow
			lat = append(lat, fmt.Sprintf("%s%s: %s / %s, %s, %.2f / %.2f / %.2f", thousands(int64(l.TargetRate)), modeTag(l.Mode), f1(l.LatencyMs.P50), f1(l.LatencyMs.P99),
				f2(l.WindowCPUSecondsPer100k), perEvent(w.ReadSyscalls, l.Committed), perEvent(w.WriteSyscalls, l.Committed),
				perEvent(w.VoluntarySwitches+w.InvoluntarySwitches, l.Committed)))
		}
		env := "defaults"
		if len(v.Env) > 0 {
			env = "`" + strings.Join(v.Env, "` `") + "`"
		}
		p("| %d | %s | %s | %s | %s |\n", v.Run, v.Name, env, strings.Join(cu, "; "), strings.Join(lat, "; "))
	}
}
