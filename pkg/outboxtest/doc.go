// Package outboxtest writes outbox workloads to PostgreSQL and checks what
// arrived in Kafka against them: nothing committed missing, nothing rolled
// back present, per key the first deliveries in commit order, and every
// duplicate explained by a restart that had not confirmed its transaction.
//
// It is used by pgoutbox's integration tests, fault suite and benchmarks. It
// does not import Kafka client code: callers hand it what they consumed.
package outboxtest
