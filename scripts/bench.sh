#!/usr/bin/env bash
# scripts/bench.sh: pgoutbox's benchmark. Brings up its own PostgreSQL 15 and
# Kafka (scripts/testenv.sh up, into a temporary directory), builds
# bin/pgoutbox and cmd/pgoutbox-bench, runs the benchmark, and tears the
# environment down again.
#
# Usage: scripts/bench.sh [pgoutbox-bench flags]
#
#   scripts/bench.sh                      the full run (200,000 events per catch-up shape,
#                                         1,000/5,000/20,000 events/s for 60 s each, micro-benchmarks)
#   scripts/bench.sh --smoke              a quick check of the harness (about a minute)
#   scripts/bench.sh --events 50000 --rates 1000,5000 --duration 20s
#   scripts/bench.sh --scenarios latency --pgoutbox-env PGOUTBOX_KAFKA_FLUSH_FREQUENCY=5ms
#   scripts/bench.sh --scenarios debezium side by side with Debezium on Kafka Connect (the jars
#                                         are fetched with scripts/debezium/fetch.sh unless
#                                         --debezium-libs is given)
#   scripts/bench.sh --scenarios scaling  throughput and memory against payload size,
#                                         transaction size and number of topics
#   scripts/bench.sh --scenarios writers  the writers' transactions/s in each outbox mode
#
# `go run ./cmd/pgoutbox-bench -h` lists every flag. Results go to
# bench-results/ (--out): results.json, summary.md, latency.png, and the
# pgoutbox logs in logs/.
#
# Settings read from the environment:
#   BENCH_ENV_DIR   use the test environment in this directory (started if
#                   needed) and leave it running afterwards, instead of a
#                   temporary one
#   GO              the go command (default go)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GO=${GO:-go}
cd "$ROOT"

log() { printf 'bench: %s\n' "$*" >&2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pgoutbox-bench.XXXXXX")
chmod 755 "$WORK" # the PostgreSQL user must reach the environment inside it
ENV_DIR=${BENCH_ENV_DIR:-}
OWN_ENV=0
if [[ -z $ENV_DIR ]]; then
	ENV_DIR=$WORK/env
	OWN_ENV=1
fi

RC=0
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$?
	((RC != 0)) || RC=$rc
	if ((OWN_ENV)) && [[ -f $ENV_DIR/.pgoutbox-testenv ]]; then
		if ((RC != 0)); then
			bash scripts/testenv.sh logs "$ENV_DIR" || true
		fi
		bash scripts/testenv.sh down "$ENV_DIR" || true
	fi
	rm -rf -- "$WORK"
	exit "$RC"
}
trap cleanup EXIT
trap 'RC=130; exit 130' INT
trap 'RC=143; exit 143' TERM

bash scripts/testenv.sh install
# The debezium scenario needs Kafka Connect's and Debezium's jars.
EXTRA=()
if [[ " $* " =~ [\ ,=]debezium[\ ,] && ! " $* " =~ \ --debezium-libs ]]; then
	log "fetching Kafka Connect and Debezium (cached)"
	EXTRA+=(--debezium-libs "$(bash scripts/debezium/fetch.sh)")
fi
# Build while nothing else runs yet.
log "building bin/pgoutbox and the benchmark"
mkdir -p bin
# pgoutbox is built as the Dockerfile ships it: a static binary without
# symbol tables (a cgo build maps libc as well: about 1.3 MB more RSS).
CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o bin/pgoutbox ./cmd/pgoutbox
"$GO" build -o "$WORK/pgoutbox-bench" ./cmd/pgoutbox-bench

log "starting PostgreSQL and Kafka in $ENV_DIR"
bash scripts/testenv.sh up "$ENV_DIR" >/dev/null
# shellcheck source=/dev/null
source "$ENV_DIR/env.sh"

# The broker's process, whose CPU time each drain reports.
KAFKA_PID=$(cat "$ENV_DIR/kafka/kafka.pid" 2>/dev/null || echo 0)
"$WORK/pgoutbox-bench" --pgoutbox "$ROOT/bin/pgoutbox" --repo "$ROOT" \
	--pg-dsn "$PGOUTBOX_TEST_PG_DSN" --pg-bin "$PGOUTBOX_TEST_PG_BIN" --kafka "$PGOUTBOX_TEST_KAFKA" \
	--kafka-pid "$KAFKA_PID" "${EXTRA[@]}" "$@" || RC=$?
exit "$RC"
