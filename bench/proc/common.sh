# Shared helpers for bench/proc scripts (sourced).
# now_ns: CLOCK_REALTIME ns; median FILE: median of one number per line.
now_ns() { date +%s%N; }
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR%2==1) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
build_release() {
    cargo build --release -q -p pstack-helper --bin pstack-helper
    cargo build --release -q -p pstack-agent --bin pstackctl
    BIN="${CARGO_TARGET_DIR:-$PWD/target}/release"
    [ -x "$BIN/pstackctl" ] && [ -x "$BIN/pstack-helper" ] || { echo "release binaries missing in $BIN" >&2; exit 2; }
}
# spawn_threads N: start a process holding N idle threads; sets HOLDER_PID.
spawn_threads() {
    local py ready
    py=$(python3 -c 'import sys; print(sys.executable)')
    ready=$(mktemp -u)
    "$py" "$(dirname "${BASH_SOURCE[0]}")/threads.py" "$1" "$ready" &
    HOLDER_PID=$!
    while [ ! -s "$ready" ]; do sleep 0.05; done
    rm -f "$ready"
}
