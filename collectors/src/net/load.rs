//! CPU load and run queue: a **hypothesis** surface, never stream state.
//!
//! "The node is not loaded" says nothing about whether one TCP stream is
//! healthy, and "the node is loaded" does not prove a stream stalled because
//! of it. These facts exist so a CPU-starvation hypothesis can be stated with
//! its falsifier; the transport capture never derives a stream fact from them.
//!
//! Sources: `/proc/loadavg` (load averages ×1000 as integers, runnable and
//! total tasks), `/proc/stat` (`procs_running`, `procs_blocked`) and
//! `/proc/pressure/cpu` (PSI; absent on kernels built without it).

use serde::{Deserialize, Serialize};

/// CPU load facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadFacts {
    /// 1-minute load average ×1000.
    pub load1_milli: u64,
    /// 5-minute load average ×1000.
    pub load5_milli: u64,
    /// 15-minute load average ×1000.
    pub load15_milli: u64,
    /// Runnable tasks right now (`/proc/stat` procs_running).
    pub procs_running: u64,
    /// Tasks in uninterruptible sleep (`procs_blocked`).
    pub procs_blocked: u64,
    /// Online CPUs.
    pub cpus: u64,
    /// PSI `some avg10` ×100 (percent with two decimals), if PSI is present.
    pub psi_some_avg10_centi: Option<u64>,
    /// PSI `some total`, µs.
    pub psi_some_total_us: Option<u64>,
}

/// `"0.52"` → 520. `None` for anything that is not a decimal or whose
/// milli-units do not fit a `u64` (the kernel never writes one, a fuzzer did).
fn milli(s: &str) -> Option<u64> {
    let (i, f) = s.split_once('.').unwrap_or((s, "0"));
    let mut frac = f.chars().take(3).collect::<String>();
    while frac.len() < 3 {
        frac.push('0');
    }
    i.parse::<u64>()
        .ok()?
        .checked_mul(1000)?
        .checked_add(frac.parse::<u64>().ok()?)
}

/// Parse `/proc/loadavg`.
pub fn parse_loadavg(text: &str, out: &mut LoadFacts) -> Result<(), String> {
    let f: Vec<&str> = text.split_whitespace().collect();
    if f.len() < 4 {
        return Err(format!("loadavg has {} fields, need 4", f.len()));
    }
    out.load1_milli = milli(f[0]).ok_or("load1")?;
    out.load5_milli = milli(f[1]).ok_or("load5")?;
    out.load15_milli = milli(f[2]).ok_or("load15")?;
    Ok(())
}

/// Parse `procs_running` / `procs_blocked` out of `/proc/stat`.
pub fn parse_stat(text: &str, out: &mut LoadFacts) -> Result<(), String> {
    let mut seen = 0;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        match (it.next(), it.next().and_then(|v| v.parse().ok())) {
            (Some("procs_running"), Some(v)) => {
                out.procs_running = v;
                seen += 1;
            }
            (Some("procs_blocked"), Some(v)) => {
                out.procs_blocked = v;
                seen += 1;
            }
            _ => {}
        }
    }
    if seen == 2 {
        Ok(())
    } else {
        Err("procs_running/procs_blocked missing".into())
    }
}

/// Parse the `some` line of `/proc/pressure/cpu`.
pub fn parse_psi(text: &str, out: &mut LoadFacts) -> Result<(), String> {
    let line = text
        .lines()
        .find(|l| l.starts_with("some "))
        .ok_or("no `some` line")?;
    for kv in line.split_whitespace().skip(1) {
        match kv.split_once('=') {
            Some(("avg10", v)) => out.psi_some_avg10_centi = milli(v).map(|m| m / 10),
            Some(("total", v)) => out.psi_some_total_us = v.parse().ok(),
            _ => {}
        }
    }
    Ok(())
}

/// Read the load facts and the raw bytes they came from.
pub fn read_load() -> Result<(LoadFacts, Vec<u8>), String> {
    let mut out = LoadFacts::default();
    let loadavg =
        std::fs::read_to_string("/proc/loadavg").map_err(|e| format!("/proc/loadavg: {e}"))?;
    parse_loadavg(&loadavg, &mut out)?;
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    parse_stat(&stat, &mut out)?;
    let psi = std::fs::read_to_string("/proc/pressure/cpu").unwrap_or_default();
    if !psi.is_empty() {
        parse_psi(&psi, &mut out)?;
    }
    // SAFETY: sysconf has no memory-safety preconditions.
    out.cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u64;
    let raw = format!("{loadavg}{psi}").into_bytes();
    Ok((out, raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The input the 10-second fuzz run of `procfs_parsers` found in CI: a
    /// load value whose milli-units overflow `u64` is refused, not a panic.
    #[test]
    fn a_load_past_u64_milli_units_is_refused() {
        let mut f = LoadFacts::default();
        let input = "467440737095511000 100 184467440737095516159\0\0 1 1 0 b)  0\n";
        assert_eq!(parse_loadavg(input, &mut f), Err("load1".to_string()));
        assert_eq!(milli("18446744073709551"), Some(18_446_744_073_709_551_000));
        assert_eq!(milli("18446744073709552"), None);
    }

    #[test]
    fn parses_loadavg_stat_and_psi() {
        let mut f = LoadFacts::default();
        parse_loadavg("0.52 1.5 12.125 2/345 12345\n", &mut f).unwrap();
        assert_eq!(
            (f.load1_milli, f.load5_milli, f.load15_milli),
            (520, 1500, 12125)
        );
        parse_stat("cpu 1 2 3\nprocs_running 3\nprocs_blocked 1\n", &mut f).unwrap();
        assert_eq!((f.procs_running, f.procs_blocked), (3, 1));
        parse_psi("some avg10=12.34 avg60=0.00 avg300=0.00 total=987\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", &mut f).unwrap();
        assert_eq!(f.psi_some_avg10_centi, Some(1234));
        assert_eq!(f.psi_some_total_us, Some(987));
    }

    #[test]
    fn short_inputs_are_refused() {
        let mut f = LoadFacts::default();
        assert!(parse_loadavg("0.1 0.2", &mut f).is_err());
        assert!(parse_stat("cpu 1\n", &mut f).is_err());
        assert!(parse_psi("", &mut f).is_err());
    }
}
