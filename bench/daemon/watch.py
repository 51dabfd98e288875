#!/usr/bin/env python3
"""pstackd watch rules, measured side by side in one run (root, release build):

1. idle footprint: pstackd with every rule kind armed (d_state at its
   default min_seconds = 10, so scanned every 2 s) and the flight recorder
   holding ~1,000 flows (500 loopback connections on a watched port, both
   ends) vs pstackd with no rules, same machine, same 30 s: RSS, CPU, ratio;
2. fault -> sealed latency, p50 / p99, read from the daemon's own
   `captured` events (`fault_to_sealed_ms`): for `d_state` the fault instant
   is when the task had been in D for min_seconds (the earliest the rule can
   be true), for `tcp_reset` the kernel's timestamp of the RST.

Usage: bench/daemon/watch.sh [IDLE_SECONDS=30] [D_STATE_RUNS=20] [RESETS=100]
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

BIN = sys.argv[1]
IDLE = int(sys.argv[2]) if len(sys.argv) > 2 else 30
D_RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
RESETS = int(sys.argv[4]) if len(sys.argv) > 4 else 100
HZ = os.sysconf("SC_CLK_TCK")
FREEZER = "/sys/fs/cgroup/freezer"

work = tempfile.mkdtemp(prefix="pstackd-watch-bench.", dir="/var/tmp")
daemons = []

RULES = """
[[watch]]
name = "d-state"
kind = "d_state"
min_seconds = 10
window = "0"
max_per_subject_per_hour = 1
max_per_hour = 3600
[[watch]]
name = "resets"
kind = "tcp_reset"
ports = "15000-15010"
max_per_subject_per_hour = 1
max_per_hour = 3600
[[watch]]
name = "rtos"
kind = "tcp_rto"
ports = "15000-15010"
[[watch]]
name = "listen"
kind = "listen_overflow"
threshold_per_second = 1000000
[[watch]]
name = "retrans"
kind = "retransmit_rate"
threshold_per_second = 1000000
"""


def start(tag, rules):
    sock = f"{work}/{tag}.sock"
    cfg = f"{work}/{tag}.toml"
    with open(cfg, "w") as f:
        f.write(f'socket_path = "{sock}"\ngroup = "nogroup"\n{rules}\n'
                f'[spool]\ndir = "{work}/spool-{tag}"\n'
                f'[capture]\nleak_journal = "{work}/leaks-{tag}.jsonl"\n'
                f'helper_path = "{BIN}/pstack-helper"\ndigest_key_file = "{work}/key-{tag}"\n')
    p = subprocess.Popen([f"{BIN}/pstackd", "--config", cfg],
                         env=dict(os.environ, PSTACKD_LOG="warn"),
                         stderr=open(f"{work}/{tag}.log", "w"))
    daemons.append(p)
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    return p, sock


def get(sock, path, timeout=5.0):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    except socket.timeout:
        pass
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        out, rest = b"", body
        while rest:
            line, _, rest = rest.partition(b"\r\n")
            if not line.strip():
                continue
            n = int(line.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return body


def events(sock):
    body = get(sock, "/v1/watch/events", timeout=0.5)
    return [json.loads(l) for l in body.splitlines() if l.strip()]


def usage(pid):
    with open(f"/proc/{pid}/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    ticks = int(st[11]) + int(st[12])
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return ticks, rss


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


try:
    plain, plain_sock = start("plain", "")
    watch, watch_sock = start("watch", RULES)
    deadline = time.time() + 20
    while time.time() < deadline:
        st = json.loads(get(watch_sock, "/v1/watch"))
        if st["rules"] and all(r["state"] == "armed" for r in st["rules"]):
            break
        time.sleep(0.2)
    print("rules:", ", ".join(f'{r["name"]}={r["state"]}' for r in st["rules"]))

    # ~1,000 flows: 500 loopback connections to a watched port (both ends are flows).
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 15000))
    srv.listen(1024)
    held = []
    accepted = []
    threading.Thread(target=lambda: [accepted.append(srv.accept()[0]) for _ in range(500)],
                     daemon=True).start()
    for _ in range(500):
        held.append(socket.create_connection(("127.0.0.1", 15000)))
    time.sleep(2)
    flows = json.loads(get(watch_sock, "/v1/watch"))["flight_recorder"]["stats"]["flows"]

    t0 = {p.pid: usage(p.pid)[0] for p in (plain, watch)}
    w0 = time.time()
    time.sleep(IDLE)
    wall = time.time() - w0
    res = {}
    for name, p in (("no rules", plain), ("all rules armed", watch)):
        ticks, rss = usage(p.pid)
        res[name] = ((ticks - t0[p.pid]) / HZ / wall * 100, rss / 1024)
    print(f"\nidle over {wall:.0f} s, flight recorder holding {flows} flows:")
    print(f"{'pstackd':<18} {'CPU %':>8} {'RSS MiB':>8}")
    for name, (cpu, rss) in res.items():
        print(f"{name:<18} {cpu:8.3f} {rss:8.1f}")
    (c0, r0), (c1, r1) = res["no rules"], res["all rules armed"]
    print(f"{'ratio':<18} {c1 / c0 if c0 else float('inf'):8.2f}x {r1 / r0:7.2f}x")
    for s in held + accepted:
        s.close()
    # Latency runs on a daemon whose d_state rule has min_seconds = 1 (the
    # idle one keeps the default 10, which scans every 2 s).
    watch.send_signal(signal.SIGTERM)
    watch.wait(10)
    watch, watch_sock = start("lat", RULES.replace("min_seconds = 10", "min_seconds = 1"))
    deadline = time.time() + 20
    while time.time() < deadline:
        rs = json.loads(get(watch_sock, "/v1/watch"))["rules"]
        if rs and all(r["state"] == "armed" for r in rs):
            break
        time.sleep(0.2)

    # d_state: a new sleeper frozen per run; wait for its capture; thaw.
    d_lat = []
    for i in range(D_RUNS):
        cg = f"{FREEZER}/pstack-watch-bench-{os.getpid()}-{i}"
        os.mkdir(cg)
        sl = subprocess.Popen(["sleep", "600"])
        with open(f"{cg}/cgroup.procs", "w") as f:
            f.write(str(sl.pid))
        with open(f"{cg}/freezer.state", "w") as f:
            f.write("FROZEN")
        deadline = time.time() + 15
        got = None
        while time.time() < deadline and got is None:
            for e in events(watch_sock):
                if e.get("event") == "captured" and e.get("subject", "").startswith(f"process:{sl.pid}:"):
                    got = e["fault_to_sealed_ms"]
            time.sleep(0.1)
        with open(f"{cg}/freezer.state", "w") as f:
            f.write("THAWED")
        sl.kill()
        sl.wait()
        os.rmdir(cg)
        if got is not None:
            d_lat.append(got)
    # tcp_reset: RESETS connections to a watched port, each reset by the server.
    srv2 = socket.socket()
    srv2.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv2.bind(("127.0.0.1", 15001))
    srv2.listen(128)

    def resetter():
        for _ in range(RESETS):
            c = srv2.accept()[0]
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()
    threading.Thread(target=resetter, daemon=True).start()
    for _ in range(RESETS):
        try:
            c = socket.create_connection(("127.0.0.1", 15001))
            c.recv(1)
        except OSError:
            pass
        time.sleep(0.1)  # below the 4 capture slots' turnover: nothing suppressed as busy
    time.sleep(3)
    r_lat = [e["fault_to_sealed_ms"] for e in events(watch_sock)
             if e.get("event") == "captured" and e.get("rule") == "resets"]
    st = json.loads(get(watch_sock, "/v1/watch"))
    resets = next(r for r in st["rules"] if r["name"] == "resets")
    print(f"\nfault -> sealed (ms), from pstackd's own events:")
    print(f"{'rule':<10} {'n':>4} {'p50':>6} {'p99':>6} {'max':>6}")
    for name, xs in (("d_state", d_lat), ("tcp_reset", r_lat)):
        if xs:
            print(f"{name:<10} {len(xs):4d} {pct(xs, .5):6d} {pct(xs, .99):6d} {max(xs):6d}")
        else:
            print(f"{name:<10}    0  (no capture seen)")
    print(f"tcp_reset rule: fired {resets['fired_total']}, captured {resets['captured_total']}, "
          f"suppressed {resets['suppressed']}")
    print("(events keep the last 256: with more firings the oldest latencies are not counted)")
finally:
    for p in daemons:
        p.send_signal(signal.SIGTERM)
    for p in daemons:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    subprocess.run(["rm", "-rf", work])
