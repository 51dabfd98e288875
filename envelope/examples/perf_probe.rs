//! Where sealing and verifying a ~1 MiB envelope spend their time, stage by
//! stage (`cargo run --release -p pstack-envelope --example perf_probe`);
//! `PROBE_SEAL_LOOP=1` seals in a loop for `perf record`.

use std::time::Instant;
fn main() {
    let e = pstack_envelope::example::example_with_threads(760);
    if std::env::var("PROBE_SEAL_LOOP").is_ok() {
        let mut n = 0;
        for _ in 0..3000 {
            n += e.canonical_digest().unwrap().len();
        }
        println!("{n}");
        return;
    }
    let v = serde_json::to_value(&e).unwrap();
    let n = 200;
    let time = |name: &str, f: &dyn Fn() -> usize| {
        let t0 = Instant::now();
        let mut x = 0;
        for _ in 0..n {
            x += f();
        }
        println!("{name}: {:?} per iter ({x})", t0.elapsed() / n);
    };
    time("serde_json::to_vec(typed)", &|| {
        serde_json::to_vec(&e).unwrap().len()
    });
    time("serde_json::to_vec(value)", &|| {
        serde_json::to_vec(&v).unwrap().len()
    });
    time("fast_canonical_body", &|| {
        e.fast_canonical_body().unwrap().len()
    });
    time("canonical_without_digest(value)", &|| {
        pstack_envelope::canonical_without_digest(&v).unwrap().len()
    });
    let b = e.fast_canonical_body().unwrap();
    time("sha", &|| pstack_envelope::sha256_digest(&b).len());
    time("canonical_digest (pipelined)", &|| {
        e.canonical_digest().unwrap().len()
    });
    time("fast body + sha inline", &|| {
        pstack_envelope::sha256_digest(&e.fast_canonical_body().unwrap()).len()
    });
    let sealed = e.clone().seal_unchecked().unwrap();
    let bytes = sealed.to_json_pretty();
    time(
        "parse_strict",
        &|| match pstack_envelope::parse_strict(&bytes).unwrap() {
            serde_json::Value::Object(m) => m.len(),
            _ => 0,
        },
    );
    let pv = pstack_envelope::parse_strict(&bytes).unwrap();
    time("from_value", &|| {
        pstack_envelope::from_value(&pv).unwrap().surfaces.len()
    });
    time("serde_json::from_slice typed", &|| {
        serde_json::from_slice::<pstack_envelope::Envelope>(&bytes)
            .unwrap()
            .surfaces
            .len()
    });
    time("check_rules", &|| {
        pstack_envelope::check_rules(&sealed).len()
    });
    time("verify", &|| {
        pstack_envelope::verify(&bytes).unwrap().surfaces.len()
    });
}
