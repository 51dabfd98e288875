//! `pstackctl capture`: capture a process, a thread or the whole host as a
//! sealed envelope, without a daemon (run as root for full evidence).
//!
//! The envelope is written atomically (temp file, fsync, rename, fsync of the
//! directory) to `-o FILE`, by default `./sha256-<digest>.json` in the current
//! directory. A readable summary is printed (threads by state with wchan,
//! timeouts and unknowns marked `!!`, completeness, digest); `--json` prints
//! the envelope instead. Exit 0 when an envelope was written (whatever its
//! completeness), 2 on bad input or when no envelope could be produced.
//!
//! `--window 5s` (with `--pid`/`--tid`) also observes the subject's threads
//! with eBPF for that long, between the two identity reads: the `ebpf:offcpu`
//! surface (off-CPU time per state, D episodes). The window is added to the
//! bundle deadline. Without root (CAP_BPF+CAP_PERFMON) the surface is
//! `permission_denied` and the envelope `partial`, like any denied surface.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use pstack_envelope::{Completeness, Envelope, Subject, Surface, SurfaceStatus};
use serde_json::Value;

use crate::supervisor::{
    self, CaptureRequest, Deadlines, LeakBudget, LeakJournal, SupervisorConfig, Target,
};

/// Arguments of `pstackctl capture`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "tid", "host"])))]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    /// Transport captures: `capture transport` (TCP streams) and `capture longhorn` (rebuilds).
    #[command(subcommand)]
    pub net: Option<super::longhorn::NetCapture>,
    /// Capture this process and its threads (up to --max-threads).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Capture this one thread (its process identity included).
    #[arg(long, value_name = "TID")]
    pub tid: Option<u32>,
    /// Capture every process on the host: identity, state and wchan of every thread (up to --max-threads).
    #[arg(long)]
    pub host: bool,
    /// Write the sealed envelope here [default: ./sha256-<digest>.json].
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print the envelope as JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Deadline of each surface, ms. A surface past it is abandoned: its helper is SIGKILLed.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub surface_deadline_ms: u64,
    /// Deadline of the whole capture, ms. Surfaces not started by then are `skipped`.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub bundle_deadline_ms: u64,
    /// How long to wait for a killed helper to be reaped before journaling it as leaked, ms.
    #[arg(long, value_name = "MS", default_value_t = 200)]
    pub reap_deadline_ms: u64,
    /// Most threads read (the universe cap; the envelope says when it cut).
    #[arg(long, value_name = "N", default_value_t = 16_384)]
    pub max_threads: u64,
    /// Most raw bytes kept per surface (truncation is reported) [default: 65536; 4194304 with
    /// --host, where one surface holds the stat or wchan text of every thread of a process].
    #[arg(long, value_name = "BYTES")]
    pub max_bytes: Option<u64>,
    /// Most file descriptors read.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_fds: u64,
    /// Unreaped helpers tolerated before risky surfaces are skipped.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub leak_budget: u64,
    /// Durable journal of leaked (unreaped) helpers.
    #[arg(
        long,
        value_name = "FILE",
        env = "PSTACK_LEAK_JOURNAL",
        default_value = "/run/pstack/helper-leaks.jsonl"
    )]
    pub leak_journal: PathBuf,
    /// The pstack-helper binary [default: next to pstackctl].
    #[arg(long, value_name = "FILE", env = "PSTACK_HELPER")]
    pub helper: Option<PathBuf>,
    /// pstackd's socket: when a daemon listens there, the capture goes through it
    /// (deadlines are passed; caps are the daemon's); otherwise it runs one-shot here.
    #[arg(long, value_name = "PATH", env = "PSTACKD_SOCKET", default_value = crate::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Never use the daemon: capture in this process (run as root for full evidence).
    #[arg(long)]
    pub one_shot: bool,
    /// Also observe the subject's threads off CPU (eBPF sched_switch) for this long
    /// (`500ms`, `5s`, `2m`), between the identity reads: the `ebpf:offcpu` surface.
    /// Added to the bundle deadline. Not with --host.
    #[arg(long, value_name = "DURATION", value_parser = super::trace::parse_window, conflicts_with = "host")]
    pub window: Option<Duration>,
    /// Read only these surfaces (repeat the flag or separate with commas), e.g.
    /// `--surface 'task/*/stack,task/*/wchan'`. Thread states (`task/*/stat`, or
    /// `proc/*/tasks` with --host) are always read. Process/thread: proc/status,
    /// proc/io, proc/freezer, proc/cmdline, proc/environ, proc/fd, task/*/stat,
    /// task/*/status, task/*/schedstat, task/*/wchan, task/*/syscall, task/*/stack,
    /// ebpf:offcpu (with --window). Host: proc/*/tasks, proc/*/wchan. [default: all]
    #[arg(long = "surface", value_name = "NAME", value_delimiter = ',')]
    pub surfaces: Vec<String>,
}

/// Run `pstackctl capture`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(net) = args.net {
        return super::longhorn::run_net_capture(net);
    }
    let target = match (args.pid, args.tid, args.host) {
        (Some(pid), _, _) => Target::Process { pid },
        (_, Some(tid), _) => Target::Thread { tid },
        _ => Target::Host,
    };
    let surfaces = if args.surfaces.is_empty() {
        supervisor::SurfaceSelection::all()
    } else {
        supervisor::SurfaceSelection::parse(&args.surfaces)?
    };
    let window_ms = args
        .window
        .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
    // The window runs inside the bundle deadline: give it its own room.
    let bundle_ms = args
        .bundle_deadline_ms
        .saturating_add(window_ms.unwrap_or(0));
    if !args.one_shot {
        let mut body = crate::client::CaptureRequestBody::for_target(
            target,
            args.surface_deadline_ms,
            bundle_ms,
        );
        body.window_ms = window_ms;
        if !args.surfaces.is_empty() {
            body.surfaces = Some(args.surfaces.clone());
        }
        let timeout = Duration::from_millis(bundle_ms.saturating_add(5_000));
        if let Some(envelope) = crate::client::try_capture_via_daemon(&args.socket, &body, timeout)?
        {
            return emit_daemon_capture(&args, &envelope);
        }
    }
    let mut config = match &args.helper {
        Some(p) => SupervisorConfig::new("pstackctl", p.clone())?,
        None => SupervisorConfig::locate("pstackctl")?,
    };
    config.reap_deadline = Duration::from_millis(args.reap_deadline_ms.max(1));
    let budget = LeakBudget::new(
        args.leak_budget,
        LeakJournal::new(&args.leak_journal),
        &config.boot_id,
    );
    let request = CaptureRequest {
        target,
        deadlines: Some(Deadlines {
            surface: Duration::from_millis(args.surface_deadline_ms),
            bundle: Duration::from_millis(bundle_ms),
        }),
        max_threads: args.max_threads,
        max_bytes_per_surface: args
            .max_bytes
            .unwrap_or(if args.host { 4 << 20 } else { 64 << 10 }),
        max_fds: args.max_fds,
        window: args.window,
        surfaces,
    };
    let envelope = supervisor::capture(&request, &config, &budget)?;
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| default_name(&envelope));
    // Compact on disk (any formatting verifies: the digest is over the canonical form).
    let mut bytes = serde_json::to_vec(&envelope)?;
    bytes.push(b'\n');
    write_atomically(&path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        out.write_all(&envelope.to_json_pretty())?;
    } else {
        let color = std::io::stdout().is_terminal();
        out.write_all(render_summary(&envelope, &path, color).as_bytes())?;
        let leaked = budget.leaked_helpers();
        if !leaked.is_empty() {
            writeln!(
                out,
                "{} helper(s) still unreaped (pids {}); journaled in {}",
                leaked.len(),
                leaked
                    .iter()
                    .map(|h| h.pid.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                budget.journal().path().display()
            )?;
        }
    }
    Ok(0)
}

/// Write and print an envelope that pstackd captured (and spooled for shipping).
fn emit_daemon_capture(args: &Args, envelope: &Envelope) -> anyhow::Result<i32> {
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| default_name(envelope));
    let mut bytes = serde_json::to_vec(envelope)?;
    bytes.push(b'\n');
    write_atomically(&path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        out.write_all(&envelope.to_json_pretty())?;
    } else {
        let color = std::io::stdout().is_terminal();
        out.write_all(render_summary(envelope, &path, color).as_bytes())?;
        writeln!(
            out,
            "captured by pstackd ({}); spooled for shipping",
            args.socket.display()
        )?;
    }
    Ok(0)
}

/// `./sha256-<hex>.json`.
pub fn default_name(envelope: &Envelope) -> PathBuf {
    PathBuf::from(format!("{}.json", envelope.digest.replace(':', "-")))
}

/// Write via a temp file in the same directory, fsync, rename, fsync the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "envelope".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn mark(text: &str, color: bool) -> String {
    if color {
        format!("\x1b[1;31m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

fn fact<'a>(s: Option<&'a Surface>, key: &str) -> Option<&'a Value> {
    s.filter(|s| matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated))
        .and_then(|s| s.facts.get(key))
}

fn cell(s: Option<&Surface>, key: &str, show: impl Fn(&Value) -> Option<String>) -> String {
    match s {
        None => "-".into(),
        Some(surface)
            if !matches!(surface.status, SurfaceStatus::Ok | SurfaceStatus::Truncated) =>
        {
            format!("!!{}", surface.status.as_str())
        }
        Some(_) => fact(s, key).and_then(show).unwrap_or_else(|| "-".into()),
    }
}

fn elapsed_ms(env: &Envelope) -> u64 {
    let a: u64 = env.clock.monotonic_start_ns.parse().unwrap_or(0);
    let b: u64 = env.clock.monotonic_end_ns.parse().unwrap_or(0);
    b.saturating_sub(a) / 1_000_000
}

/// The human summary of an envelope.
pub fn render_summary(env: &Envelope, path: &Path, color: bool) -> String {
    let mut o = String::new();
    let line = |o: &mut String, s: String| {
        o.push_str(&s);
        o.push('\n');
    };
    line(&mut o, format!("subject:      {}", env.subject.describe()));
    let completeness = match env.completeness {
        Completeness::Complete => "complete".to_string(),
        other => mark(other.as_str(), color),
    };
    line(
        &mut o,
        format!(
            "completeness: {completeness}   universe {} {}/{} ({})   {} surfaces in {} ms",
            env.universe.selector,
            env.universe.observed_count,
            env.universe.expected_count,
            env.universe.termination.as_str(),
            env.surfaces.len(),
            elapsed_ms(env)
        ),
    );
    let by_id: BTreeMap<&str, &Surface> = env.surfaces.iter().map(|s| (s.id.as_str(), s)).collect();
    o.push('\n');
    match env.subject {
        Subject::Host(_) => render_host(&mut o, env, &by_id, color),
        _ => render_task(&mut o, env, &by_id, color),
    }
    let failed: Vec<&Surface> = env
        .surfaces
        .iter()
        .filter(|s| !matches!(s.status, SurfaceStatus::Ok))
        .collect();
    if !failed.is_empty() {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &failed {
            *counts.entry(s.status.as_str()).or_default() += 1;
        }
        let text: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        line(
            &mut o,
            format!("\n{} ({})", mark("surfaces not ok", color), text.join(", ")),
        );
        for s in failed.iter().take(15) {
            let cause = s.cause.as_ref().map(|c| c.message.as_str()).unwrap_or("");
            line(
                &mut o,
                format!(
                    "  !! {:<28} {:<24} {:>6} ms  {cause}",
                    s.id,
                    s.status.as_str(),
                    s.elapsed_us / 1000
                ),
            );
        }
        if failed.len() > 15 {
            line(
                &mut o,
                format!("  ... and {} more (see the envelope)", failed.len() - 15),
            );
        }
    }
    if !env.unknowns.is_empty() {
        line(&mut o, format!("\nunknowns ({}):", env.unknowns.len()));
        for u in env.unknowns.iter().take(8) {
            line(
                &mut o,
                format!("  ? {}\n      probe: {}", u.question, u.probe),
            );
        }
        if env.unknowns.len() > 8 {
            line(&mut o, format!("  ... and {} more", env.unknowns.len() - 8));
        }
    }
    if !env.claims.is_empty() {
        line(&mut o, "\nclaims:".into());
        for c in env.claims.iter().take(12) {
            line(&mut o, format!("  [{}] {}", c.kind.as_str(), c.statement));
        }
        if env.claims.len() > 12 {
            line(&mut o, format!("  ... and {} more", env.claims.len() - 12));
        }
    }
    line(
        &mut o,
        format!(
            "\nnext:         {} — {}",
            env.next_transition.action, env.next_transition.success_receipt
        ),
    );
    line(&mut o, format!("digest:       {}", env.digest));
    line(&mut o, format!("written:      {}", path.display()));
    o
}

fn render_task(o: &mut String, env: &Envelope, by_id: &BTreeMap<&str, &Surface>, color: bool) {
    let mut tids: Vec<u64> = env
        .surfaces
        .iter()
        .filter_map(|s| {
            s.id.strip_prefix("task/")
                .and_then(|r| r.split('/').next())
                .and_then(|t| t.parse().ok())
        })
        .collect();
    tids.dedup();
    o.push_str(&format!(
        "{:<9} {:<6} {:<16} {:<28} {:<18} {}\n",
        "TID", "STATE", "COMM", "WCHAN", "SYSCALL", "STACK TOP"
    ));
    for tid in tids.iter().take(200) {
        let get = |name: &str| by_id.get(format!("task/{tid}/{name}").as_str()).copied();
        let stat = get("stat");
        let state = cell(stat, "state", |v| v.as_str().map(str::to_string));
        let comm = cell(stat, "comm", |v| v.as_str().map(str::to_string));
        let wchan = cell(get("wchan"), "wchan", |v| {
            Some(v.as_str().unwrap_or("-").to_string())
        });
        let syscall = match get("syscall") {
            Some(s) if matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated) => {
                let mode = s.facts.get("mode").and_then(Value::as_str).unwrap_or("?");
                match mode {
                    "in_syscall" => s
                        .facts
                        .get("name")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .or_else(|| s.facts.get("nr").map(|n| format!("#{n}")))
                        .unwrap_or_default(),
                    other => other.to_string(),
                }
            }
            other => cell(other, "", |_| None),
        };
        let stack = cell(get("stack"), "frames", |v| {
            v.as_array()
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        let row = format!("{tid:<9} {state:<6} {comm:<16} {wchan:<28} {syscall:<18} {stack}");
        let hot = state == "D" || row.contains("!!");
        o.push_str(&if hot { mark(&row, color) } else { row });
        o.push('\n');
    }
    if tids.len() > 200 {
        o.push_str(&format!(
            "... and {} more threads (see the envelope)\n",
            tids.len() - 200
        ));
    }
    let mut proc_line = Vec::new();
    for name in ["cmdline", "environ", "fd"] {
        if let Some(s) = by_id.get(format!("proc/{name}").as_str()) {
            let detail = match (name, s.status) {
                ("cmdline", SurfaceStatus::Ok) => s
                    .facts
                    .get("argv0")
                    .and_then(Value::as_str)
                    .map(|a| format!("argv0 {a}")),
                ("environ", SurfaceStatus::Ok) => s
                    .facts
                    .get("names")
                    .and_then(Value::as_array)
                    .map(|n| format!("{} vars, values redacted", n.len())),
                ("fd", SurfaceStatus::Ok) => s.facts.get("total").map(|t| format!("{t} open")),
                _ => None,
            };
            let status = if s.status == SurfaceStatus::Ok {
                "ok".to_string()
            } else {
                mark(&format!("!!{}", s.status.as_str()), color)
            };
            proc_line.push(format!(
                "{name} {status}{}",
                detail.map(|d| format!(" ({d})")).unwrap_or_default()
            ));
        }
    }
    if !proc_line.is_empty() {
        o.push_str(&format!("process:      {}\n", proc_line.join("; ")));
    }
    if let Some(s) = by_id.get(pstack_ebpf::OFFCPU_SURFACE) {
        let text = match s.status {
            SurfaceStatus::Ok | SurfaceStatus::Truncated => {
                let n = |k: &str| s.facts.get(k).and_then(Value::as_u64).unwrap_or(0);
                let episodes = s
                    .facts
                    .get("d_episodes")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let row = format!(
                    "{} {} ms window, {} switches, {} D episode(s){}",
                    s.status.as_str(),
                    n("window_ms"),
                    n("switches"),
                    episodes,
                    if s.truncated { ", events lost" } else { "" }
                );
                if episodes > 0 { mark(&row, color) } else { row }
            }
            other => mark(&format!("!!{}", other.as_str()), color),
        };
        o.push_str(&format!("off-cpu:      {text}\n"));
    }
}

fn render_host(o: &mut String, env: &Envelope, by_id: &BTreeMap<&str, &Surface>, color: bool) {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut notable = Vec::new();
    for s in env.surfaces.iter().filter(|s| s.id.ends_with("/tasks")) {
        let Some(threads) = s.facts.get("threads").and_then(Value::as_array) else {
            continue;
        };
        let pid = s
            .facts
            .get("process")
            .and_then(|p| p.get("pid"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let wchans: BTreeMap<u64, String> = by_id
            .get(format!("proc/{pid}/wchan").as_str())
            .and_then(|w| w.facts.get("threads").and_then(Value::as_array))
            .map(|a| {
                a.iter()
                    .filter_map(|t| {
                        Some((
                            t.get("tid")?.as_u64()?,
                            t.get("wchan")?.as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        for t in threads {
            let state = t
                .get("state")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            *counts.entry(state.clone()).or_default() += 1;
            if matches!(state.as_str(), "D" | "Z" | "T" | "t") {
                let tid = t.get("tid").and_then(Value::as_u64).unwrap_or(0);
                let comm = t
                    .get("comm")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string();
                notable.push((
                    state,
                    pid,
                    tid,
                    comm,
                    wchans.get(&tid).cloned().unwrap_or_else(|| "-".into()),
                ));
            }
        }
    }
    let text: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    o.push_str(&format!("threads by state: {}\n", text.join("  ")));
    if !notable.is_empty() {
        notable.sort();
        o.push_str(&format!(
            "\n{:<6} {:<9} {:<9} {:<16} {}\n",
            "STATE", "PID", "TID", "COMM", "WCHAN"
        ));
        for (state, pid, tid, comm, wchan) in notable.iter().take(40) {
            let row = format!("{state:<6} {pid:<9} {tid:<9} {comm:<16} {wchan}");
            o.push_str(&if state == "D" { mark(&row, color) } else { row });
            o.push('\n');
        }
        if notable.len() > 40 {
            o.push_str(&format!("... and {} more\n", notable.len() - 40));
        }
    }
}
