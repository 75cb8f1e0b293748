package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestValidateChecksFixedTopics: with router.route.topic, or a table's own
// route.topic, every event of the table goes to that one topic; validate
// said the table "picks its topic through route.topic.replacement", checked
// no topic and passed though the topic did not exist, and gave it no
// durability audit. The topic is checked now like one named with --topics.
func TestValidateChecksFixedTopics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)

	t.Run("router.route.topic", func(t *testing.T) {
		missing := testenv.UniqueName(t, "missing")
		r := invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_ROUTER_ROUTE_TOPIC="+missing))
		if r.code != exitRuntime {
			t.Fatalf("want exit 1:\n%s", r)
		}
		wantLine(t, r, `^FAIL topic `+missing+`: does not exist \(kafka.auto.create.topics is false\)$`)
		noLine(t, r, `none checked`)
	})

	t.Run("a table's route.topic", func(t *testing.T) {
		missing := testenv.UniqueName(t, "missing")
		// routes come from the configuration file only.
		p := filepath.Join(t.TempDir(), "pgoutbox.yaml")
		if err := os.WriteFile(p, []byte("routes:\n  outbox:\n    route.topic: "+missing+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := invoke(cmdValidate, []string{"--config", p}, f.environ(f.dsn))
		if r.code != exitRuntime {
			t.Fatalf("want exit 1:\n%s", r)
		}
		wantLine(t, r, `^FAIL topic `+missing+`: does not exist \(kafka.auto.create.topics is false\)$`)
	})

	t.Run("an existing fixed topic gets the durability audit", func(t *testing.T) {
		topic := testenv.UniqueName(t, "fixed")
		f.env.CreateTopic(t, topic, 2)
		r := invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_ROUTER_ROUTE_TOPIC="+topic))
		wantLine(t, r, `^PASS topic `+topic+`: exists, 2 partition\(s\)$`)
		wantLine(t, r, `^(PASS|WARN|FAIL) topic `+topic+` durability: `)
	})
}
