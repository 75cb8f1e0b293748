package deploy

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"sigs.k8s.io/yaml"

	"github.com/pgoutbox/pgoutbox/pkg/metrics"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

const exampleAlerts = "examples/prometheus-alerts.yaml"

// exampleHeader opens examples/prometheus-alerts.yaml.
const exampleHeader = `# Alert rules for pgoutbox as a Prometheus rule file: promtool check rules
# accepts it. The Helm chart's PrometheusRule holds the same rules
# (deploy/helm/pgoutbox/templates/_alerts.tpl renders both); this file is
# rewritten from it by "go test -run Golden -update" in deploy/.
#
# The rules select job="pgoutbox" and aggregate by the "stream" label:
# give each pgoutbox target both, with one stream value for the two
# instances of a pair (the chart's ServiceMonitor does this). The container
# restart alert reads kube-state-metrics and stays silent elsewhere.
# Runbooks: the "Alerts" table in deploy/helm/pgoutbox/README.md.
`

// targetLabels are the labels Prometheus adds to every series of a
// target: the job and instance, the ServiceMonitor's Kubernetes labels,
// and the chart's stream.
var targetLabels = []string{"job", "instance", "namespace", "pod", "container", "service", "endpoint", "stream"}

// outsideMetrics are the series the rules may read that pgoutbox does not
// export: Prometheus's own up, and kube-state-metrics' restart counter.
var outsideMetrics = map[string][]string{
	"up": nil,
	"kube_pod_container_status_restarts_total": {"namespace", "pod", "container", "uid"},
}

// exportedSeries gathers the series pgoutbox's registry exports, with a
// child of every labelled family: metric name -> label sets.
func exportedSeries(t *testing.T) map[string][]map[string]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Labelled children appear with their first event: make one of each.
	safe := int64(1 << 20)
	m.SessionStarted(0)
	m.Routed("orders", "outbox.event.Order")
	m.Acked("outbox.event.Order", 100, time.Second, time.Millisecond)
	m.Failed("outbox.event.Order", errors.New("refused"))
	m.DeadLettered("outbox.event.Order")
	m.Dropped("public.outbox", "delete")
	m.Progress(relay.Progress{})
	m.ObserveSlot(replication.SlotStats{Name: "pgoutbox", WALStatus: "reserved", SafeWALSize: &safe})
	m.SessionEnded(nil)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]map[string]string{}
	for _, f := range families {
		names := []string{f.GetName()}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names = []string{f.GetName() + "_bucket", f.GetName() + "_sum", f.GetName() + "_count"}
		case dto.MetricType_SUMMARY:
			names = append(names, f.GetName()+"_sum", f.GetName()+"_count")
		}
		for _, metric := range f.GetMetric() {
			set := map[string]string{}
			for _, l := range metric.GetLabel() {
				set[l.GetName()] = l.GetValue()
			}
			for _, n := range names {
				out[n] = append(out[n], set)
			}
		}
	}
	return out
}

// chartRules renders the golden values and returns the PrometheusRule's
// groups as a rule file.
func chartRules(t *testing.T) []byte {
	t.Helper()
	o := decode(t, mustRender(t, helms[0], goldenValues))
	if len(o.rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(o.rules))
	}
	data, err := yaml.Marshal(o.rules[0].Spec)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// parseRules checks a rule file as promtool check rules does: the
// structure, the expressions, the templates of labels and annotations.
func parseRules(t *testing.T, what string, data []byte) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.Parse(data, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", what, err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		t.Fatalf("%s: no rule groups", what)
	}
	return groups
}

// TestAlertRulesParseAndReadOnlyExportedMetrics checks the chart's rules
// and the example file like promtool, then that every series they select
// is one pgoutbox exports (or up, or kube-state-metrics' restarts), with
// label matchers that match a real label value.
func TestAlertRulesParseAndReadOnlyExportedMetrics(t *testing.T) {
	example, err := os.ReadFile(repoPath(exampleAlerts))
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries(t)
	p := parser.NewParser(parser.Options{})
	for what, data := range map[string][]byte{"the chart's PrometheusRule": chartRules(t), exampleAlerts: example} {
		groups := parseRules(t, what, data)
		alerts := 0
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					t.Errorf("%s: %s: only alerts are expected", what, r.Record)
					continue
				}
				alerts++
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["runbook_url"] == "" {
					t.Errorf("%s: %s needs a severity, a summary and a runbook_url", what, r.Alert)
				}
				expr, err := p.ParseExpr(r.Expr)
				if err != nil {
					t.Errorf("%s: %s: %v", what, r.Alert, err)
					continue
				}
				parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok {
						checkSelector(t, what+": "+r.Alert, vs, exported)
					}
					return nil
				})
			}
		}
		if alerts < 9 {
			t.Errorf("%s: %d alerts, want the 9 or more the chart's README lists", what, alerts)
		}
	}
}

func checkSelector(t *testing.T, where string, vs *parser.VectorSelector, exported map[string][]map[string]string) {
	t.Helper()
	name := vs.Name
	if name == "" {
		t.Errorf("%s: a selector without a metric name: %s", where, vs)
		return
	}
	if labels, ok := outsideMetrics[name]; ok {
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel && !slices.Contains(labels, m.Name) && !slices.Contains(targetLabels, m.Name) {
				t.Errorf("%s: %s has no label %s", where, name, m.Name)
			}
		}
		return
	}
	sets, ok := exported[name]
	if !ok {
		t.Errorf("%s: pgoutbox exports no metric %s", where, name)
		return
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel || slices.Contains(targetLabels, m.Name) {
			continue
		}
		matched := false
		for _, set := range sets {
			if v, has := set[m.Name]; has && m.Matches(v) {
				matched = true
			}
		}
		if !matched {
			t.Errorf("%s: %s matches no series pgoutbox exports (%s)", where, m, name)
		}
	}
}

// TestExampleAlertsAreTheChartsGolden keeps examples/prometheus-alerts.yaml
// the chart's rules, rendered for a plain Prometheus (job="pgoutbox", any
// pgoutbox container in kube-state-metrics). -update rewrites it.
func TestExampleAlertsAreTheChartsGolden(t *testing.T) {
	vals := readValues(t, goldenValues)
	p := vals["prometheusRule"].(map[string]any)
	p["selector"], p["kubeStateSelector"] = `job="pgoutbox"`, `container="pgoutbox"`
	out, err := helms[0].render(vals)
	if err != nil {
		t.Fatal(err)
	}
	var spec string
	for _, doc := range documents(out) {
		if strings.Contains(doc, "\nkind: PrometheusRule\n") {
			_, spec, _ = strings.Cut(doc, "\nspec:\n")
		}
	}
	if spec == "" {
		t.Fatal("no PrometheusRule rendered")
	}
	// The spec's text, comments included, one level up.
	lines := strings.Split(spec, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "  ")
	}
	want := exampleHeader + strings.Join(lines, "\n") + "\n"
	if *update {
		if err := os.WriteFile(repoPath(exampleAlerts), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(repoPath(exampleAlerts))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s is not the chart's rules (go test -run Golden -update rewrites it):\n%s", exampleAlerts, lineDiff(want, string(got)))
	}
}

// TestEveryAlertHasARunbookLine looks for each alert in the runbook
// tables of the chart's README and the repository's README.
func TestEveryAlertHasARunbookLine(t *testing.T) {
	groups := parseRules(t, "the chart's PrometheusRule", chartRules(t))
	for _, doc := range []string{chartDir + "/README.md", repoPath("README.md")} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				row := regexp.MustCompile("(?m)^\\| `" + r.Alert + "` \\|[^|\\n]+\\|[^|\\n]+\\|")
				if !row.Match(data) {
					t.Errorf("%s has no runbook row for %s (| `%s` | severity | what to do |)", doc, r.Alert, r.Alert)
				}
			}
		}
	}
}

// alertExpr is the expression of one of the chart's alerts.
func alertExpr(t *testing.T, groups *rulefmt.RuleGroups, alert string) string {
	t.Helper()
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				return r.Expr
			}
		}
	}
	t.Fatalf("no alert %s", alert)
	return ""
}

// TestAlertExpressionsOnSeries evaluates the trickier expressions on
// series as a pair of pods would export them, like promtool test rules:
// what fires, and what must not. In each script %[1]s is the target's
// labels and %[2]s the alert's expression.
func TestAlertExpressionsOnSeries(t *testing.T) {
	groups := parseRules(t, "the chart's PrometheusRule", chartRules(t))
	const target = `job="pgoutbox",namespace="outbox"`
	for _, c := range []struct{ alert, script string }{
		{"PgoutboxNoReadyReplica", `
# A: one pod ready. B: both up, neither ready. C: one pod down, the other
# not ready. D: one pod down, the other ready.
load 1m
	up{%[1]s,stream="a",pod="a1"} 1x30
	up{%[1]s,stream="a",pod="a2"} 1x30
	pgoutbox_ready{%[1]s,stream="a",pod="a1"} 1x30
	pgoutbox_ready{%[1]s,stream="a",pod="a2"} 0x30
	up{%[1]s,stream="b",pod="b1"} 1x30
	up{%[1]s,stream="b",pod="b2"} 1x30
	pgoutbox_ready{%[1]s,stream="b",pod="b1"} 0x30
	pgoutbox_ready{%[1]s,stream="b",pod="b2"} 0x30
	up{%[1]s,stream="c",pod="c1"} 0x30
	up{%[1]s,stream="c",pod="c2"} 1x30
	pgoutbox_ready{%[1]s,stream="c",pod="c2"} 0x30
	up{%[1]s,stream="d",pod="d1"} 0x30
	up{%[1]s,stream="d",pod="d2"} 1x30
	pgoutbox_ready{%[1]s,stream="d",pod="d2"} 1x30

eval instant at 20m %[2]s
	{namespace="outbox",stream="b"} 0
	{namespace="outbox",stream="c"} 0
`},
		{"PgoutboxReplicationLagHigh", `
# The standby keeps the lag it had when it lost the slot; only the
# streaming pod's lag counts.
load 1m
	pgoutbox_replication_lag_bytes{%[1]s,stream="a",pod="a1"} 2147483648x20
	pgoutbox_streaming{%[1]s,stream="a",pod="a1"} 1x20
	pgoutbox_replication_lag_bytes{%[1]s,stream="b",pod="b1"} 2147483648x20
	pgoutbox_streaming{%[1]s,stream="b",pod="b1"} 0x20
	pgoutbox_replication_lag_bytes{%[1]s,stream="b",pod="b2"} 1024x20
	pgoutbox_streaming{%[1]s,stream="b",pod="b2"} 1x20

eval instant at 15m %[2]s
	{namespace="outbox",stream="a"} 2147483648
`},
		{"PgoutboxEventsDeadLettered", `
# a1 dead-letters its first event at 20m: the counter's child appears
# with 1. a2's child exists from the start and grows at 30m.
load 1m
	pgoutbox_events_dead_lettered_total{%[1]s,stream="a",pod="a1",topic="t"} _x19 1x60
	pgoutbox_events_dead_lettered_total{%[1]s,stream="a",pod="a2",topic="t"} 0x29 2x50

eval instant at 21m %[2]s
	{namespace="outbox",stream="a"} 1

eval instant at 31m %[2]s
	{namespace="outbox",stream="a"} 3

eval instant at 70m %[2]s
`},
		{"PgoutboxEventMessagesUnclaimed", `
# a1 skips an event-shaped message no relay claims at 20m; b1 only skips
# another relay's messages.
load 1m
	pgoutbox_skipped_messages_total{%[1]s,stream="a",pod="a1",reason="unclaimed_event"} 0x19 1x60
	pgoutbox_skipped_messages_total{%[1]s,stream="b",pod="b1",reason="another_relay"} 0x19 5x60
	pgoutbox_skipped_messages_total{%[1]s,stream="b",pod="b1",reason="unclaimed_event"} 0x80

eval instant at 21m %[2]s
	{namespace="outbox",stream="a"} 1

eval instant at 70m %[2]s
`},
		{"PgoutboxPublicationAltered", `
# a1 finds the publication altered at 20m (its counter's child exists from
# the start); b1 never does.
load 1m
	pgoutbox_publication_altered_total{%[1]s,stream="a",pod="a1"} 0x19 1x60
	pgoutbox_publication_altered_total{%[1]s,stream="b",pod="b1"} 0x80

eval instant at 21m %[2]s
	{namespace="outbox",stream="a"} 1

eval instant at 70m %[2]s
`},
		{"PgoutboxSlotRetainedWALNearLimit", `
# Retained WAL near max_slot_wal_keep_size: a at 90%%, b at 50%%, c
# without a limit (no safe_wal_size series).
load 1m
	pgoutbox_slot_retained_wal_bytes{%[1]s,stream="a",pod="a1"} 90x10
	pgoutbox_slot_safe_wal_size_bytes{%[1]s,stream="a",pod="a1"} 10x10
	pgoutbox_slot_retained_wal_bytes{%[1]s,stream="b",pod="b1"} 50x10
	pgoutbox_slot_safe_wal_size_bytes{%[1]s,stream="b",pod="b1"} 50x10
	pgoutbox_slot_retained_wal_bytes{%[1]s,stream="c",pod="c1"} 1e12x10

eval instant at 5m %[2]s
	{namespace="outbox",stream="a"} 0.9
`},
		{"PgoutboxContainerRestarting", `
# kube-state-metrics: a pod of pgoutbox-orders restarting, one of another
# release's Deployment restarting too.
load 1m
	kube_pod_container_status_restarts_total{namespace="outbox",pod="pgoutbox-orders-5d8f7c9b4-x7k2p",container="pgoutbox"} 0+1x30
	kube_pod_container_status_restarts_total{namespace="outbox",pod="other-orders-5d8f7c9b4-x7k2p",container="pgoutbox"} 0+1x30

eval instant at 20m %[2]s
	{namespace="outbox",stream="pgoutbox-orders",pod="pgoutbox-orders-5d8f7c9b4-x7k2p"} 15
`},
		{"PgoutboxOutboxBacklogOld", `
# The poll source's backlog: stream a's oldest row is 10 minutes old (both
# pods read the table), b's 10 seconds; the WAL source exports 0.
load 1m
	pgoutbox_outbox_oldest_unpublished_age_seconds{%[1]s,stream="a",pod="a1"} 600x10
	pgoutbox_outbox_oldest_unpublished_age_seconds{%[1]s,stream="a",pod="a2"} 590x10
	pgoutbox_outbox_oldest_unpublished_age_seconds{%[1]s,stream="b",pod="b1"} 10x10
	pgoutbox_outbox_oldest_unpublished_age_seconds{%[1]s,stream="c",pod="c1"} 0x10

eval instant at 5m %[2]s
	{namespace="outbox",stream="a"} 600
`},
		{"PgoutboxOutboxBacklogUnreadable", `
# The poll source's backlog reads: stream a's fail every minute, b's once.
load 1m
	pgoutbox_outbox_backlog_read_errors_total{%[1]s,stream="a",pod="a1"} 0+1x30
	pgoutbox_outbox_backlog_read_errors_total{%[1]s,stream="b",pod="b1"} 0 1x30

eval instant at 20m %[2]s
	{namespace="outbox",stream="a"} 15
`},
	} {
		t.Run(c.alert, func(t *testing.T) {
			engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 100_000, Timeout: 10 * time.Second, EnableAtModifier: true, EnableNegativeOffset: true, Parser: parser.NewParser(parser.Options{})})
			promqltest.RunTest(t, fmt.Sprintf(c.script, target, alertExpr(t, groups, c.alert)), engine)
		})
	}
}
