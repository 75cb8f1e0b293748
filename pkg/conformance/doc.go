// Package conformance holds pgoutbox's conformance suite against the real
// Debezium: Kafka Connect (the Kafka version of the test broker) in
// standalone mode running Debezium's PostgreSQL connector with the Outbox
// Event Router, beside the pgoutbox binary run with the same connector JSON
// (`pgoutbox run --connector`), both reading the same rows, each from its
// own replication slot copied from one slot so that both start at the same
// LSN.
//
// For each configuration (converters, payload expansion with and without
// errors.tolerance=all, additional placements, tombstones, custom routing,
// extended headers, the timestamp column, schema version and tracing, the
// header converter, a NULL event id) every record is compared per event id:
// topic, partition, key bytes, value bytes, headers (names, order, bytes),
// timestamp type (and timestamp where it comes from a column), count and
// order within each partition. The results are printed as a table.
//
// The suite needs the test environment (scripts/testenv.sh) and Debezium's
// jars (scripts/debezium/fetch.sh); `make test-debezium` provides both.
// Without them the test skips. The package has no non-test code.
package conformance
