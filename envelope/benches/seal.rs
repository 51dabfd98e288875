//! Canonicalize+seal and verify of a ~1 MiB envelope, against raw SHA-256 of
//! the same canonical bytes (the physical limit), in one run.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pstack_envelope::{
    canonical_without_digest, example::example_with_threads, sha256_digest, verify, verify_digest,
};
use std::hint::black_box;

// pstackctl's allocator (`pstackctl envelope verify`). The store keeps
// glibc malloc (see store/src/main.rs): comment these two lines out for
// its figure.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn one_mib_envelope() -> pstack_envelope::Envelope {
    // ~1 MiB of realistic surfaces: 760 threads with stack text and counters.
    example_with_threads(760).seal().unwrap()
}

fn bench(c: &mut Criterion) {
    let env = one_mib_envelope();
    // What pstack writes to its spool and ships (`serde_json::to_vec` of the
    // model: the canonical form with the digest in place), and the pretty
    // rendering `pstackctl` prints for people.
    let compact = serde_json::to_vec(&env).unwrap();
    let bytes = env.to_json_pretty();
    let value = serde_json::to_value(&env).unwrap();
    let canonical = canonical_without_digest(&value).unwrap();
    eprintln!(
        "envelope: {} bytes pretty, {} bytes as written, {} bytes canonical",
        bytes.len(),
        compact.len(),
        canonical.len()
    );
    let mut g = c.benchmark_group("envelope_1mib");
    g.throughput(Throughput::Bytes(canonical.len() as u64));
    g.bench_function("raw_sha256", |b| {
        b.iter(|| sha256_digest(black_box(&canonical)))
    });
    // The work of `seal()`: canonical form of the typed model, hashed as it
    // is written (one thread).
    g.bench_function("canonicalize_and_seal", |b| {
        b.iter(|| black_box(&env).canonical_digest().unwrap())
    });
    g.bench_function("canonicalize_and_seal_value", |b| {
        b.iter(|| sha256_digest(&canonical_without_digest(black_box(&value)).unwrap()))
    });
    // Hashes on a second thread beside the parse (the input is over
    // 256 KiB); run the bench under `taskset -c 0` for the one-core figure.
    g.bench_function("verify", |b| {
        b.iter(|| verify(black_box(&compact)).unwrap())
    });
    // The same verdict without the typed model (issue 31 item 4): one pass
    // that checks and hashes, allocating nothing; the hash on a second
    // thread when the process may use two CPUs.
    g.bench_function("verify_digest", |b| {
        b.iter(|| verify_digest(black_box(&compact)).unwrap())
    });
    // Not a verify: the allocation floor of any verify that returns the
    // typed model (every string and map of the envelope allocated, then
    // dropped), for reading the verify rows.
    g.bench_function("clone_typed_model", |b| b.iter(|| black_box(&env).clone()));
    g.bench_function("verify_pretty", |b| {
        b.iter(|| verify(black_box(&bytes)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
