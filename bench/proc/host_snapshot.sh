#!/usr/bin/env bash
# Host-wide state snapshot, side by side in one run:
#   pstackctl capture --host   (identity, state, wchan of every thread; sealed envelope written)
#   ps -eLo pid,tid,stat,wchan:32,lstart
# over ~THREADS extra idle threads spawned here (in processes of 500 threads).
# Prints the median wall time of each over RUNS alternating runs, and the ratio.
# Usage (root): bench/proc/host_snapshot.sh [THREADS=5000] [RUNS=15]
# VIA=daemon: the capture goes through a pstackd started here (the path of the
# systemd service), instead of pstackctl's one-shot capture; a second pstackd
# with the host caps set to the process caps (max_threads 10000, 64 KiB a
# surface: the daemon before issue 31 item 2) runs in the same rounds.
set -euo pipefail
THREADS=${1:-5000}
RUNS=${2:-15}
cd "$(dirname "$0")/../.."
source bench/proc/common.sh
build_release
VIA=${VIA:-oneshot}
TMP=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
left=$THREADS
while [ "$left" -gt 0 ]; do
    n=$(( left > 500 ? 500 : left ))
    spawn_threads "$n"
    pids+=("$HOLDER_PID")
    left=$(( left - n ))
done
total=$(ps -eLo tid= | wc -l)
echo "threads on host: $total (spawned $THREADS in ${#pids[@]} processes); runs: $RUNS"
export PSTACK_LEAK_JOURNAL=$TMP/leaks.jsonl
socket_args=()
# start_pstackd NAME EXTRA_CAPTURE_TOML: a pstackd on $TMP/NAME.sock.
start_pstackd() {
    local name=$1 extra=$2
    cat >"$TMP/$name.toml" <<EOF2
socket_path = "$TMP/$name.sock"
[spool]
dir = "$TMP/$name-spool"
[capture]
leak_journal = "$TMP/leaks.jsonl"
helper_path = "$BIN/pstack-helper"
digest_key_file = "$TMP/digest.key"
$extra
[ebpf]
enabled = false
EOF2
    "$BIN/pstackd" --config "$TMP/$name.toml" 2>"$TMP/$name.log" &
    pids+=("$!")
    for _ in $(seq 100); do [ -S "$TMP/$name.sock" ] && break; sleep 0.1; done
    [ -S "$TMP/$name.sock" ] || { echo "pstackd did not start:" >&2; cat "$TMP/$name.log" >&2; exit 2; }
}
if [ "$VIA" = daemon ]; then
    cargo build --release -q -p pstack-agent --bin pstackd
    start_pstackd pstackd ""
    start_pstackd before $'host_max_threads = 10000\nhost_max_bytes_per_surface = 65536'
    socket_args=(--socket "$TMP/pstackd.sock")
fi
echo "capture via: $VIA"
# pstackd accepts bundle deadlines up to 30 s.
deadline_ms=60000; [ "$VIA" = daemon ] && deadline_ms=30000
# Through pstackd the daemon's caps apply (a caller may only narrow them).
max_threads=(--max-threads 1000000); [ "$VIA" = daemon ] && max_threads=()
cap() { "$BIN/pstackctl" capture --host "${socket_args[@]}" "${max_threads[@]}" --bundle-deadline-ms "$deadline_ms" -o "$TMP/host.json" >/dev/null; }
cap_before() { "$BIN/pstackctl" capture --host --socket "$TMP/before.sock" --bundle-deadline-ms "$deadline_ms" -o "$TMP/before.json" >/dev/null; }
psrun() { ps -eLo pid,tid,stat,wchan:32,lstart >/dev/null; }
cap; psrun  # warm caches
[ "$VIA" = daemon ] && cap_before
for _ in $(seq "$RUNS"); do
    t0=$(now_ns); psrun; t1=$(now_ns); echo $(( (t1 - t0) / 1000 )) >>"$TMP/ps"
    t0=$(now_ns); cap; t1=$(now_ns); echo $(( (t1 - t0) / 1000 )) >>"$TMP/pstack"
    if [ "$VIA" = daemon ]; then
        t0=$(now_ns); cap_before; t1=$(now_ns); echo $(( (t1 - t0) / 1000 )) >>"$TMP/before"
    fi
done
ps_us=$(median "$TMP/ps")
pstack_us=$(median "$TMP/pstack")
"$BIN/pstackctl" envelope verify "$TMP/host.json" | sed -n '1,3p'
observed=$(python3 -c "import json,sys; e=json.load(open(sys.argv[1])); u=e['universe']; print(u['observed_count'], u['expected_count'], e['completeness'], len(e['surfaces']), 'surfaces')" "$TMP/host.json")
echo "envelope: observed/expected threads, completeness: $observed; size $(stat -c %s "$TMP/host.json") bytes"
printf 'ps -eLo pid,tid,stat,wchan:32,lstart   median %8.1f ms\n' "$(echo "$ps_us/1000" | bc -l)"
printf 'pstackctl capture --host (sealed)      median %8.1f ms\n' "$(echo "$pstack_us/1000" | bc -l)"
printf 'ratio pstackctl/ps: %.2fx (target <= 0.50x)\n' "$(echo "$pstack_us/$ps_us" | bc -l)"
if [ "$VIA" = daemon ]; then
    before_us=$(median "$TMP/before")
    observed=$(python3 -c "import json,sys; e=json.load(open(sys.argv[1])); u=e['universe']; print(u['observed_count'], u['expected_count'], e['completeness'])" "$TMP/before.json")
    echo "before (process caps on a host capture): observed/expected threads, completeness: $observed; size $(stat -c %s "$TMP/before.json") bytes"
    printf 'pstackd with the process caps (before)  median %8.1f ms, ratio %.2fx\n' "$(echo "$before_us/1000" | bc -l)" "$(echo "$before_us/$ps_us" | bc -l)"
fi
