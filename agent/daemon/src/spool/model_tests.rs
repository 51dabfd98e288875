//! Model test: random operation sequences — put, ship (read + acknowledge),
//! crash and recover, a crash after any number of filesystem calls, limit
//! changes, and every fault of [`FaultFs`] — run against the spool over the
//! fault double, with the spool's invariants (module comment of `mod.rs`)
//! checked against a model after every step.
//!
//! Seeded and deterministic: `PSTACK_SPOOL_MODEL_CASES` (default 160)
//! cases of `PSTACK_SPOOL_MODEL_STEPS` (default 120) steps;
//! `PSTACK_SPOOL_MODEL_SEED=<n>` replays one case. A failure prints its
//! seed and the last operations.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pstack_envelope::example::example_unsealed;

use super::fault_fs::{Fault, FaultFs, Fired};
use super::{
    OverflowPolicy, PutOutcome, Spool, SpoolError, SpoolLimits, SpoolSnapshot, TMP_PREFIX,
};

const DIR: &str = "/var/spool/pstack";
const BASE_SEED: u64 = 0x5eed_0000_0017_0007;

/// Sealed envelopes of varied sizes, shared by every case.
fn pool() -> &'static Vec<(String, Vec<u8>)> {
    static POOL: std::sync::OnceLock<Vec<(String, Vec<u8>)>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        (0..24u64)
            .map(|n| {
                let mut e = example_unsealed();
                e.clock.monotonic_start_ns = (77_000 + n).to_string();
                e.surfaces[0].authority = format!(
                    "procfs:/proc/4242/{}",
                    "x".repeat((n as usize * 397) % 3000)
                );
                let e = e.seal().expect("example seals");
                (e.digest.clone(), serde_json::to_vec(&e).expect("json"))
            })
            .collect()
    })
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Expected {
    written: u64,
    dropped: u64,
    refused: u64,
    quarantined: u64,
    acknowledged: u64,
    recovered: u64,
}

impl Expected {
    fn of(s: &SpoolSnapshot) -> Expected {
        Expected {
            written: s.written_total,
            dropped: s.dropped_total,
            refused: s.refused_total,
            quarantined: s.quarantined_total,
            acknowledged: s.acknowledged_total,
            recovered: s.recovered_total,
        }
    }
}

struct Model {
    /// What the spool holds, oldest first.
    live: Vec<String>,
    /// Acknowledged puts not since shipped, dropped or quarantined
    /// (invariant 1: these must survive anything).
    must_hold: HashSet<String>,
    /// Held, but a lying disk stored a prefix of their bytes.
    corrupted: HashSet<String>,
    /// Sizes as the spool indexed them (a torn file's is its torn size).
    sizes: HashMap<String, u64>,
    /// Every digest ever given to `put`.
    ever_put: HashSet<String>,
    expect: Expected,
    limits: SpoolLimits,
}

/// What the cases exercised (printed, and checked to be non-trivial).
#[derive(Debug, Default)]
struct Coverage {
    fired: std::collections::BTreeMap<String, u64>,
    deaths: u64,
    crashes: u64,
    recovered: u64,
    quarantined: u64,
    written: u64,
    shipped: u64,
    dropped: u64,
    refused: u64,
}

struct Case {
    cov: Coverage,
    fs: FaultFs,
    spool: Option<Spool>,
    model: Model,
    rng: fastrand::Rng,
    bytes: HashMap<String, Vec<u8>>,
    trace: Vec<String>,
}

fn dir() -> PathBuf {
    PathBuf::from(DIR)
}

fn final_path(d: &str) -> PathBuf {
    dir().join(format!("{}.json", &d[7..]))
}

fn fired_on(fired: &[Fired], fault: Fault) -> Option<&Fired> {
    fired.iter().find(|f| f.fault == fault)
}

impl Case {
    fn new(seed: u64) -> Case {
        let mut rng = fastrand::Rng::with_seed(seed);
        let fs = FaultFs::new(rng.u64(..));
        let limits = random_limits(&mut rng);
        let bytes = pool().iter().cloned().collect();
        let spool = Spool::open_with(Arc::new(fs.clone()), &dir(), limits).expect("first open");
        Case {
            cov: Coverage::default(),
            fs,
            spool: Some(spool),
            model: Model {
                live: Vec::new(),
                must_hold: HashSet::new(),
                corrupted: HashSet::new(),
                sizes: HashMap::new(),
                ever_put: HashSet::new(),
                expect: Expected::default(),
                limits,
            },
            rng,
            bytes,
            trace: Vec::new(),
        }
    }

    fn spool(&self) -> &Spool {
        self.spool.as_ref().expect("open spool")
    }

    fn live_bytes(&self) -> u64 {
        self.model.live.iter().map(|d| self.model.sizes[d]).sum()
    }

    fn count(&mut self, fired: &[Fired]) {
        for f in fired {
            *self.cov.fired.entry(format!("{:?}", f.fault)).or_insert(0) += 1;
        }
    }

    /// The model loses `d` from the spool (shipped, dropped, quarantined).
    fn forget(&mut self, d: &str) {
        self.model.live.retain(|x| x != d);
        self.model.must_hold.remove(d);
        self.model.corrupted.remove(d);
    }

    fn step(&mut self) {
        let roll = self.rng.u32(0..100);
        match roll {
            0..=39 => {
                let i = self.rng.usize(0..pool().len());
                self.put(i);
            }
            40..=59 => {
                let n = self.rng.usize(1..=4);
                self.ship(n);
            }
            60..=71 => {
                if self.fs.armed().is_empty() {
                    let f = Fault::ALL[self.rng.usize(0..Fault::ALL.len())];
                    self.trace.push(format!("arm {f:?}"));
                    self.fs.arm(f);
                }
            }
            72..=77 => {
                self.trace.push("crash".into());
                self.crash_and_reopen(false);
            }
            78..=91 => {
                let calls = self.rng.u32(0..9);
                let what = self.rng.u32(0..3);
                self.trace
                    .push(format!("crash after {calls} calls of op {what}"));
                self.fs.crash_after(calls);
                match what {
                    0 => {
                        let i = self.rng.usize(0..pool().len());
                        self.put(i);
                    }
                    1 => {
                        let n = self.rng.usize(1..=4);
                        self.ship(n);
                    }
                    _ => self.crash_and_reopen(true),
                }
                self.fs.cancel_crash();
            }
            _ => {
                let limits = random_limits(&mut self.rng);
                self.trace.push(format!("set_limits {limits:?}"));
                self.spool().set_limits(limits);
                self.model.limits = limits;
            }
        }
        if self.fs.is_dead() {
            self.crash_and_reopen(false);
        }
        self.check();
    }

    fn put(&mut self, i: usize) {
        let (d, b) = pool()[i].clone();
        self.trace.push(format!("put #{i} ({} bytes)", b.len()));
        self.model.ever_put.insert(d.clone());
        let limits = self.model.limits;
        // Prediction before any fault: AlreadySpooled, TooLarge, Full, or the
        // drops the bounds force.
        let already = self.model.live.contains(&d);
        let size = b.len() as u64;
        let mut bound_drops = 0usize;
        let mut full = false;
        if !already && size <= limits.max_bytes {
            let (mut files, mut bytes) = (self.model.live.len() as u64, self.live_bytes());
            while !(files < limits.max_files && bytes + size <= limits.max_bytes) {
                if limits.overflow == OverflowPolicy::RefuseNew
                    || bound_drops == self.model.live.len()
                {
                    full = true;
                    break;
                }
                files -= 1;
                bytes -= self.model.sizes[&self.model.live[bound_drops]];
                bound_drops += 1;
            }
        }
        // Those drops happen before any write: whatever follows, they are gone.
        if !already && !full && size <= limits.max_bytes {
            for old in &self.model.live[..bound_drops] {
                self.model.must_hold.remove(old);
            }
        }
        self.fs.take_fired();
        let outcome = self.spool().put(&d, &b);
        let fired = self.fs.take_fired();
        self.count(&fired);
        let enospc_drop = fired_on(&fired, Fault::Enospc).is_some()
            && limits.overflow == OverflowPolicy::DropOldest
            && self.model.live.len() > bound_drops;
        if enospc_drop {
            let old = self.model.live[bound_drops].clone();
            self.model.must_hold.remove(&old);
        }
        if self.fs.is_dead() {
            self.trace.push(format!("  died; fired {fired:?}"));
            return;
        }
        self.trace
            .push(format!("  -> {outcome:?}; fired {fired:?}"));
        // The size is checked first, even for an envelope already held.
        if size > limits.max_bytes {
            assert!(
                matches!(outcome, Err(SpoolError::TooLarge { .. })),
                "{outcome:?}"
            );
            self.model.expect.refused += 1;
            return;
        }
        if already {
            assert!(
                matches!(outcome, Ok(PutOutcome::AlreadySpooled)),
                "{outcome:?}"
            );
            return;
        }
        if full {
            assert!(
                matches!(outcome, Err(SpoolError::Full { .. })),
                "{outcome:?}"
            );
            self.model.expect.refused += 1;
            return;
        }
        let drops = bound_drops + usize::from(enospc_drop);
        let gone: Vec<String> = self.model.live.drain(..drops).collect();
        for old in gone {
            self.forget(&old);
        }
        self.model.expect.dropped += drops as u64;
        let failed = fired.iter().any(|f| {
            matches!(
                f.fault,
                Fault::TornWrite | Fault::FsyncEio | Fault::DirFsyncEio
            )
        }) || (fired_on(&fired, Fault::Enospc).is_some() && !enospc_drop);
        if failed {
            assert!(
                matches!(
                    outcome,
                    Err(SpoolError::Io { .. } | SpoolError::NoSpace { .. })
                ),
                "{outcome:?}"
            );
            self.model.expect.refused += 1;
            return;
        }
        assert_eq!(
            outcome.as_ref().ok(),
            Some(&PutOutcome::Written {
                dropped: drops as u64
            }),
            "{outcome:?}"
        );
        self.model.expect.written += 1;
        self.model.live.push(d.clone());
        self.model.sizes.insert(d.clone(), size);
        self.model.must_hold.insert(d.clone());
        if fired_on(&fired, Fault::SilentTornWrite).is_some() {
            self.model.corrupted.insert(d);
        }
        // Invariant 4: an admitted put leaves the spool within its bounds.
        let s = self.spool().snapshot();
        assert!(
            s.files <= limits.max_files && s.bytes <= limits.max_bytes,
            "bounds exceeded after an admitted put: {s:?}"
        );
    }

    fn ship(&mut self, n: usize) {
        let entries = self.spool().oldest(n, u64::MAX);
        let got: Vec<String> = entries.iter().map(|e| e.digest()).collect();
        let want: Vec<String> = self.model.live.iter().take(n).cloned().collect();
        assert_eq!(got, want, "shipping order differs from arrival order");
        self.trace.push(format!("ship {n}"));
        for d in got {
            self.fs.take_fired();
            let read = self.spool().read_verified(&d);
            let fired = self.fs.take_fired();
            self.count(&fired);
            let eio = fired
                .iter()
                .any(|f| f.fault == Fault::ReadEio && f.path == final_path(&d));
            if self.fs.is_dead() {
                // The read may have quarantined it before the death.
                if eio || self.model.corrupted.contains(&d) {
                    self.model.must_hold.remove(&d);
                }
                self.trace.push(format!("  died reading; fired {fired:?}"));
                return;
            }
            match read {
                Ok(Some(bytes)) => {
                    // Invariant 2: only the exact sealed bytes are served.
                    assert!(bytes == self.bytes[&d], "served bytes differ for {d}");
                    assert!(!self.model.corrupted.contains(&d), "torn {d} served");
                    // The collector acknowledges it.
                    let acked = self.spool().acknowledge(&d);
                    if self.fs.is_dead() {
                        // The collector has it: it may come back after the
                        // crash (re-shipped, deduped), but need not.
                        self.model.must_hold.remove(&d);
                        self.trace.push(format!("  died acknowledging {d}"));
                        return;
                    }
                    acked.expect("acknowledge");
                    self.forget(&d);
                    self.model.expect.acknowledged += 1;
                }
                Ok(None) => {
                    assert!(
                        eio || self.model.corrupted.contains(&d),
                        "{d} withheld without a storage fault; fired {fired:?}"
                    );
                    self.trace
                        .push(format!("  quarantined {} (eio {eio})", &d[7..15]));
                    // Its bytes are kept as evidence (unless the rename
                    // into quarantine is itself the lost one).
                    if fired_on(&fired, Fault::LostRename).is_none() {
                        let kept = self.quarantined_bytes(&d);
                        let exact = eio && !self.model.corrupted.contains(&d);
                        assert!(
                            kept.iter().any(|k| self.bytes[&d].starts_with(k)
                                && (!exact || k == &self.bytes[&d])),
                            "evidence of {d} not kept in quarantine"
                        );
                    }
                    self.forget(&d);
                    self.model.expect.quarantined += 1;
                }
                Err(e) => panic!("read_verified({d}): {e}"),
            }
        }
    }

    fn quarantined_bytes(&self, d: &str) -> Vec<Vec<u8>> {
        let q = dir().join("quarantine");
        self.fs
            .names(&q)
            .into_iter()
            .filter(|n| n.starts_with(&format!("{}.json.", &d[7..])))
            .filter_map(|n| self.fs.peek(&q.join(n)))
            .collect()
    }

    /// Crash (unless `already_scheduled`, where a crash was scheduled inside
    /// this open), then open until an open completes.
    fn crash_and_reopen(&mut self, already_scheduled: bool) {
        if let Some(s) = &self.spool {
            self.tally(&s.snapshot());
        }
        self.cov.crashes += 1;
        if self.fs.is_dead() {
            self.cov.deaths += 1;
        }
        self.spool = None;
        let mut crash_first = !already_scheduled;
        loop {
            if crash_first {
                self.fs.crash();
            }
            crash_first = true;
            // What recovery must do, from what the crash left.
            let expected = self.expected_recovery();
            match Spool::open_with(Arc::new(self.fs.clone()), &dir(), self.model.limits) {
                Ok(s) if !self.fs.is_dead() => {
                    let (recovered, quarantined) = expected;
                    let snap = s.snapshot();
                    assert_eq!(
                        (snap.recovered_total, snap.quarantined_total),
                        (recovered, quarantined),
                        "recovery counts (recovered, quarantined)"
                    );
                    self.spool = Some(s);
                    break;
                }
                _ => {
                    assert!(self.fs.is_dead(), "open failed without a crash");
                    self.cov.deaths += 1;
                    self.trace.push("  died in recovery".into());
                }
            }
        }
        let entries = self.spool().oldest(usize::MAX, u64::MAX);
        self.model.sizes = entries.iter().map(|e| (e.digest(), e.size)).collect();
        let held: Vec<String> = entries.iter().map(|e| e.digest()).collect();
        let held_set: HashSet<&String> = held.iter().collect();
        // Invariant 1 across the crash.
        for d in &self.model.must_hold {
            if self.model.corrupted.contains(d) && !held_set.contains(d) {
                continue; // torn to nothing by the lying disk: quarantined as empty
            }
            assert!(held_set.contains(d), "acknowledged {d} lost in a crash");
        }
        for d in &held {
            assert!(self.model.ever_put.contains(d), "{d} appeared from nowhere");
        }
        let snap = self.spool().snapshot();
        self.model.must_hold.retain(|d| held_set.contains(d));
        // What the lying disk tore (possibly resurrected from quarantine by
        // a crash that forgot the quarantine rename).
        self.model.corrupted = held
            .iter()
            .filter(|d| self.fs.peek(&final_path(d)).as_ref() != Some(&self.bytes[*d]))
            .cloned()
            .collect();
        self.model.live = held;
        self.model.expect = Expected {
            recovered: snap.recovered_total,
            quarantined: snap.quarantined_total,
            ..Expected::default()
        };
        self.trace.push(format!(
            "  reopened: {} held, {} recovered, {} quarantined",
            snap.files, snap.recovered_total, snap.quarantined_total
        ));
    }

    fn tally(&mut self, s: &SpoolSnapshot) {
        self.cov.recovered += s.recovered_total;
        self.cov.quarantined += s.quarantined_total;
        self.cov.written += s.written_total;
        self.cov.shipped += s.acknowledged_total;
        self.cov.dropped += s.dropped_total;
        self.cov.refused += s.refused_total;
    }

    /// (recovered, quarantined) that opening the spool as it is must report.
    fn expected_recovery(&self) -> (u64, u64) {
        let names = self.fs.names(&dir());
        let finals: HashSet<String> = names
            .iter()
            .filter_map(|n| n.strip_suffix(".json").map(str::to_owned))
            .collect();
        let mut recovered = HashSet::new();
        let mut quarantined = 0;
        for n in &names {
            let bytes = self.fs.peek(&dir().join(n)).unwrap_or_default();
            if let Some(rest) = n.strip_prefix(TMP_PREFIX) {
                let hex = &rest[..64];
                let valid = pstack_envelope::verify(&bytes)
                    .is_ok_and(|e| e.digest == format!("sha256:{hex}"));
                if !valid {
                    quarantined += 1;
                } else if !finals.contains(hex) {
                    recovered.insert(hex.to_owned());
                }
            } else if bytes.is_empty() {
                quarantined += 1;
            }
        }
        (recovered.len() as u64, quarantined)
    }

    /// Every invariant, after every step.
    fn check(&self) {
        let s = self.spool();
        let snap = s.snapshot();
        // The index is the model.
        let held: Vec<String> = s
            .oldest(usize::MAX, u64::MAX)
            .iter()
            .map(|e| e.digest())
            .collect();
        assert_eq!(
            held, self.model.live,
            "held envelopes differ from the model"
        );
        assert_eq!(snap.files, self.model.live.len() as u64);
        // Counters agree with the model.
        assert_eq!(Expected::of(&snap), self.model.expect, "counters");
        // Invariant 5: the accounting is the disk.
        let names = self.fs.names(&dir());
        assert!(
            !names.iter().any(|n| n.starts_with(TMP_PREFIX)),
            "temp files left behind: {names:?}"
        );
        let mut on_disk: Vec<String> = names
            .iter()
            .filter_map(|n| n.strip_suffix(".json"))
            .map(|h| format!("sha256:{h}"))
            .collect();
        on_disk.sort();
        let mut live = self.model.live.clone();
        live.sort();
        assert_eq!(on_disk, live, "directory differs from the index");
        let disk_bytes: u64 = self
            .model
            .live
            .iter()
            .map(|d| {
                if self.model.corrupted.contains(d) {
                    // A lying disk's short write: the spool cannot know.
                    self.model.sizes[d]
                } else {
                    self.fs.peek(&final_path(d)).map_or(0, |b| b.len() as u64)
                }
            })
            .sum();
        assert_eq!(snap.bytes, disk_bytes, "bytes accounted vs on disk");
        assert_eq!(snap.bytes, self.live_bytes());
        // Invariant 1: what must be held is held, byte for byte.
        for d in &self.model.must_hold {
            assert!(self.model.live.contains(d), "acknowledged {d} lost");
            if !self.model.corrupted.contains(d) {
                assert!(
                    self.fs.peek(&final_path(d)).as_ref() == Some(&self.bytes[d]),
                    "acknowledged {d} changed on disk"
                );
            }
        }
        // Invariant 3: nothing complete and valid quarantined as torn.
        let q = dir().join("quarantine");
        for n in self.fs.names(&q) {
            let Some((head, _)) = n.split_once(".json.").or_else(|| n.split_once('-')) else {
                continue;
            };
            let torn_reason = [".stray_tmp.", ".invalid.", ".empty."]
                .iter()
                .any(|r| n.contains(r));
            if !torn_reason {
                continue;
            }
            let hex: String = head
                .trim_start_matches(TMP_PREFIX)
                .chars()
                .take(64)
                .collect();
            let bytes = self.fs.peek(&q.join(&n)).unwrap_or_default();
            assert!(
                !pstack_envelope::verify(&bytes).is_ok_and(|e| e.digest == format!("sha256:{hex}")),
                "complete, valid envelope quarantined as torn: {n}"
            );
        }
    }
}

fn random_limits(rng: &mut fastrand::Rng) -> SpoolLimits {
    let largest = pool()
        .iter()
        .map(|(_, b)| b.len() as u64)
        .max()
        .unwrap_or(0);
    SpoolLimits {
        max_files: rng.u64(1..=10),
        // Sometimes below the largest envelope (TooLarge), usually above.
        max_bytes: rng.u64(largest * 3 / 4..=largest * 8),
        overflow: if rng.bool() {
            OverflowPolicy::DropOldest
        } else {
            OverflowPolicy::RefuseNew
        },
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

fn run_case(seed: u64, steps: u64, total: &mut Coverage) {
    let mut case = Case::new(seed);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            case.step();
        }
    }));
    if let Err(panic) = result {
        let tail: Vec<&String> = case.trace.iter().rev().take(40).rev().collect();
        eprintln!(
            "spool model test failed: seed {seed} (replay: PSTACK_SPOOL_MODEL_SEED={seed} cargo test -p pstack-agent --lib spool::model_tests)\nlast operations:\n  {}",
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        );
        std::panic::resume_unwind(panic);
    }
    if let Some(s) = &case.spool {
        case.tally(&s.snapshot());
    }
    let c = case.cov;
    for (k, v) in c.fired {
        *total.fired.entry(k).or_insert(0) += v;
    }
    total.deaths += c.deaths;
    total.crashes += c.crashes;
    total.recovered += c.recovered;
    total.quarantined += c.quarantined;
    total.written += c.written;
    total.shipped += c.shipped;
    total.dropped += c.dropped;
    total.refused += c.refused;
}

#[test]
fn spool_model_random_operations_with_faults_and_crashes_keep_every_invariant() {
    let steps = env_u64("PSTACK_SPOOL_MODEL_STEPS").unwrap_or(120);
    let mut cov = Coverage::default();
    if let Some(seed) = env_u64("PSTACK_SPOOL_MODEL_SEED") {
        run_case(seed, steps, &mut cov);
        eprintln!("spool model: seed {seed}: {cov:?}");
        return;
    }
    let cases = env_u64("PSTACK_SPOOL_MODEL_CASES").unwrap_or(300);
    let started = std::time::Instant::now();
    for i in 0..cases {
        run_case(BASE_SEED.wrapping_add(i), steps, &mut cov);
    }
    eprintln!(
        "spool model: {cases} cases x {steps} steps in {:?}: {cov:?}",
        started.elapsed()
    );
    // The run must have exercised what it claims to.
    for f in Fault::ALL {
        assert!(
            cov.fired.get(&format!("{f:?}")).copied().unwrap_or(0) > 0,
            "{f:?} never fired: {cov:?}"
        );
    }
    assert!(
        cov.deaths > 0 && cov.recovered > 0 && cov.quarantined > 0,
        "{cov:?}"
    );
    assert!(
        cov.dropped > 0 && cov.refused > 0 && cov.shipped > 0,
        "{cov:?}"
    );
}

/// The double's crash semantics themselves: unsynced data is torn, an
/// unsynced rename can survive half, a synced one survives whole.
#[test]
fn fault_fs_crash_semantics() {
    use super::fs::SpoolFs;
    for seed in 0..200 {
        let fs = FaultFs::new(seed);
        let d = Path::new("/d");
        fs.create_dir_all(d).unwrap();
        let mut f = fs.create_new(&d.join("a")).unwrap();
        f.write_all(b"0123456789").unwrap();
        fs.crash();
        // Never fsynced, never dir-synced: gone, or a prefix.
        if let Some(b) = fs.peek(&d.join("a")) {
            assert!(b"0123456789".starts_with(&b));
        }
        let mut f = fs.create_new(&d.join("b")).unwrap();
        f.write_all(b"abc").unwrap();
        f.sync().unwrap();
        fs.rename(&d.join("b"), &d.join("c")).unwrap();
        fs.sync_dir(d).unwrap();
        fs.crash();
        assert_eq!(fs.peek(&d.join("c")).as_deref(), Some(&b"abc"[..]));
        assert_eq!(fs.peek(&d.join("b")), None);
        // A lost rename reverts even after the directory fsync.
        fs.arm(Fault::LostRename);
        fs.rename(&d.join("c"), &d.join("e")).unwrap();
        fs.sync_dir(d).unwrap();
        fs.crash();
        assert_eq!(fs.peek(&d.join("c")).as_deref(), Some(&b"abc"[..]));
        assert_eq!(fs.peek(&d.join("e")), None);
    }
}
