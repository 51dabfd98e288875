//! Canonicalize+seal and verify of a ~1 MiB envelope, against raw SHA-256 of
//! the same canonical bytes (the physical limit), in one run.

use criterion::{Criterion, Throughput, criterion_group};
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
    // that checks and hashes, allocating nothing, on one thread.
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

/// `SEAL_BENCH_INTERLEAVED=<rounds>`: instead of criterion, each round runs
/// every operation once, in turn, and times each call; medians per
/// operation. On a machine others load, every operation sees the same load
/// (criterion measures one operation for seconds, then the next).
fn interleaved(rounds: usize) {
    let env = one_mib_envelope();
    let compact = serde_json::to_vec(&env).unwrap();
    let value = serde_json::to_value(&env).unwrap();
    let canonical = canonical_without_digest(&value).unwrap();
    type Op<'a> = (&'static str, Box<dyn Fn() + 'a>);
    let ops: Vec<Op> = vec![
        (
            "raw_sha256",
            Box::new(|| {
                black_box(sha256_digest(black_box(&canonical)));
            }),
        ),
        (
            "canonicalize_and_seal",
            Box::new(|| {
                black_box(black_box(&env).canonical_digest().unwrap());
            }),
        ),
        (
            "verify",
            Box::new(|| {
                black_box(verify(black_box(&compact)).unwrap());
            }),
        ),
        (
            "verify_digest",
            Box::new(|| {
                black_box(verify_digest(black_box(&compact)).unwrap());
            }),
        ),
    ];
    for _ in 0..5 {
        ops.iter().for_each(|(_, op)| op());
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); ops.len()];
    for _ in 0..rounds {
        for (i, (_, op)) in ops.iter().enumerate() {
            let t = std::time::Instant::now();
            op();
            times[i].push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = times.iter_mut().map(median).collect();
    println!(
        "interleaved: {rounds} rounds, {} CPUs allowed, {} canonical bytes",
        std::thread::available_parallelism().map_or(1, usize::from),
        canonical.len()
    );
    for ((name, _), m) in ops.iter().zip(&medians) {
        println!(
            "op {name:<22} median {m:8.0} us  ratio {:.3}",
            medians[0] / m
        );
    }
}

fn main() {
    if let Some(rounds) = std::env::var("SEAL_BENCH_INTERLEAVED")
        .ok()
        .and_then(|r| r.parse().ok())
    {
        interleaved(rounds);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
