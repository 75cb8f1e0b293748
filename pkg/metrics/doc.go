// Package metrics exposes what a pgoutbox relay does as Prometheus metrics,
// and whether it is healthy as HTTP liveness and readiness endpoints.
//
// [Metrics] is a [relay.Observer]: install it with [relay.WithObserver]. It
// registers its metrics, the Go runtime's and the process's on a registry
// the caller owns (never the global default one), and [Metrics.Handler]
// serves
//
//	/metrics  the registry, in the Prometheus text or protobuf format
//	/healthz  200 while the process works (liveness): 503 only when a WAL
//	          session streams and its loop has sent no progress report
//	          for [Config.LiveStaleAfter], which means the loop is stuck
//	/readyz   200 while the relay is streaming and keeping up (readiness),
//	          else 503 with a one-line reason
//	/rolloutz 200 when /readyz is, or for a standby whose last check of
//	          what its takeover needs (Kafka's brokers and credentials,
//	          the dead-letter topic, the event columns) passed within the
//	          last minute: what a rolling update waits for ([Metrics.Available])
//
// [Metrics.PollSlot] adds the replication slot's view from the server (WAL
// retained, wal_status), and [Server] runs the handler with a graceful
// shutdown.
//
// # Readiness
//
// /readyz answers 200 only when all of these hold:
//
//   - a session is streaming: it started and has not ended;
//   - the slot poller has not seen wal_status "lost";
//   - the confirmed LSN advanced within [Config.ReadyStaleAfter], or the
//     last progress report (at most ReadyStaleAfter old) found the relay
//     idle (no transaction open, nothing in flight) with its confirmed LSN
//     at the server's WAL end, give or take 64 KiB, and nothing left to
//     read up to the server's position at its last catalog check. (The
//     WAL end a walsender's keepalives carry is its own: one that sends
//     nothing, waiting for a standby in synchronized_standby_slots,
//     decoding a large transaction or hung, looked caught up by it.)
//
// The second branch is what keeps an idle outbox ready: when nothing is
// written anywhere on the server, the confirmed LSN has nothing to advance
// to. Everything else (records unacknowledged by Kafka, a transaction that
// never ends, progress reports that stopped) turns 503 once the confirmed
// LSN has been stuck for ReadyStaleAfter, with a reason such as
//
//	kafka: 120 records (48213 bytes) unacknowledged for 45s, confirmed LSN stuck at 0/1A2B3C8
//
// # Concurrency
//
// The relay calls the Observer methods from its own goroutine; the HTTP
// handler and the slot poller run on others. All of Metrics' methods are
// safe for concurrent use; the Observer methods take a mutex only for a few
// field updates and never block on I/O.
package metrics
