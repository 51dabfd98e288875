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
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use pstack_envelope::{Completeness, Envelope, Subject, Surface, SurfaceStatus};
use serde_json::Value;

use pstack_capture::process::{self, LeakBudget, LeakJournal, SupervisorConfig, Target};
use pstack_capture::request::{
    self, CaptureRequest, HostRequest, ProcessLimits, ProcessRequest, RequestedCaps,
    RequestedDeadlines, ThreadRequest,
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
    /// Capture every process on the host: identity, state and wchan of every thread (up to
    /// --max-threads). The summary shows the threads in trouble (D, R, Z, T) and the most
    /// crowded waits, grouped by wchan with counts; --all lists every thread.
    #[arg(long)]
    pub host: bool,
    /// Write the sealed envelope to FILE (compact JSON), or to stdout with `-o -`
    /// (then nothing else is printed there). Without -o or --out-dir the envelope
    /// is only printed (--json) or summarized, never written into the current directory.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Keep every envelope in DIR as `sha256-<digest>.json` (a configured evidence directory).
    #[arg(
        long,
        value_name = "DIR",
        env = "PSTACK_OUT_DIR",
        conflicts_with = "output"
    )]
    pub out_dir: Option<PathBuf>,
    /// With --host: list every thread, not only those in trouble (D, R, Z, T) and the most
    /// crowded waits.
    #[arg(long, conflicts_with_all = ["pid", "tid"])]
    pub all: bool,
    /// Print the envelope as JSON (pretty) on stdout instead of the summary; no file unless -o/--out-dir.
    #[arg(long)]
    pub json: bool,
    /// Deadline of each surface (`250ms`, `2s`). A surface past it is abandoned: its helper is SIGKILLed.
    /// [default: 2s; pstackd uses 250ms: a daemon serves many callers and must not stall on one]
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, conflicts_with = "surface_deadline_ms")]
    pub surface_deadline: Option<Duration>,
    /// Same as --surface-deadline, in milliseconds (a bare number) or a duration.
    #[arg(long, value_name = "MS", value_parser = millis_arg)]
    pub surface_deadline_ms: Option<Duration>,
    /// Deadline of the whole capture (`10s`). Surfaces not started by then are `skipped`.
    /// [default: 10s; pstackd uses 2s]
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, conflicts_with = "bundle_deadline_ms")]
    pub bundle_deadline: Option<Duration>,
    /// Same as --bundle-deadline, in milliseconds (a bare number) or a duration.
    #[arg(long, value_name = "MS", value_parser = millis_arg)]
    pub bundle_deadline_ms: Option<Duration>,
    /// How long to wait for a killed helper to be reaped before journaling it as leaked [default: 200ms].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, conflicts_with = "reap_deadline_ms")]
    pub reap_deadline: Option<Duration>,
    /// Same as --reap-deadline, in milliseconds (a bare number) or a duration.
    #[arg(long, value_name = "MS", value_parser = millis_arg)]
    pub reap_deadline_ms: Option<Duration>,
    /// Most threads read (the universe cap; the envelope says when it cut). [pstackd: 10000,
    /// bounding the memory of its concurrent captures]
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
        default_value = pstack_capture::helpers::leak::DEFAULT_JOURNAL
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
    #[arg(long, value_name = "DURATION", value_parser = super::trace::parse_offcpu_window, conflicts_with = "host")]
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

/// Durations on the command line (the one parser, units required).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    pstack_cli::parse_duration(s).map_err(|e| e.to_string())
}

/// `...-ms` flags: a bare number of milliseconds, or a duration.
pub fn millis_arg(s: &str) -> Result<Duration, String> {
    pstack_cli::parse_millis(s).map_err(|e| e.to_string())
}

/// CLI defaults of the one-shot capture. They are wider than pstackd's
/// (250 ms / 2 s, see `daemon::config`): an operator running one capture by
/// hand waits for a slow surface rather than lose it; a daemon serving many
/// callers must not let one stuck subject hold its capture slots.
pub const CLI_SURFACE_DEADLINE: Duration = Duration::from_secs(2);
/// See [`CLI_SURFACE_DEADLINE`].
pub const CLI_BUNDLE_DEADLINE: Duration = Duration::from_secs(10);
/// Wait for a SIGKILLed helper to be reaped before journaling it as leaked.
pub const CLI_REAP_DEADLINE: Duration = Duration::from_millis(200);

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
    let surface_deadline = args
        .surface_deadline
        .or(args.surface_deadline_ms)
        .unwrap_or(CLI_SURFACE_DEADLINE);
    let reap_deadline = args
        .reap_deadline
        .or(args.reap_deadline_ms)
        .unwrap_or(CLI_REAP_DEADLINE);
    // The one request validator, with this command line's caps and
    // defaults as the limits (the window gets its own room in the bundle).
    let limits = ProcessLimits {
        surface_deadline_ms: ms(surface_deadline),
        bundle_deadline_ms: ms(args
            .bundle_deadline
            .or(args.bundle_deadline_ms)
            .unwrap_or(CLI_BUNDLE_DEADLINE)),
        max_bundle_deadline_ms: u64::MAX,
        max_threads: args.max_threads,
        max_bytes_per_surface: args
            .max_bytes
            .unwrap_or(if args.host { 4 << 20 } else { 64 << 10 }),
        max_fds: args.max_fds,
    };
    let window_ms = args.window.map(ms);
    let names = (!args.surfaces.is_empty()).then(|| args.surfaces.clone());
    let request = match request::process_plan(
        target,
        &RequestedDeadlines::default(),
        &RequestedCaps::default(),
        window_ms,
        &names,
        &limits,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pstackctl capture: {e}");
            return Ok(2);
        }
    };
    let deadlines = request.deadlines();
    let bundle_ms = ms(deadlines.bundle);
    let progress = args
        .window
        .map(|w| pstack_cli::progress::Progress::start("observing off-CPU time (eBPF)", w));
    if !args.one_shot {
        let surfaces = (!args.surfaces.is_empty()).then(|| args.surfaces.clone());
        let body = daemon_request(
            target,
            RequestedDeadlines {
                surface_ms: Some(ms(deadlines.surface)),
                bundle_ms: Some(bundle_ms),
            },
            window_ms,
            surfaces,
        );
        let timeout = Duration::from_millis(bundle_ms.saturating_add(5_000));
        if let Some(received) = crate::client::try_capture_via_daemon(&args.socket, &body, timeout)?
        {
            drop(progress);
            return emit(
                &args,
                &received.envelope,
                Some(&received.bytes),
                &[],
                Some(&args.socket),
            );
        }
    }
    let mut config = match &args.helper {
        Some(p) => SupervisorConfig::new("pstackctl", p.clone())?,
        None => SupervisorConfig::locate("pstackctl")?,
    };
    config.reap_deadline = reap_deadline.max(Duration::from_millis(1));
    // The daemon's key when this user can read it, so one-shot and daemon
    // digests of the same arguments compare; else a key of this run only.
    let (key, _shared) = pstack_capture::digest_key::for_one_shot(Path::new(
        pstack_capture::digest_key::DEFAULT_PATH,
    ))
    .map_err(pstack_capture::process::CaptureError::DigestKey)?;
    *config.digest_key.write().unwrap_or_else(|p| p.into_inner()) = key;
    let budget = LeakBudget::new(
        args.leak_budget,
        LeakJournal::new(&args.leak_journal),
        &config.boot_id,
    );
    let envelope = process::capture(&request, &config, &budget)?;
    drop(progress);
    let leaked = budget.leaked_helpers();
    let mut notes = Vec::new();
    if !leaked.is_empty() {
        notes.push(format!(
            "{} helper(s) still unreaped (pids {}); journaled in {}",
            leaked.len(),
            leaked
                .iter()
                .map(|h| h.pid.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            budget.journal().path().display()
        ));
    }
    emit(&args, &envelope, None, &notes, None)
}

/// Where the envelope goes, from `-o` and `--out-dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `-o -`: the envelope (compact JSON) is the only thing on stdout.
    Stdout,
    /// `-o FILE` or `--out-dir DIR` (then `DIR/sha256-<digest>.json`).
    File(PathBuf),
    /// Neither: printed or summarized only.
    Nowhere,
}

impl Destination {
    /// Resolve the flags for one envelope.
    pub fn resolve(output: Option<&Path>, out_dir: Option<&Path>, envelope: &Envelope) -> Self {
        match (output, out_dir) {
            (Some(o), _) if o == Path::new("-") => Destination::Stdout,
            (Some(o), _) => Destination::File(o.to_path_buf()),
            (None, Some(dir)) => Destination::File(dir.join(default_name(envelope))),
            (None, None) => Destination::Nowhere,
        }
    }
}

/// Write and print an envelope: to its destination, then the summary or the
/// JSON on stdout. `received` holds the bytes the daemon sent (verified into
/// `envelope`), written as they are; `notes` follow the summary; `via` names
/// pstackd's socket when the daemon captured it (and spooled it for
/// shipping).
fn emit(
    args: &Args,
    envelope: &Envelope,
    received: Option<&[u8]>,
    notes: &[String],
    via: Option<&Path>,
) -> anyhow::Result<i32> {
    let destination =
        Destination::resolve(args.output.as_deref(), args.out_dir.as_deref(), envelope);
    // Compact on disk (any formatting verifies: the digest is over the
    // canonical form): the daemon's bytes when it sent them, else ours.
    let mut compact = match received {
        Some(bytes) => bytes.trim_ascii_end().to_vec(),
        None => serde_json::to_vec(envelope)?,
    };
    compact.push(b'\n');
    match &destination {
        Destination::Stdout => {
            if args.json {
                pstack_cli::output::out_bytes(&envelope.to_json_pretty())?;
            } else {
                pstack_cli::output::out_bytes(&compact)?;
            }
            return Ok(0);
        }
        Destination::File(path) => pstack_capture::envelope_file::write(path, &compact)
            .with_context(|| format!("cannot write {}", path.display()))?,
        Destination::Nowhere => {}
    }
    if args.json {
        pstack_cli::output::out_bytes(&envelope.to_json_pretty())?;
        return Ok(0);
    }
    let style = Style::for_stdout(args.all);
    let written = match &destination {
        Destination::File(p) => Some(p.as_path()),
        _ => None,
    };
    let mut text = render_summary(envelope, written, &style);
    for note in notes {
        text.push_str(note);
        text.push('\n');
    }
    if let Some(socket) = via {
        text.push_str(&format!(
            "captured by pstackd ({}); spooled for shipping\n",
            socket.display()
        ));
    }
    pstack_cli::output::out_bytes(text.as_bytes())?;
    Ok(0)
}

/// `sha256-<hex>.json` ([`pstack_capture::envelope_file::file_name`]).
pub fn default_name(envelope: &Envelope) -> PathBuf {
    PathBuf::from(pstack_capture::envelope_file::file_name(envelope))
}

/// How the summary is drawn: colour, the terminal's width, and whether the
/// host view lists every thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Style {
    /// ANSI colour on marked rows (a terminal without `NO_COLOR`).
    pub color: bool,
    /// The terminal's columns; rows are cut to fit. `None`: whole rows.
    pub columns: Option<usize>,
    /// `--all`: every thread in the host view.
    pub all: bool,
}

impl Style {
    /// For stdout as it is now (terminal or not, `NO_COLOR`, width).
    pub fn for_stdout(all: bool) -> Style {
        Style {
            color: pstack_cli::output::stdout_color(),
            columns: pstack_cli::output::terminal_columns(),
            all,
        }
    }

    /// A table row: cut to the terminal, then marked when hot.
    fn row(&self, row: &str, hot: bool) -> String {
        let fitted = pstack_cli::output::fit_line(row, self.columns);
        if hot {
            mark(&fitted, self.color)
        } else {
            fitted.into_owned()
        }
    }
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
pub fn render_summary(env: &Envelope, written: Option<&Path>, style: &Style) -> String {
    let color = style.color;
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
        Subject::Host(_) => render_host(&mut o, env, &by_id, style),
        _ => render_task(&mut o, env, &by_id, style),
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
    line(
        &mut o,
        match written {
            Some(path) => format!("written:      {}", path.display()),
            None => "written:      nowhere (keep it with -o FILE, -o - or --out-dir DIR)".into(),
        },
    );
    o
}

fn render_task(o: &mut String, env: &Envelope, by_id: &BTreeMap<&str, &Surface>, style: &Style) {
    let color = style.color;
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
    let header = format!(
        "{:<9} {:<6} {:<16} {:<28} {:<18} {}",
        "TID", "STATE", "COMM", "WCHAN", "SYSCALL", "STACK TOP"
    );
    o.push_str(&style.row(&header, false));
    o.push('\n');
    use pstack_cli::output::cell as fit;
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
        let row = format!(
            "{tid:<9} {} {} {} {} {stack}",
            fit(&state, 6),
            fit(&comm, 16),
            fit(&wchan, 28),
            fit(&syscall, 18)
        );
        let hot = state == "D" || row.contains("!!");
        o.push_str(&style.row(row.trim_end(), hot));
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

/// The host view of a host envelope alone (what [`render_summary`] shows
/// between the header and the surfaces/claims).
pub fn render_host_view(env: &Envelope, style: &Style) -> String {
    let by_id: BTreeMap<&str, &Surface> = env.surfaces.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut o = String::new();
    render_host(&mut o, env, &by_id, style);
    o
}

/// One thread of a host capture, as the host view shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct HostThread {
    pid: u64,
    tid: u64,
    state: String,
    comm: String,
    wchan: String,
}

/// States an operator looks for first: uninterruptible, running, zombie, stopped.
const TROUBLE_STATES: [&str; 6] = ["D", "R", "Z", "T", "t", "X"];
/// Thread examples named per wchan group before `(+N)`.
const GROUP_EXAMPLES: usize = 6;
/// Sleeping wchan groups shown without --all.
const SLEEP_GROUPS: usize = 10;

fn host_threads(env: &Envelope, by_id: &BTreeMap<&str, &Surface>) -> Vec<HostThread> {
    let mut rows = Vec::new();
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
            let tid = t.get("tid").and_then(Value::as_u64).unwrap_or(0);
            let text = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
            let wchan = match wchans.get(&tid).map(String::as_str) {
                None | Some("" | "0") => "-".to_string(),
                Some(w) => w.to_string(),
            };
            rows.push(HostThread {
                pid,
                tid,
                state: text("state"),
                comm: text("comm"),
                wchan,
            });
        }
    }
    rows.sort();
    rows
}

/// Rank of a state in the trouble view: D first.
fn trouble_rank(state: &str) -> Option<usize> {
    TROUBLE_STATES.iter().position(|s| *s == state)
}

/// The host view: counts by state, then the threads that matter — D, R, Z
/// and stopped threads grouped by state and wchan, then the most crowded
/// sleeping wchans — like `ps` filtered to trouble. `--all` lists every thread.
/// A host snapshot has no per-thread wait age: how long a thread has been
/// off CPU is what `capture --pid P --window 5s` measures.
fn render_host(o: &mut String, env: &Envelope, by_id: &BTreeMap<&str, &Surface>, style: &Style) {
    use pstack_cli::output::cell as fit;
    let rows = host_threads(env, by_id);
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &rows {
        *counts.entry(r.state.as_str()).or_default() += 1;
    }
    let text: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    o.push_str(&format!(
        "threads by state: {}   ({} threads)\n",
        text.join("  "),
        rows.len()
    ));
    if style.all {
        o.push('\n');
        let header = format!(
            "{:<6} {:<9} {:<9} {:<16} {}",
            "STATE", "PID", "TID", "COMM", "WCHAN"
        );
        o.push_str(&style.row(&header, false));
        o.push('\n');
        for r in &rows {
            let row = format!(
                "{} {:<9} {:<9} {} {}",
                fit(&r.state, 6),
                r.pid,
                r.tid,
                fit(&r.comm, 16),
                r.wchan
            );
            o.push_str(&style.row(&row, r.state == "D"));
            o.push('\n');
        }
        return;
    }
    // (rank, state, wchan) -> threads
    type Groups<'a> = BTreeMap<(usize, &'a str, &'a str), Vec<&'a HostThread>>;
    let mut trouble: Groups<'_> = BTreeMap::new();
    let mut sleeping: Groups<'_> = BTreeMap::new();
    for r in &rows {
        match trouble_rank(&r.state) {
            Some(rank) => trouble
                .entry((rank, &r.state, &r.wchan))
                .or_default()
                .push(r),
            None => sleeping.entry((0, &r.state, &r.wchan)).or_default().push(r),
        }
    }
    let header = format!(
        "{:<6} {:<28} {:>6}  {}",
        "STATE", "WCHAN", "COUNT", "THREADS (pid/tid comm)"
    );
    let group_row = |state: &str, wchan: &str, threads: &[&HostThread]| {
        let mut named: Vec<String> = threads
            .iter()
            .take(GROUP_EXAMPLES)
            .map(|t| format!("{}/{} {}", t.pid, t.tid, t.comm))
            .collect();
        if threads.len() > GROUP_EXAMPLES {
            named.push(format!("(+{})", threads.len() - GROUP_EXAMPLES));
        }
        format!(
            "{} {} {:>6}  {}",
            fit(state, 6),
            fit(wchan, 28),
            threads.len(),
            named.join(", ")
        )
    };
    o.push('\n');
    if trouble.is_empty() {
        o.push_str("no thread in D, R, Z or T\n");
    } else {
        o.push_str("in trouble (D, R, Z, T), by state and wchan:\n");
        o.push_str(&style.row(&header, false));
        o.push('\n');
        for ((_, state, wchan), threads) in &trouble {
            o.push_str(&style.row(&group_row(state, wchan, threads), *state == "D"));
            o.push('\n');
        }
    }
    let mut crowded: Vec<_> = sleeping.into_iter().collect();
    // Most crowded first; ties in state/wchan order (deterministic).
    crowded.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
    if !crowded.is_empty() {
        o.push_str(&format!(
            "\nwaiting, most crowded wchans ({} of {}; --all lists every thread):\n",
            crowded.len().min(SLEEP_GROUPS),
            crowded.len()
        ));
        o.push_str(&style.row(&header, false));
        o.push('\n');
        for ((_, state, wchan), threads) in crowded.iter().take(SLEEP_GROUPS) {
            o.push_str(&style.row(&group_row(state, wchan, threads), false));
            o.push('\n');
        }
    }
}

/// The tagged request pstackd gets for a process, thread or host capture
/// (the same `kind`-tagged body as every other capture kind). Caps are left
/// to the daemon's configured defaults: a caller may only narrow them.
fn daemon_request(
    target: Target,
    deadlines: RequestedDeadlines,
    window_ms: Option<u64>,
    surfaces: Option<Vec<String>>,
) -> CaptureRequest {
    let caps = RequestedCaps::default();
    match target {
        Target::Process { pid } => CaptureRequest::Process(ProcessRequest {
            pid,
            deadlines,
            caps,
            window_ms,
            surfaces,
        }),
        Target::Thread { tid } => CaptureRequest::Thread(ThreadRequest {
            tid,
            deadlines,
            caps,
            window_ms,
            surfaces,
        }),
        // The validator refuses a window on a host capture before this.
        Target::Host => CaptureRequest::Host(HostRequest {
            deadlines,
            caps,
            surfaces,
        }),
    }
}
