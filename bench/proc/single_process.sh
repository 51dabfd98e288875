#!/usr/bin/env bash
# Single-process capture of a THREADS-thread process: wall time and peak RSS
# of `pstackctl capture --pid` (peak RSS as reported by /usr/bin/time: the max
# over pstackctl and its helper), side by side with the shell equivalent of
# what it reads (ps + cat of every thread's stack, syscall and wchan), and ps alone.
# Usage (root): bench/proc/single_process.sh [THREADS=1000] [RUNS=10]
set -euo pipefail
THREADS=${1:-1000}
RUNS=${2:-10}
cd "$(dirname "$0")/../.."
source bench/proc/common.sh
build_release
TMP=$(mktemp -d)
spawn_threads "$THREADS"
trap 'kill $HOLDER_PID 2>/dev/null || true; rm -rf "$TMP"' EXIT
P=$HOLDER_PID
echo "subject pid $P with $(ls /proc/$P/task | wc -l) threads; runs: $RUNS"
export PSTACK_LEAK_JOURNAL=$TMP/leaks.jsonl
cap() { /usr/bin/time -f '%M' -o "$TMP/rss1" "$BIN/pstackctl" capture --pid "$P" -o "$TMP/p.json" --bundle-deadline-ms 60000 >/dev/null; cat "$TMP/rss1" >>"$TMP/rss"; }
psonly() { ps -Lo pid,tid,stat,wchan:32,lstart -p "$P" >/dev/null; }
shell() { ps -Lo pid,tid,stat,wchan:32,lstart -p "$P" >/dev/null; for t in /proc/$P/task/*; do cat "$t/stack" "$t/syscall" "$t/wchan" >/dev/null; done; }
cap; shell
: >"$TMP/rss"
for _ in $(seq "$RUNS"); do
    t0=$(now_ns); shell; t1=$(now_ns); echo $(( (t1 - t0) / 1000 )) >>"$TMP/shell"
    t0=$(now_ns); psonly; t1=$(now_ns); echo $(( (t1 - t0) / 1000 )) >>"$TMP/ps"
    t0=$(now_ns); cap; t1=$(now_ns); echo $(( (t1 - t0) / 1000 )) >>"$TMP/pstack"
done
"$BIN/pstackctl" envelope verify "$TMP/p.json" | sed -n '1,4p'
echo "envelope size $(stat -c %s "$TMP/p.json") bytes"
printf 'shell (ps -L + cat stack/syscall/wchan per thread) median %8.1f ms\n' "$(echo "$(median "$TMP/shell")/1000" | bc -l)"
printf 'pstackctl capture --pid (sealed)                   median %8.1f ms\n' "$(echo "$(median "$TMP/pstack")/1000" | bc -l)"
printf 'ps -Lo pid,tid,stat,wchan:32,lstart -p P (state+wchan only) median %8.1f ms\n' "$(echo "$(median "$TMP/ps")/1000" | bc -l)"
printf 'ratio pstackctl/ps-only: %.2fx (pstackctl also reads stack, syscall, schedstat, status, cmdline, environ, fds and seals)\n' "$(echo "$(median "$TMP/pstack")/$(median "$TMP/ps")" | bc -l)"
printf 'ratio pstackctl/shell: %.2fx\n' "$(echo "$(median "$TMP/pstack")/$(median "$TMP/shell")" | bc -l)"
echo "peak RSS pstackctl (max over runs): $(sort -n "$TMP/rss" | tail -1) KiB"
