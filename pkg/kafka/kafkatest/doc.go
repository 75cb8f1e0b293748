// Package kafkatest holds Kafka helpers for tests, benchmarks and the demo:
// reading records back, counting them by high-water marks, and deleting
// topics. The relay itself never uses them.
package kafkatest
