package deploy

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	action3 "helm.sh/helm/v3/pkg/action"
	loader3 "helm.sh/helm/v3/pkg/chart/loader"
	chartutil3 "helm.sh/helm/v3/pkg/chartutil"
	support3 "helm.sh/helm/v3/pkg/lint/support"
	action4 "helm.sh/helm/v4/pkg/action"
	common4 "helm.sh/helm/v4/pkg/chart/common"
	support4 "helm.sh/helm/v4/pkg/chart/v2/lint/support"
	loader4 "helm.sh/helm/v4/pkg/chart/v2/loader"
	release4 "helm.sh/helm/v4/pkg/release/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files (helm/pgoutbox/testdata/*.golden.yaml, examples/prometheus-alerts.yaml) from what the chart renders; read the diff before committing")

const (
	chartDir = "helm/pgoutbox"
	// The release the tests install: named after the chart, so the objects
	// are pgoutbox-<stream>.
	releaseName = "pgoutbox"
	namespace   = "outbox"
	// kubeVersion is the cluster the tests render for. Without one the
	// libraries assume their build default (1.20), which a real cluster
	// and the helm binary never report.
	kubeVersion = "v1.31.0"
)

// valuesFiles are the values the tests render with, each a case of its
// own; the first is the golden.
var valuesFiles = []string{
	"helm/pgoutbox/testdata/two-streams.yaml",
	"helm/pgoutbox/testdata/secret-sources.yaml",
}

const goldenValues = "helm/pgoutbox/testdata/two-streams.yaml"

// A helm is one Helm library: render renders the chart the way `helm
// template` does (the chart loaded from its directory, the values checked
// against values.schema.json, the objects sorted in install order, no
// cluster), lint lints it as `helm lint --strict`.
type helm struct {
	name   string
	render func(vals map[string]any) (string, error)
	lint   func(vals map[string]any) (problems []string, charts int)
}

var helms = []helm{{"helm3", renderHelm3, lintHelm3}, {"helm4", renderHelm4, lintHelm4}}

func renderHelm3(vals map[string]any) (string, error) {
	ch, err := loader3.Load(chartDir)
	if err != nil {
		return "", err
	}
	in := action3.NewInstall(&action3.Configuration{Log: func(string, ...any) {}})
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.ReleaseName, in.Namespace = releaseName, namespace
	if in.KubeVersion, err = chartutil3.ParseKubeVersion(kubeVersion); err != nil {
		return "", err
	}
	rel, err := in.RunWithContext(context.Background(), ch, vals)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(rel.Manifest) + "\n", nil
}

func renderHelm4(vals map[string]any) (string, error) {
	ch, err := loader4.Load(chartDir)
	if err != nil {
		return "", err
	}
	in := action4.NewInstall(action4.NewConfiguration())
	in.DryRunStrategy, in.Replace = action4.DryRunClient, true
	in.ReleaseName, in.Namespace = releaseName, namespace
	if in.KubeVersion, err = common4.ParseKubeVersion(kubeVersion); err != nil {
		return "", err
	}
	r, err := in.RunWithContext(context.Background(), ch, vals)
	if err != nil {
		return "", err
	}
	rel, ok := r.(*release4.Release)
	if !ok {
		return "", fmt.Errorf("helm 4 returned a %T, not a v1 release", r)
	}
	return strings.TrimSpace(rel.Manifest) + "\n", nil
}

// readValues parses a values file as Helm does (YAML through JSON).
func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return vals
}

// mustRender renders a values file with h, failing the test on an error.
func mustRender(t *testing.T, h helm, path string) string {
	t.Helper()
	out, err := h.render(readValues(t, path))
	if err != nil {
		t.Fatalf("%s: render %s: %v", h.name, path, err)
	}
	return out
}

// TestHelm3AndHelm4RenderTheSame renders every values file with both
// libraries: the chart's claim to work with Helm 3 and 4 is that they
// produce the same documents, byte for byte. (Helm 4 separates the
// documents of one template with a blank line more; that is all.)
func TestHelm3AndHelm4RenderTheSame(t *testing.T) {
	for _, path := range valuesFiles {
		h3, h4 := mustRender(t, helms[0], path), mustRender(t, helms[1], path)
		if d3, d4 := strings.Join(documents(h3), "\n---\n"), strings.Join(documents(h4), "\n---\n"); d3 != d4 {
			t.Errorf("%s: Helm 3 and Helm 4 render differently:\n%s", path, lineDiff(d3, d4))
		}
	}
}

// documents splits a manifest into its YAML documents, each trimmed of
// surrounding blank lines; empty documents are dropped.
func documents(manifest string) []string {
	var docs []string
	for _, d := range docSeparator.Split(manifest, -1) {
		if d = strings.TrimSpace(d); d != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// TestChartRendersTheGolden fails if the chart renders anything else for
// the two-stream values than the committed manifests. After a deliberate
// change: go test -run Golden -update, then read the diff. The golden is
// not its own judge: TestRenderedObjects decodes and checks the same
// rendering.
func TestChartRendersTheGolden(t *testing.T) {
	golden := strings.TrimSuffix(goldenValues, ".yaml") + ".golden.yaml"
	// Helm 3's text; TestHelm3AndHelm4RenderTheSame holds Helm 4 to it.
	got := mustRender(t, helms[0], goldenValues)
	if *update {
		header := "# The manifests the chart renders for two-streams.yaml (release " + releaseName + ", namespace " + namespace + ").\n" +
			"# Rewritten by `go test -run Golden -update` in deploy/; checked by TestChartRendersTheGolden.\n"
		if err := os.WriteFile(golden, []byte(header+got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (create it with -update)", err)
	}
	want := string(data)
	// The header comment is the golden's own; the rest is the output.
	for strings.HasPrefix(want, "#") {
		_, want, _ = strings.Cut(want, "\n")
	}
	if got != want {
		t.Errorf("the chart renders %s differently from %s (go test -run Golden -update rewrites it):\n%s", goldenValues, golden, lineDiff(want, got))
	}
}

// TestChartLintsClean runs Helm's own lint, strict (warnings fail), with
// the chart's defaults and with each values file, in both libraries.
func TestChartLintsClean(t *testing.T) {
	for _, path := range append([]string{""}, valuesFiles...) {
		vals := map[string]any{}
		if path != "" {
			vals = readValues(t, path)
		}
		for _, h := range helms {
			problems, charts := h.lint(vals)
			for _, p := range problems {
				t.Errorf("%s lint (values %q): %s", h.name, path, p)
			}
			if charts != 1 {
				t.Errorf("%s lint (values %q) linted %d charts, want 1", h.name, path, charts)
			}
		}
	}
}

// lintHelm3 is helm lint --strict: the messages above INFO and the errors,
// and how many charts it linted.
func lintHelm3(vals map[string]any) (problems []string, charts int) {
	l := action3.NewLint()
	l.Strict, l.Namespace = true, namespace
	l.KubeVersion, _ = chartutil3.ParseKubeVersion(kubeVersion)
	r := l.Run([]string{chartDir}, vals)
	for _, m := range r.Messages {
		if m.Severity > support3.InfoSev {
			problems = append(problems, m.Error())
		}
	}
	for _, err := range r.Errors {
		problems = append(problems, err.Error())
	}
	return problems, r.TotalChartsLinted
}

// lintHelm4 is lintHelm3 with Helm 4's library.
func lintHelm4(vals map[string]any) (problems []string, charts int) {
	l := action4.NewLint()
	l.Strict, l.Namespace = true, namespace
	l.KubeVersion, _ = common4.ParseKubeVersion(kubeVersion)
	r := l.Run([]string{chartDir}, vals)
	for _, m := range r.Messages {
		if m.Severity > support4.InfoSev {
			problems = append(problems, m.Error())
		}
	}
	for _, err := range r.Errors {
		problems = append(problems, err.Error())
	}
	return problems, r.TotalChartsLinted
}

// lineDiff shows the first lines where want and got differ, with a little
// context: enough to see what changed without a diff tool.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	from := max(0, i-3)
	for j := from; j < i; j++ {
		fmt.Fprintf(&b, "  %4d   %s\n", j+1, w[j])
	}
	for j := i; j < min(len(w), i+8); j++ {
		fmt.Fprintf(&b, "- %4d   %s\n", j+1, w[j])
	}
	for j := i; j < min(len(g), i+8); j++ {
		fmt.Fprintf(&b, "+ %4d   %s\n", j+1, g[j])
	}
	return b.String()
}

// repoPath is a path in the repository, from this module's directory.
func repoPath(p string) string { return filepath.Join("..", p) }
