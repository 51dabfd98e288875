#!/usr/bin/env python3
"""OTLP decode amplification against a real pstack-store (issue 28).

Starts `pstack-store serve` on a fresh SQLite database, sends K concurrent
POST /v1/traces bodies of N empty spans each (gzip'd protobuf written byte
by byte: an empty span is 0x12 0x00), probes /healthz every 100 ms, and
prints the store's idle RSS, peak RSS (VmHWM) and RSS one second after,
with the answers. Loopback only.

  bench/store/otlp_flood.py --bin target/release/pstack-store --spans 8000000 --concurrent 1
  bench/store/otlp_flood.py --bin target/release/pstack-store --spans 2000000 --concurrent 3
"""

import argparse
import gzip
import http.client
import json
import socket
import subprocess
import tempfile
import threading
import time


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number, body):
    return varint((number << 3) | 2) + varint(len(body)) + body


def empty_spans(n):
    return field(1, field(2, b"\x12\x00" * n))


def status_kib(pid, name):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name):
                return int(line.split()[1])
    return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port, key, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(
        "POST",
        "/v1/traces",
        body=body,
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "gzip",
        },
    )
    r = c.getresponse()
    data = r.read()
    try:
        code = json.loads(data)["error"]["code"]
    except Exception:
        code = ""
    return r.status, code


def healthz(port):
    t = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/healthz")
        ok = c.getresponse().status == 200
    except OSError:
        ok = False
    return (time.monotonic() - t) if ok else float("inf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--spans", type=int, default=8_000_000)
    ap.add_argument("--concurrent", type=int, default=1)
    a = ap.parse_args()
    body = gzip.compress(empty_spans(a.spans), compresslevel=9)
    with tempfile.TemporaryDirectory() as d:
        db = f"{d}/store.db"
        create = [a.bin, "--db", db, "keys", "create", "--name", "flood"]
        made = subprocess.run(create + ["--scope", "telemetry"], capture_output=True, text=True)
        if made.returncode != 0:
            # A build from before key scopes (the "before" of issue 28).
            made = subprocess.run(create, check=True, capture_output=True, text=True)
        key = made.stdout.strip()
        port = free_port()
        srv = subprocess.Popen(
            [a.bin, "--db", db, "serve", "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while healthz(port) == float("inf"):
                assert time.monotonic() < deadline, "store did not start"
                time.sleep(0.05)
            post(port, key, gzip.compress(empty_spans(10)))
            time.sleep(0.3)
            idle = status_kib(srv.pid, "VmRSS:")
            stop = threading.Event()
            worst = [0.0]

            def probe():
                while not stop.is_set():
                    worst[0] = max(worst[0], healthz(port))
                    time.sleep(0.1)

            prober = threading.Thread(target=probe)
            prober.start()
            answers = [None] * a.concurrent
            t0 = time.monotonic()

            def one(i):
                answers[i] = post(port, key, body)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(a.concurrent)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            took = time.monotonic() - t0
            stop.set()
            prober.join()
            peak = status_kib(srv.pid, "VmHWM:")
            time.sleep(1)
            after = status_kib(srv.pid, "VmRSS:")
            print(
                f"{a.concurrent} x {a.spans} empty spans ({len(body)} B gzip each): "
                f"idle {idle >> 10} MiB, peak {peak >> 10} MiB (+{(peak - idle) >> 10} MiB), "
                f"after {after >> 10} MiB; worst /healthz {worst[0] * 1000:.0f} ms; "
                f"{took:.2f} s; answers {answers}"
            )
        finally:
            srv.kill()
            srv.wait()


if __name__ == "__main__":
    main()
