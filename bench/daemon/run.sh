#!/usr/bin/env bash
# pstackd benchmarks, one run, side by side:
#   1. idle footprint of pstackd: RSS and CPU over 60 s (targets: <= 20 MiB, <= 0.1 %);
#   2. capture latency of one process: through the daemon's socket vs one-shot
#      `pstackctl capture` (a new process per capture, the no-daemon path), and the
#      socket overhead per capture = socket wall time - the supervisor's own time
#      (the envelope's clock.monotonic_end_ns - monotonic_start_ns) (target <= 2 ms).
#
# Usage (root): bench/daemon/run.sh [IDLE_SECONDS=60] [CAPTURES=50]   (NO_BUILD=1 uses existing release binaries)
# Needs: python3 (socket client loop), a release build (done here).
set -euo pipefail
cd "$(dirname "$0")/../.."
IDLE=${1:-60}
N=${2:-50}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${NO_BUILD:-}" ]; then
    cargo build --release -q -p pstack-agent --bin pstackd --bin pstackctl
    cargo build --release -q -p pstack-helper --bin pstack-helper
fi
BIN=$CARGO_TARGET_DIR/release
WORK=$(mktemp -d /var/tmp/pstackd-bench.XXXXXX)
DPID=; TPID=
start_daemon() { # $1 = spool dir, $2 = tag
    cat > "$WORK/pstackd-$2.toml" <<TOML
socket_path = "$WORK/pstackd-$2.sock"
group = "nogroup"
max_concurrent_captures = 4
[spool]
dir = "$1"
[capture]
leak_journal = "$WORK/leaks-$2.jsonl"
helper_path = "$BIN/pstack-helper"
TOML
    PSTACKD_LOG=warn "$BIN/pstackd" --config "$WORK/pstackd-$2.toml" 2>"$WORK/pstackd-$2.log" &
    DPID=$!
    SOCK=$WORK/pstackd-$2.sock
    for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
}
SHM=$(mktemp -d /dev/shm/pstackd-bench.XXXXXX)
trap 'kill $DPID $TPID 2>/dev/null || true; rm -rf "$WORK" "$SHM"' EXIT
start_daemon "$WORK/spool" disk
echo "spool on $(df --output=fstype "$WORK" | tail -1) ($WORK); socket $SOCK"
sleep 2

# 1. Idle footprint.
ticks() { awk '{print $14+$15}' "/proc/$DPID/stat"; }
HZ=$(getconf CLK_TCK)
t0=$(ticks); s0=$(date +%s%N)
sleep "$IDLE"
t1=$(ticks); s1=$(date +%s%N)
rss_kib=$(awk '/^VmRSS:/{print $2}' "/proc/$DPID/status")
hwm_kib=$(awk '/^VmHWM:/{print $2}' "/proc/$DPID/status")
threads=$(awk '/^Threads:/{print $2}' "/proc/$DPID/status")
python3 - "$t0" "$t1" "$s0" "$s1" "$HZ" "$rss_kib" "$hwm_kib" "$threads" <<'PY'
import sys
t0, t1, s0, s1, hz, rss, hwm, th = map(int, sys.argv[1:])
wall = (s1 - s0) / 1e9
cpu = (t1 - t0) / hz
print(f"idle over {wall:.1f} s: CPU {cpu:.2f} s = {100*cpu/wall:.3f} %  (target <= 0.1 %)")
print(f"idle RSS {rss/1024:.1f} MiB (peak {hwm/1024:.1f} MiB), {th} threads  (target <= 20 MiB)")
PY

# 2. Capture latency: socket vs one-shot, same subject, same deadlines.
sleep 600 & TPID=$!
latency() { # $1 = label
echo "== $1"
python3 - "$SOCK" "$TPID" "$N" "$BIN/pstackctl" "$BIN/pstack-helper" "$WORK" <<'PY'
import json, os, socket, statistics, subprocess, sys, time
sock_path, pid, n, ctl, helper, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
body = json.dumps({"subject": {"pid": pid}, "deadlines": {"surface_ms": 2000, "bundle_ms": 10000}}).encode()
req = (b"POST /v1/captures HTTP/1.1\r\nHost: pstackd\r\nConnection: close\r\nContent-Type: application/json\r\n"
       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

def via_socket():
    t = time.monotonic_ns()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path); s.sendall(req)
    chunks = []
    while True:
        c = s.recv(65536)
        if not c: break
        chunks.append(c)
    s.close()
    wall = time.monotonic_ns() - t
    raw = b"".join(chunks)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    env = json.loads(payload)
    inner = int(env["clock"]["monotonic_end_ns"]) - int(env["clock"]["monotonic_start_ns"])
    return wall, inner

def one_shot():
    t = time.monotonic_ns()
    subprocess.run([ctl, "capture", "--pid", str(pid), "-o", os.path.join(work, "oneshot.json"),
                    "--leak-journal", os.path.join(work, "oneshot-leaks.jsonl"), "--helper", helper,
                    "--json"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, PSTACKD_SOCKET="/nonexistent/pstackd.sock"))  # one-shot: no daemon there
    return time.monotonic_ns() - t

for _ in range(5): via_socket(); one_shot()   # warm up
sock = [via_socket() for _ in range(n)]
once = [one_shot() for _ in range(n)]
ms = lambda ns: ns / 1e6
walls = [w for w, _ in sock]; inners = [i for _, i in sock]; over = [w - i for w, i in sock]
def p(xs, q): xs = sorted(xs); return xs[min(len(xs)-1, int(q*len(xs)))]
print(f"capture of one process, {n} each (ms)        median     p95")
print(f"  through the socket (wall)                {ms(statistics.median(walls)):8.2f} {ms(p(walls,.95)):8.2f}")
print(f"  one-shot pstackctl capture (wall)        {ms(statistics.median(once)):8.2f} {ms(p(once,.95)):8.2f}")
print(f"  supervisor time inside the envelope      {ms(statistics.median(inners)):8.2f} {ms(p(inners,.95)):8.2f}")
print(f"  socket overhead (wall - supervisor)      {ms(statistics.median(over)):8.2f} {ms(p(over,.95)):8.2f}   (target <= 2 ms)")
print(f"  ratio one-shot / socket (median)         {statistics.median(once)/statistics.median(walls):8.2f}x")
PY
}
latency "durable spool on disk (file fsync + rename + directory fsync per capture)"
kill $DPID; wait $DPID 2>/dev/null || true
start_daemon "$SHM/spool" shm
latency "spool on tmpfs (fsync is free: the HTTP-over-Unix-socket overhead alone)"
