#!/usr/bin/env bash
# scripts/demo.sh: pgoutbox end to end on this machine, no Docker needed.
# Starts a throwaway PostgreSQL and Kafka (scripts/testenv.sh), applies the
# outbox migration, runs pgoutbox, writes sample orders in transactions and
# prints the records read back from Kafka; then stops everything.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

bash scripts/testenv.sh install
DIR=$(mktemp -d "${TMPDIR:-/tmp}/pgoutbox-demo.XXXXXX")
RELAY_PID=
cleanup() {
	code=$?
	if [[ -n $RELAY_PID ]] && kill -0 "$RELAY_PID" 2>/dev/null; then
		kill -TERM "$RELAY_PID" 2>/dev/null || true
		wait "$RELAY_PID" 2>/dev/null || true
	fi
	if (( code != 0 )); then
		echo "demo failed; pgoutbox's log:" >&2
		tail -n 40 "$DIR/pgoutbox.log" >&2 2>/dev/null || true
	fi
	bash scripts/testenv.sh down "$DIR" >/dev/null 2>&1 || true
	exit "$code"
}
trap cleanup EXIT
bash scripts/testenv.sh up "$DIR" >/dev/null
# shellcheck disable=SC1091
source "$DIR/env.sh"

echo "== building pgoutbox"
mkdir -p bin
go build -o bin/pgoutbox ./cmd/pgoutbox
go build -o bin/pgoutbox-demo ./cmd/pgoutbox-demo

export PGOUTBOX_POSTGRES_DSN=$PGOUTBOX_TEST_PG_DSN
export PGOUTBOX_KAFKA_BROKERS=$PGOUTBOX_TEST_KAFKA
export PGOUTBOX_LOG_FORMAT=console

echo "== pgoutbox migrate"
bin/pgoutbox migrate
echo "== creating topics (the broker does not auto-create them)"
bin/pgoutbox-demo topics

echo "== starting pgoutbox run (log: $DIR/pgoutbox.log)"
bin/pgoutbox run >"$DIR/pgoutbox.log" 2>&1 &
RELAY_PID=$!

echo "== writing orders and reading them back from Kafka"
bin/pgoutbox-demo orders -n "${DEMO_ORDERS:-20}"

echo "== stopping pgoutbox with SIGTERM"
kill -TERM "$RELAY_PID"
code=0
wait "$RELAY_PID" || code=$?
RELAY_PID=
echo "pgoutbox exited with code $code; its last log lines:"
tail -n 4 "$DIR/pgoutbox.log"
exit "$code"
