#!/usr/bin/env bash
# scripts/debezium/fetch.sh: fetch the conformance suite's oracle (Kafka
# Connect and Debezium's PostgreSQL connector, see pom.xml beside this file)
# with Maven into a cache directory keyed by a hash of the pom, unless it is
# there already, and print that directory. It holds:
#
#   connect/   the Connect worker's class path (java -cp 'connect/*')
#   plugins/   Connect's plugin.path: debezium-connector-postgres/ unpacked
#              from Debezium's own plugin archive
#
# Settings read from the environment:
#   PGOUTBOX_CACHE   cache directory (default ~/.cache/pgoutbox), as
#                    scripts/testenv.sh
set -euo pipefail

log() { printf 'debezium: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
POM=$HERE/pom.xml
HOME_DIR=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
CACHE=${PGOUTBOX_CACHE:-$HOME_DIR/.cache/pgoutbox}

version() {
	sed -n "s:.*<$1>\(.*\)</$1>.*:\1:p" "$POM"
}

sum=$(sha256sum "$POM" | cut -c1-12)
libs=$CACHE/debezium/$(version debezium.version)-$sum
if [[ -f $libs/.complete ]]; then
	printf '%s\n' "$libs"
	exit 0
fi
command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch Kafka Connect and Debezium"
command -v java >/dev/null || die "java (17+) is needed to run Kafka Connect"
log "fetching Kafka Connect $(version kafka.version) and Debezium $(version debezium.version) into $libs"
mkdir -p "$(dirname "$libs")"
tmp=$libs.tmp.$$
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
# Maven runs on a copy of the pom so that its target/ stays out of the
# source tree.
mkdir -p "$tmp/build"
cp "$POM" "$tmp/build/pom.xml"
mvnq() {
	# Maven 3.8 prints colour resets even in batch mode: strip them.
	timeout 900 mvn -q -B -Dstyle.color=never -f "$tmp/build/pom.xml" "$@" 2>&1 | sed $'s/\e\\[[0-9;]*m//g' >&2
}
mvnq dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp/connect" ||
	die "mvn dependency:copy-dependencies failed"
mvnq dependency:unpack@plugin -DoutputDirectory="$tmp/plugins" ||
	die "mvn dependency:unpack@plugin failed"
compgen -G "$tmp/connect/connect-runtime-*.jar" >/dev/null || die "no connect-runtime jar in $tmp/connect"
compgen -G "$tmp/plugins/debezium-connector-postgres/debezium-connector-postgres-*.jar" >/dev/null ||
	die "no debezium-connector-postgres jar in $tmp/plugins"
rm -rf "$tmp/build"
touch "$tmp/.complete"
rm -rf "$libs"
mv "$tmp" "$libs"
trap - EXIT
printf '%s\n' "$libs"
