package deploy

import (
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// A row reaches pgoutbox as one pgoutput message and is decoded whole
// before any size check, so the memory limit must carry the largest row,
// not only the streaming peak (measuredPeakRSS). A reviewer measured, on
// one machine with GOMEMLIMIT=102MiB, a 48 MB payload peaking at 112 MiB
// RSS and a 64 MB one at 145 MiB; rowNeed, 2.3 times the payload plus a
// 30 MiB base, lies above both.
const (
	// statedRowPayload is the payload the chart README says the default
	// limit carries.
	statedRowPayload = 160_000_000
	rowBase          = 30 << 20
)

func rowNeed(payload int64) int64 { return payload*23/10 + rowBase }

// TestDefaultMemoryLimitCarriesTheStatedRow: the GOMEMLIMIT the chart sets
// from its default limit is at least what a row of the payload the chart
// README states needs, and the measurements the estimate rests on are
// below it. With the former 128Mi (GOMEMLIMIT 102MiB) a 64 MB payload
// OOM-killed the streaming pod and then its standby.
func TestDefaultMemoryLimitCarriesTheStatedRow(t *testing.T) {
	for _, m := range []struct{ payload, peakRSS int64 }{{48_000_000, 112 << 20}, {64_000_000, 145 << 20}} {
		if rowNeed(m.payload) < m.peakRSS {
			t.Errorf("rowNeed(%d) = %d is below the measured peak %d", m.payload, rowNeed(m.payload), m.peakRSS)
		}
	}
	// The golden's orders stream takes the chart's default resources.
	if _, own := readValues(t, goldenValues)["streams"].([]any)[0].(map[string]any)["resources"]; own {
		t.Fatal("the golden's first stream has resources of its own")
	}
	d := findNamed(t, decode(t, mustRender(t, helms[0], goldenValues)).deployments, releaseName+"-orders")
	c := d.Spec.Template.Spec.Containers[0]
	var goMemLimit string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			goMemLimit = e.Value
		}
	}
	q, err := resource.ParseQuantity(strings.TrimSuffix(goMemLimit, "B"))
	if err != nil {
		t.Fatalf("GOMEMLIMIT %q: %v", goMemLimit, err)
	}
	if need := rowNeed(statedRowPayload); q.Value() < need {
		t.Errorf("the default memory limit %s (GOMEMLIMIT %s) is below the %d bytes a row with a %d MB payload needs", c.Resources.Limits.Memory(), goMemLimit, need, statedRowPayload/1_000_000)
	}
	readme, err := os.ReadFile(chartDir + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "| 512Mi (default) | 409MiB | 160 MB |"; !strings.Contains(string(readme), want) || c.Resources.Limits.Memory().String() != "512Mi" {
		t.Errorf("the chart README's sizing does not state %q for the default limit %s", want, c.Resources.Limits.Memory())
	}
}
