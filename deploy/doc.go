// Package deploy holds the tests of pgoutbox's Kubernetes deployment: the
// Helm chart in helm/pgoutbox and its alert rules (also in
// examples/prometheus-alerts.yaml). It is a module of its own so that the
// relay's module takes no Kubernetes, Helm or Prometheus server
// dependencies; it imports the relay's module (through a replace directive)
// only for the metric names pgoutbox registers.
//
// The tests run offline: they render the chart with the Helm 3 and Helm 4
// libraries, decode every object strictly into the Kubernetes API types,
// load each stream's configuration with pgoutbox itself, and parse the
// alert rules as promtool does. Run them with
//
//	cd deploy && go test -race -count=1 ./...
//
// and rewrite the golden files after a deliberate change with
//
//	cd deploy && go test -run Golden -update ./...
//
// then read the diff.
package deploy
