# Starts service binaries in the background, each logging to $LOG_DIR, and
# stops them (by the PIDs recorded here, never by name) when the sourcing
# script exits. Source it after common.sh, with LOG_DIR set.

mkdir -p "$LOG_DIR"
STARTED_PIDS=()
stop_started_services() {
    for pid in "${STARTED_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    done
}
trap stop_started_services EXIT

# Starts a service binary and waits for /readyz. The label (binary@what)
# names its log, since one binary may run twice.
start_service() {
    local name="$1" ready_url="$2" binary="${1%%@*}"
    shift 2
    step "start $name (log: $LOG_DIR/$name.log)"
    "$ENTREGA_ROOT/target/debug/$binary" "$@" >>"$LOG_DIR/$name.log" 2>&1 9>&- &
    local pid=$!
    STARTED_PIDS+=("$pid")
    for _ in $(seq 1 150); do
        curl -fsS "$ready_url" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$LOG_DIR/$name.log" >&2; die "$name exited"; }
        sleep 0.2
    done
    tail -n 20 "$LOG_DIR/$name.log" >&2
    die "$name was not ready within 30 s"
}
