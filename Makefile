# pgoutbox: `make test` is the full test run (what CI runs after
# `scripts/testenv.sh install`); it needs no Docker. See scripts/testenv.sh.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

GO ?= go
PKGS ?= ./...
GOTESTFLAGS ?= -race -count=1 -timeout 25m
# The environment env-up and env-down act on (make test uses its own).
ENV_DIR ?= $(or $(PGOUTBOX_TEST_ENV_DIR),$(or $(TMPDIR),/tmp)/pgoutbox-testenv-$(shell id -un))

.PHONY: test test-go test-pg test-pg-others test-deploy test-faults test-debezium demo fuzz bench bench-smoke bench-micro bench-debezium bench-scaling bench-writers build vet fmt-check env-up env-down

## test: start PostgreSQL 15 and Kafka (or reuse a healthy $PGOUTBOX_TEST_ENV_DIR), run every test, tear down;
## then test-pg on PostgreSQL 18 (the other versions: make test-pg; CI runs both), and test-deploy
test:
	bash scripts/testenv.sh exec -- $(MAKE) --no-print-directory test-go
	$(MAKE) --no-print-directory test-pg VERSIONS="$(TEST_VERSIONS)"
	$(MAKE) --no-print-directory test-deploy

## test-deploy: the Helm chart and alert rule tests in deploy/ (a module of its own, so the relay's
## module takes no Kubernetes dependencies); offline, no cluster
test-deploy:
	cd deploy && $(GO) test $(GOTESTFLAGS) ./...

# PostgreSQL versions test-pg runs on (scripts/testenv.sh pins their builds),
# and the tests it runs there: the delivery test, the fast fault suite, the
# version-specific tests, and the code that reads pg_replication_slots (not the
# simulated harness: it needs no server, and test-go runs it once). make test
# runs them on TEST_VERSIONS only, the newest, to stay near 20 minutes (each
# version takes 3-4); test-pg-others, which .ci/run runs, covers the rest.
VERSIONS ?= 16 17 18
TEST_VERSIONS ?= 18
OTHER_VERSIONS ?= 16 17
PG_TESTS_RELAY := ^(TestDeliversEveryCommittedEventInCommitOrderPerKey|TestCatalogChangesStopTheRelayLoudly|TestPartitionedOutboxLosesNothing|TestFaults|TestServerIsThePostgresVersionAsked|TestAbortedTransactionsDecodedLateAreSkipped|TestRelayStreamsFromAFailoverSlot|TestFailoverSlotSurvivesAPromotion|TestSlotDroppedWhileStoppedIsNotReplacedSilently|TestSlotAdvancedWhileStoppedIsFatal|TestServerShutdownKeepsTheSlotWithinTheFence|TestDatabaseFastShutdownWithKafkaFrozenIsNotHeldUp|TestHandoverRefusesPendingEventsAPollRelayCannotRelay|TestHandoverWaitsForAsynchronousCommitsToBeFlushed|TestAcceptCatalogRecordsAMembershipPutBack|TestHandoverKeepsThePendingInsertsOfPartitions|TestAllTablesPublicationNeedsPartitionsThroughTheRoot|TestEventColumnsLogicalDecodingOmitsAreRefused)$$
PG_TESTS_CMD := ^(TestStatus|TestValidate|TestMigrateGuard)
PG_TESTS_METRICS := ^(TestMetricsFollowARealRelay|TestPollerReportsALostSlotAsNotReady)$$

## test-pg: for each of VERSIONS (default "16 17 18"), a fresh PostgreSQL of that major version and Kafka,
## the delivery test, the fast fault suite, the version tests and the slot-reading tests; e.g. make test-pg VERSIONS=18
test-pg:
	@for v in $(VERSIONS); do \
		echo "== PostgreSQL $$v"; \
		t0=$$SECONDS; \
		env -u PGOUTBOX_TEST_ENV_DIR PGOUTBOX_PG_MAJOR=$$v bash scripts/testenv.sh exec -- \
			$(MAKE) --no-print-directory test-pg-go || exit 1; \
		echo "== PostgreSQL $$v: passed in $$((SECONDS - t0)) s"; \
	done

## test-pg-others: test-pg on the versions make test leaves out (OTHER_VERSIONS, default "16 17")
test-pg-others:
	$(MAKE) --no-print-directory test-pg VERSIONS="$(OTHER_VERSIONS)"

# test-pg-go: test-pg's tests against the environment in the current shell.
test-pg-go:
	@marker=$$(mktemp "$${TMPDIR:-/tmp}/pgoutbox-integration.XXXXXX"); \
	trap 'rm -f "$$marker"' EXIT; \
	export PGOUTBOX_REQUIRE_INTEGRATION=1 PGOUTBOX_INTEGRATION_MARKER="$$marker"; \
	echo "PostgreSQL $$("$$PGOUTBOX_TEST_PG_BIN/psql" -X -Atc 'SHOW server_version' "$$PGOUTBOX_TEST_PG_DSN") (asked for $$PGOUTBOX_TEST_PG_MAJOR)"; \
	$(GO) test $(GOTESTFLAGS) -run '$(PG_TESTS_RELAY)' ./pkg/relay/; \
	$(GO) test $(GOTESTFLAGS) ./replication/; \
	$(GO) test $(GOTESTFLAGS) -run '$(PG_TESTS_CMD)' ./cmd/pgoutbox/; \
	$(GO) test $(GOTESTFLAGS) -run '$(PG_TESTS_METRICS)' ./pkg/metrics/; \
	if [[ ! -s $$marker ]]; then \
		echo "integration tests did not run" >&2; exit 1; \
	fi; \
	echo "integration tests run on PostgreSQL $$PGOUTBOX_TEST_PG_MAJOR: $$(wc -l <"$$marker")"

# NORACE_TESTS run without the race detector, after the -race run: they
# drive sarama's transactional producer into a state where sarama races with
# itself (see pkg/kafka/txn_fenced_norace_test.go); NORACE_COUNT is how many.
NORACE_TESTS := ^TestFencedProducerClosesPromptlyAndSaysFenced$$
NORACE_COUNT := 1

## test-go: run the tests against the environment in the current shell; fails if no integration test ran
test-go:
	@marker=$$(mktemp "$${TMPDIR:-/tmp}/pgoutbox-integration.XXXXXX"); \
	trap 'rm -f "$$marker"' EXIT; \
	PGOUTBOX_REQUIRE_INTEGRATION=1 PGOUTBOX_INTEGRATION_MARKER="$$marker" \
		$(GO) test $(GOTESTFLAGS) $(PKGS); \
	if [[ ! -s $$marker ]]; then \
		echo "integration tests did not run" >&2; exit 1; \
	fi; \
	echo "integration tests run: $$(wc -l <"$$marker")"; \
	rc=0; out=$$(PGOUTBOX_REQUIRE_INTEGRATION=1 $(GO) test -count=1 -timeout 5m -v -run '$(NORACE_TESTS)' ./pkg/kafka/ 2>&1) || rc=$$?; \
	echo "$$out" | grep -E '^(--- |ok|FAIL|panic)' || true; \
	if [[ $$rc -ne 0 ]]; then echo "$$out" | tail -50 >&2; exit $$rc; fi; \
	if [[ $$(echo "$$out" | grep -c '^--- PASS') -ne $(NORACE_COUNT) ]]; then \
		echo "the tests without the race detector did not all run" >&2; exit 1; \
	fi

## test-faults: the full fault suite (30 relay SIGKILLs, Kafka killed and paused, PostgreSQL restarts,
## Kafka unreachable for 2 minutes, a 200,000-row transaction, SIGTERM; Kafka frozen 90 s and 2 minutes
## with topics new to the session; on the 3-node cluster a rolling restart, leader SIGKILLs, a paused
## broker, a dead first broker), and the poll source's with four instances (30 SIGKILLs, Kafka down
## 2 minutes, SIGTERM), and exactly-once mode's; results in faults-report.md
FAULT_TESTS := ^(TestFaults|TestExactlyOnceFaults|TestKafkaFrozen|TestClusterFaults|TestPollSIGKILLWithFourInstancesLosesNothing|TestPollKafkaDownWithFourInstancesHoldsTheRowsAndRecovers|TestPollSIGTERMWithFourInstancesRepeatsNothing)$$
test-faults:
	@echo "| scenario | events written | verified | lost | out of order | duplicates | wall time | peak RSS |" > faults-report.md
	@echo "|---|---|---|---|---|---|---|---|" >> faults-report.md
	bash scripts/testenv.sh exec -- env PGOUTBOX_FAULTS=full PGOUTBOX_REQUIRE_INTEGRATION=1 \
		PGOUTBOX_FAULTS_REPORT=$(CURDIR)/faults-report.md $(GO) test -count=1 -timeout 150m -run '$(FAULT_TESTS)' -v ./pkg/relay/ \
		| grep -v 'logger.go'
	@cat faults-report.md

## test-debezium: the conformance suite against the real Debezium 3.6.1 on Kafka Connect 4.1.1 (fetched with
## Maven from scripts/debezium/pom.xml) on its own PostgreSQL and Kafka; the table goes to conformance-report.md
test-debezium:
	libs=$$(bash scripts/debezium/fetch.sh); \
	bash scripts/testenv.sh exec -- env PGOUTBOX_DEBEZIUM_LIBS="$$libs" PGOUTBOX_REQUIRE_INTEGRATION=1 PGOUTBOX_REQUIRE_DEBEZIUM=1 \
		PGOUTBOX_CONFORMANCE_REPORT=$(CURDIR)/conformance-report.md \
		$(GO) test -race -count=1 -timeout 20m -run '^(TestMatchesDebezium|TestMigratesInPlaceFromDebezium)$$' -v ./pkg/conformance/
	@cat conformance-report.md

## demo: start PostgreSQL and Kafka locally, run pgoutbox, write orders and print the records from Kafka
demo:
	bash scripts/demo.sh

## fuzz: the deterministic relay harness over SIMSEEDS seeds (default 100000), then every fuzzer for
## FUZZTIME each (default 60s; FUZZFLAGS=-parallel=1 to leave cores free); the seed corpora and 2000 seeds run in make test too
FUZZTIME ?= 60s
FUZZFLAGS ?=
FUZZERS := ./checkpoint:FuzzTrackerMatchesModel ./replication:FuzzDecode ./router:FuzzRoute ./router:FuzzExpandJSON \
	./router:FuzzJSONEncoding ./cmd/pgoutbox:FuzzLoadConfig ./pkg/outbox:FuzzMessageJSONRoundTrip
SIMSEEDS ?= 100000
fuzz:
	@echo "== the deterministic relay harness, $(SIMSEEDS) seeds from 10001"
	$(GO) test -count=1 -timeout 60m -run '^TestSimulatedRelayKeepsItsInvariants$$' ./pkg/relay/ \
		-sim.first=10001 -sim.seeds=$(SIMSEEDS) -sim.duration=45m
	@for f in $(FUZZERS); do \
		pkg=$${f%%:*}; name=$${f##*:}; \
		echo "== $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $(FUZZFLAGS) $$pkg || exit 1; \
	done

BENCHFLAGS ?=

## bench: benchmark on its own PostgreSQL and Kafka (catch-up vs pg_recvlogical, latency at 1k/5k/20k events/s, the poll source,
## resources, micro-benchmarks) into bench-results/; shorten with e.g. BENCHFLAGS='--events 50000 --duration 20s'
bench:
	bash scripts/bench.sh --exactly-once $(BENCHFLAGS)

## bench-smoke: check the benchmark harness end to end in under a minute (the numbers mean nothing);
## the Debezium side by side: make bench-debezium BENCHFLAGS=--smoke
bench-smoke:
	bash scripts/bench.sh --smoke --scenarios catchup,latency,poll,micro,scaling,writers $(BENCHFLAGS)

## bench-debezium: side by side with Debezium 3.6.1 on Kafka Connect 4.1.1 (fetched with Maven): the same
## backlogs drained by pg_recvlogical, Debezium and pgoutbox, latency at 1,000 events/s beside Debezium at its
## defaults and with poll.interval.ms=10 (both at once, and with the short poll each alone), two runs in alternating
## order (about 20 minutes), into bench-results/debezium/
bench-debezium:
	bash scripts/bench.sh --scenarios debezium --out bench-results/debezium $(BENCHFLAGS)

## bench-scaling: catch-up throughput and memory against payload size, transaction size and number of topics,
## into bench-results/scaling/
bench-scaling:
	bash scripts/bench.sh --scenarios scaling --out bench-results/scaling $(BENCHFLAGS)

## bench-writers: the writers' transactions/s: a business insert alone, plus an outbox row, plus the row deleted
## in the same transaction, plus pg_logical_emit_message instead (4 clients, fsync off and on), into
## bench-results/writers/
bench-writers:
	bash scripts/bench.sh --scenarios writers --out bench-results/writers $(BENCHFLAGS)

## bench-micro: only the Go micro-benchmarks of the hot paths
bench-micro:
	$(GO) test -run='^$$' -bench=. -benchmem ./checkpoint ./router ./replication ./pkg/kafka ./pkg/relay

## build: build the pgoutbox binary into bin/
build:
	$(GO) build -o bin/pgoutbox ./cmd/pgoutbox

vet:
	$(GO) vet $(PKGS)

## fmt-check: fail if any Go file is not gofmt-formatted
fmt-check:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	if [[ -n $$out ]]; then echo "not gofmt-formatted:" >&2; echo "$$out" >&2; exit 1; fi

## env-up: start (or restart) a long-lived environment in $(ENV_DIR); then `source $(ENV_DIR)/env.sh`
env-up:
	bash scripts/testenv.sh install
	bash scripts/testenv.sh up $(ENV_DIR)
	@echo "now: source $(ENV_DIR)/env.sh && make test-go   (or go test ./...)"

## env-down: stop the environment in $(ENV_DIR) and remove it (KEEP=1 keeps the directory)
env-down:
	bash scripts/testenv.sh down $(ENV_DIR)
