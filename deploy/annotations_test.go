package deploy

import (
	"reflect"
	"testing"
)

// TestPodAnnotationsPerStreamRollOneStream: the chart cannot see what a
// Secret holds (postgres.dsnSecret, connector.secret), so a changed one
// reaches only the pod that restarts next. A value the user changes after
// it, in podAnnotations (every stream) or streams[].podAnnotations (one
// stream, merged over it), goes on the pod template and rolls both pods of
// that stream, and only those.
func TestPodAnnotationsPerStreamRollOneStream(t *testing.T) {
	const revision = "pgoutbox.io/secrets-revision"
	render := func(ordersRevision string) objects {
		vals := readValues(t, goldenValues)
		vals["podAnnotations"] = map[string]any{"example.com/team": "outbox", revision: "1"}
		vals["streams"].([]any)[0].(map[string]any)["podAnnotations"] = map[string]any{revision: ordersRevision}
		out, err := helms[0].render(vals)
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		return decode(t, out)
	}
	before, after := render("2"), render("3")
	orders := findNamed(t, before.deployments, releaseName+"-orders").Spec.Template.Annotations
	payments := findNamed(t, before.deployments, releaseName+"-payments").Spec.Template.Annotations
	if orders[revision] != "2" || orders["example.com/team"] != "outbox" || orders["checksum/config"] == "" {
		t.Errorf("orders' pods: annotations %v, want %s 2 (the stream's), example.com/team (the release's) and checksum/config", orders, revision)
	}
	if payments[revision] != "1" || payments["example.com/team"] != "outbox" {
		t.Errorf("payments' pods: annotations %v, want the release's %s 1 and example.com/team", payments, revision)
	}
	for _, tc := range []struct {
		name string
		roll bool
	}{{releaseName + "-orders", true}, {releaseName + "-payments", false}} {
		a := findNamed(t, before.deployments, tc.name).Spec.Template
		b := findNamed(t, after.deployments, tc.name).Spec.Template
		if rolled := !reflect.DeepEqual(a, b); rolled != tc.roll {
			t.Errorf("%s: a changed streams[0].podAnnotations changes its pod template: %v, want %v", tc.name, rolled, tc.roll)
		}
	}
}
