#!/usr/bin/env python3
"""Classify perf samples of the store server by stack: one category per
sample (first rule that matches wins), printed as % of the server's samples.
Input: `perf script -F comm,tid,sym` output (stacks leaf first)."""
import re, sys, collections

RULES = [
    ("checkpointer (SQLite WAL checkpoint)", lambda comm, fr: any(re.search(r"sqlite3WalCheckpoint|walCheckpoint|sqlite3_wal_checkpoint", f) for f in fr)),
    ("allocation (malloc/free/realloc self time)", lambda comm, fr: bool(fr) and re.match(r"(_int_malloc|_int_free|malloc|free|cfree|realloc|_int_realloc|__libc_malloc|__libc_free|__libc_realloc|malloc_consolidate|unlink_chunk|tcache|sysmalloc|__rust_alloc|__rust_dealloc|__rust_realloc|alloc::alloc)", fr[0]) is not None),
    ("verify (pstack_envelope: check + hash + typed parse)", lambda comm, fr: any(re.search(r"verify_item|verify_summary|pstack_envelope::", f) for f in fr)),
    ("gzip inflate (decode_body)", lambda comm, fr: any(re.search(r"decode_body|zlib_rs|inflate|flate2", f) for f in fr)),
    ("JSON batch split (split_items, serde_json RawValue)", lambda comm, fr: any("split_items" in f for f in fr)),
    ("SQL: SQLite writer (sqlite3_*, sqlx worker)", lambda comm, fr: any(re.search(r"sqlite3|sqlx_sqlite", f) for f in fr) or comm.startswith("sqlx-sqlite")),
    ("SQL: PostgreSQL client (sqlx-postgres encode/decode, socket)", lambda comm, fr: any(re.search(r"sqlx_postgres|PgConnection|PgArguments", f) for f in fr)),
    ("SQL: rows/binds built (store-core db::ingest)", lambda comm, fr: any(re.search(r"db::ingest|BatchRows|write_batch|link_transfers|SubjectIndex", f) for f in fr)),
    ("HTTP (hyper/axum, body read, TCP syscalls, response)", lambda comm, fr: any(re.search(r"hyper|axum|read_body|post_envelopes|tcp_|sock_|__sys_recv|__sys_send|recvfrom|sendto|writev|inet_|ip_|net_rx|__x64_sys_read|__x64_sys_write|tower", f) for f in fr)),
]

samples = collections.Counter()
by_comm = collections.Counter()
leaf = collections.Counter()
total = 0
comm = None; frames = []
def flush():
    global total
    if comm is None: return
    total += 1
    by_comm[comm] += 1
    for name, rule in RULES:
        if rule(comm, frames):
            samples[name] += 1
            break
    else:
        samples["other (tokio scheduler, futex/epoll, misc)"] += 1
    if frames: leaf[frames[0]] += 1
for line in sys.stdin:
    if not line.strip():
        flush(); comm = None; frames = []; continue
    if not line.startswith((" ", "\t")):
        flush(); frames = []
        comm = line.split()[0] if line.split() else "?"
        # comm may have spaces; take text before the tid
        m = re.match(r"^(.*?)\s+\d+\s*$", line.rstrip())
        comm = m.group(1).strip() if m else comm
        continue
    parts = line.strip().split(None, 1)
    if len(parts) == 2:
        frames.append(parts[1])
flush()
us = float(sys.argv[1]) if len(sys.argv) > 1 else None
print(f"server samples: {total}")
for name, n in samples.most_common():
    pct = 100.0 * n / total
    extra = f"  ~{pct*us/100:.0f} us/envelope" if us else ""
    print(f"  {pct:5.1f} %  {name}{extra}")
print("by thread name:")
for c, n in by_comm.most_common(8):
    print(f"  {100.0*n/total:5.1f} %  {c}")
print("top leaf symbols:")
for s, n in leaf.most_common(25):
    print(f"  {100.0*n/total:5.1f} %  {s[:110]}")
