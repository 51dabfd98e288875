#!/bin/sh
# Issue 31 item 5 (BENCHMARKS.md, "ingest, where the time goes"). Then:
#   perf script -i OUT.data -F comm,tid,ip,sym | bench/store/ingest_perf_classify.py <server us/envelope>
# Usage: bench/store/ingest_profile.sh BENCH_EXE STORE_BIN OUT.data BACKEND
# Runs the external-mode ingest bench against STORE_BIN and records the
# server process (only it) with perf while the bench runs.
bench="$1"; bin="$2"; out="$3"; backend="${4:-sqlite}"
"$bench" --backend "$backend" --mode external --store-bin "$bin" > "$out.bench.txt" 2>&1 &
bpid=$!
spid=""
while [ -z "$spid" ]; do
  sleep 0.2
  spid=$(pgrep -n -f "^$bin --db .* serve --listen")
  kill -0 $bpid 2>/dev/null || break
done
echo "server pid $spid"
perf record --call-graph dwarf,16384 -F 250 -p "$spid" -o "$out" > "$out.perf.txt" 2>&1 &
ppid=$!
wait $bpid
kill -INT $ppid 2>/dev/null
wait $ppid
cat "$out.bench.txt" | grep -v "^\[" 
