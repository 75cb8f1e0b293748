// Package testenv is pgoutbox's integration test environment helper: it
// gives tests the PostgreSQL server and Kafka broker that
// scripts/testenv.sh runs, and the chores around them (a fresh database per
// test, topics, reading topics back, stopping and restarting the servers,
// waiting on conditions).
//
// The package is public only because the repository keeps its non-stage
// packages under pkg/; it serves this module's tests and makes no
// compatibility promise.
//
// # Running integration tests
//
// The servers are found through environment variables that
// scripts/testenv.sh writes to its env.sh:
//
//	PGOUTBOX_TEST_ENV_DIR  the environment's directory (needed to stop/start servers)
//	PGOUTBOX_TEST_PG_DSN   postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
//	PGOUTBOX_TEST_PG_PORT  PostgreSQL's port
//	PGOUTBOX_TEST_PG_BIN   PostgreSQL's client programs (pg_recvlogical, psql, ...)
//	PGOUTBOX_TEST_PG_MAJOR the server's major version; tests fail on another
//	PGOUTBOX_TEST_KAFKA    comma-separated brokers, 127.0.0.1:PORT
//	PGOUTBOX_TEST_KAFKA_CLUSTER  the cluster's three brokers, once it was started
//
// and, for TLS and SASL tests ([Env.Security]), the environment's CA
// (PGOUTBOX_TEST_CA), Kafka's SASL_SSL listener and users
// (PGOUTBOX_TEST_KAFKA_SASL_SSL, PGOUTBOX_TEST_KAFKA_SASL_USER and
// _PASSWORD, PGOUTBOX_TEST_KAFKA_LIMITED_USER and _PASSWORD) and
// PostgreSQL's TLS-only role (PGOUTBOX_TEST_PG_SSL_USER and _PASSWORD).
// Kafka runs with ACLs; the PLAINTEXT listener, which every other helper
// uses, is a super user.
//
// `make test` or `scripts/testenv.sh exec -- go test ./...` sets them. Without
// them [Require] skips the test, unless PGOUTBOX_REQUIRE_INTEGRATION=1, when
// it fails it: `make test` sets that, so that a broken environment cannot pass
// as a green run. Each test that gets an [Env] appends a line to the file
// named by PGOUTBOX_INTEGRATION_MARKER, if set, which lets make check that
// integration tests ran at all.
//
// # Sharing the servers
//
// `go test ./...` runs several packages' tests at once against the same two
// servers. Tests that only use them call [Require]; tests that stop, pause or
// restart a server call [RequireExclusive], which waits until no other test
// (in any package) holds the environment and keeps the others out until it
// ends. It also restarts, at the end of the test, whatever the test left
// stopped or paused. Give every database, topic and slot a name of its own
// ([UniqueName], [Env.NewDatabase]): the servers outlive each test.
//
// # The Kafka cluster
//
// Beside the single broker the environment can run a cluster of three
// Kafka nodes (each a broker and a controller) for the tests of
// replication: [RequireCluster] and [RequireClusterExclusive] return it,
// starting it with scripts/testenv.sh cluster-up the first time a test
// process asks (so that environments whose tests never ask do not pay for
// it), or take it from PGOUTBOX_TEST_KAFKA_CLUSTER. Its topics have three
// replicas and min.insync.replicas=2. The cluster has a lock of its own:
// a test that stops, kills or pauses its nodes holds it exclusively and
// shares PostgreSQL and the single broker with the other tests.
//
// # Concurrency
//
// Call an [Env]'s methods and [Eventually] from the test's own goroutine:
// they fail the test with t.Fatal. A [Consumer] collects messages in the
// background and may be read from any goroutine.
package testenv
