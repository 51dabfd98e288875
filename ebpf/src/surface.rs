//! Typed surfaces (`pstack_envelope::Surface`) from one window's aggregates.
//!
//! Invariants: a surface is `truncated` (status and flag) exactly when the
//! kernel lost records for it (ring buffer or map full), a flow record was
//! lost or the flow map refused an event (aggregated mode), or a cap cut its
//! per-flow / per-task summaries; counts stay exact either way. In the
//! aggregated mode every TCP surface states its `sampling` (rate, records
//! sent / kept / dropped / lost) and lists its `rare_events` apart from the
//! `sample`. A capped raw
//! sample alone does not truncate (it is reported as `sample_truncated`).
//! Facts carry integers and strings only: cookies and absolute monotonic
//! times are decimal strings, offsets are signed ns from the window start.
//! A failure yields the same surface ids with the failure's status and cause,
//! never an empty `ok`.

use serde_json::{Map, Value, json};

use pstack_envelope::{StatusCause, Surface, SurfaceStatus};

use crate::aggregate::{Flow, ResetDirection, TcpAggregate, TcpSurface};
use crate::error::EbpfError;
use crate::offcpu::OffCpuWindow;
use crate::record::{OffCpuClass, TcpEvent, TcpEventKind, reset_reason_name};

/// Surface id of the off-CPU surface.
pub const OFFCPU_SURFACE: &str = "ebpf:offcpu";

/// The window the surfaces describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowMeta {
    /// CLOCK_MONOTONIC ns at start.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC ns at end.
    pub end_ns: u64,
    /// Requested window, ms (the surface deadline).
    pub window_ms: u64,
}

impl WindowMeta {
    fn offset(&self, ts: u64) -> i64 {
        (i128::from(ts) - i128::from(self.start_ns))
            .clamp(i128::from(i64::MIN / 2), i128::from(i64::MAX / 2)) as i64
    }
    fn elapsed_us(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns) / 1000
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn opt_str<T: ToString>(v: Option<T>) -> Value {
    v.map_or(Value::Null, |x| Value::String(x.to_string()))
}

fn flow_json(f: &Flow, s: TcpSurface, m: &WindowMeta) -> Value {
    let mut v = json!({
        "local": f.local.to_string(),
        "remote": f.remote.to_string(),
        "netns_ino": f.netns_ino.map_or(Value::Null, |n| json!(n)),
        "netns_cookie": opt_str(f.netns_cookie),
        "sock_cookie": opt_str(f.sock_cookie),
        "first_t_ns": m.offset(f.first_ns),
        "last_t_ns": m.offset(f.last_ns),
    });
    let o = v.as_object_mut().expect("json! object");
    match s {
        TcpSurface::Retransmits => {
            o.insert("retransmits".into(), json!(f.retransmits));
            o.insert("rtos".into(), json!(f.rtos));
            o.insert("fast_retransmits".into(), json!(f.fast_retransmits));
            o.insert("other_retransmits".into(), json!(f.other_retransmits));
        }
        TcpSurface::Resets => {
            o.insert("resets_sent".into(), json!(f.resets_sent));
            o.insert("resets_received".into(), json!(f.resets_received));
            o.insert("has_socket".into(), json!(f.has_sock));
            if let Some(r) = f.last_reset_reason {
                o.insert("last_sent_reason".into(), json!(reset_reason_name(r)));
            }
            // Who reset the stream, in words a person can act on.
            let who = match (f.resets_sent > 0, f.resets_received > 0) {
                (true, false) => {
                    format!("{} (this host) reset the stream to {}", f.local, f.remote)
                }
                (false, true) => format!("{} (peer) reset the stream to {}", f.remote, f.local),
                _ => format!("both {} and {} sent resets", f.local, f.remote),
            };
            o.insert("reset_by".into(), json!(who));
        }
        TcpSurface::Lifecycle => {
            o.insert("state_changes".into(), json!(f.state_changes));
            let tr: Vec<Value> = f
                .transitions
                .iter()
                .map(|t| json!({"t_ns": m.offset(t.ts_ns), "from": t.from.name(), "to": t.to.name()}))
                .collect();
            let mut seq: Vec<String> = f
                .transitions
                .first()
                .map(|t| t.from.name())
                .into_iter()
                .collect();
            seq.extend(f.transitions.iter().map(|t| t.to.name()));
            o.insert("transitions".into(), Value::Array(tr));
            o.insert("sequence".into(), json!(seq.join(">")));
            o.insert("transitions_dropped".into(), json!(f.transitions_dropped));
            if let (Some(a), Some(r)) = (f.bytes_acked, f.bytes_received) {
                o.insert("bytes_acked".into(), json!(a));
                o.insert("bytes_received".into(), json!(r));
            }
            let opened = f
                .transitions
                .iter()
                .find(|t| t.from.0 == 7 || t.from.0 == 10 || t.from.0 == 12);
            let closed = f.transitions.iter().rev().find(|t| t.to.0 == 7);
            if let (Some(o1), Some(c1)) = (opened, closed) {
                o.insert(
                    "lifetime_ns".into(),
                    json!(c1.ts_ns.saturating_sub(o1.ts_ns)),
                );
            }
        }
    }
    v
}

/// One raw event as a JSON fact (never the socket key: it is a kernel address).
pub fn event_json(e: &TcpEvent, m: &WindowMeta) -> Value {
    let mut v = json!({
        "t_ns": m.offset(e.ts_ns),
        "monotonic_ns": e.ts_ns.to_string(),
        "event": e.kind.as_str(),
        "local": e.local.to_string(),
        "remote": e.remote.to_string(),
        "state": e.state.name(),
        "on_cpu_pid": e.pid,
        "on_cpu_comm": e.comm.name(),
    });
    let o = v.as_object_mut().expect("json! object");
    if let Some(n) = e.netns_ino {
        o.insert("netns_ino".into(), json!(n));
    }
    if let Some(c) = e.sock_cookie {
        o.insert("sock_cookie".into(), json!(c.to_string()));
    }
    match e.kind {
        TcpEventKind::Retransmit => {
            if let Some(err) = e.detail {
                o.insert("err".into(), json!(err));
            }
        }
        TcpEventKind::SendReset | TcpEventKind::ReceiveReset => {
            let dir = if e.kind == TcpEventKind::SendReset {
                ResetDirection::Sent
            } else {
                ResetDirection::Received
            };
            let (sender, receiver) = match dir {
                ResetDirection::Sent => (e.local, e.remote),
                ResetDirection::Received => (e.remote, e.local),
            };
            o.insert("direction".into(), json!(dir.as_str()));
            o.insert("rst_sender".into(), json!(sender.to_string()));
            o.insert("rst_receiver".into(), json!(receiver.to_string()));
            if let Some(r) = e.detail {
                o.insert("reason".into(), json!(reset_reason_name(r)));
            }
            o.insert("has_socket".into(), json!(e.has_sock));
        }
        TcpEventKind::StateChange => {
            o.insert("new_state".into(), json!(e.new_state.map(|s| s.name())));
        }
    }
    v
}

/// What the aggregated mode sent for this surface, what it chose not to, and
/// what was refused: the basis of every count and of the sample. `null` in
/// the per-event mode (every event was a record).
fn sampling_json(agg: &TcpAggregate, s: TcpSurface) -> Value {
    let Some(k) = agg.sampling.filter(|_| agg.is_aggregated()) else {
        return Value::Null;
    };
    let mut rare = 0;
    let mut sampled = 0;
    let mut lost = 0;
    for (j, kind) in TcpEventKind::ALL.into_iter().enumerate() {
        if TcpSurface::of(kind) == s {
            rare += k.rare[j];
            sampled += k.sampled[j];
            lost += k.lost[j];
        }
    }
    let kept: Vec<Value> = agg.rare[s as usize]
        .iter()
        .map(|e| e.kind.as_str())
        .map(|k| json!(k))
        .collect();
    json!({
        "counts_from": "kernel per-flow aggregates (flow records at CLOSE, live flows read at window end) and records no flow took",
        "rare_records_always_sent": ["reset_sent", "reset_received", "state change leaving ESTABLISHED", "first retransmit of a flow"],
        "sample_one_in": k.one_in,
        "rare_records_sent": rare,
        "rare_records_kept": kept.len(),
        "rare_records_dropped": agg.rare_dropped[s as usize],
        "sampled_records_sent": sampled,
        "sampled_records_kept": agg.samples(s).len(),
        "sampled_records_dropped": agg.samples_dropped(s),
        "records_lost_in_kernel": lost,
        "flow_records": k.flow_records,
        "flow_records_lost": k.flow_records_lost,
        "flow_map_refused": k.flow_map_refused,
        "live_flows_read_at_end": k.flows_read_at_end,
    })
}

/// Per-surface context the aggregate does not hold.
#[derive(Debug, Clone, Default)]
pub struct TcpSurfaceContext {
    /// Kernel-lost events per surface (ring buffer full), in `TcpSurface::ALL` order.
    pub lost: [u64; 3],
    /// Port filter in force.
    pub port: Option<u16>,
    /// Address filter in force.
    pub addr: Option<std::net::IpAddr>,
}

/// The three TCP surfaces of a window.
pub fn tcp_surfaces(agg: &TcpAggregate, ctx: &TcpSurfaceContext, m: &WindowMeta) -> Vec<Surface> {
    TcpSurface::ALL
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let lost = ctx.lost[i];
            let cut = lost > 0 || agg.truncated(s);
            let kinds: Vec<TcpEventKind> =
                TcpEventKind::ALL.into_iter().filter(|k| TcpSurface::of(*k) == s).collect();
            let events: u64 = kinds.iter().map(|k| agg.seen(*k)).sum();
            let flows: Vec<Value> = agg.flows().iter().filter(|f| f.feeds(s)).map(|f| flow_json(f, s, m)).collect();
            let sample: Vec<Value> = agg.samples(s).iter().map(|e| event_json(e, m)).collect();
            let sampling = sampling_json(agg, s);
            let sampling_cut = agg.sampling.is_some_and(|k| k.flow_records_lost > 0 || k.flow_map_refused > 0);
            let cut = cut || sampling_cut;
            let tracepoints: Vec<&str> = kinds.iter().map(|k| k.tracepoint()).collect();
            let mut facts = json!({
                "window_ms": m.window_ms,
                "tracepoints": tracepoints,
                "events": events,
                "lost_events": lost,
                "flows": flows,
                "untracked_events": agg.untracked(s),
                "max_flows": agg.limits().max_flows,
                "sample": sample,
                "rare_events": agg.rare[s as usize].iter().map(|e| event_json(e, m)).collect::<Vec<_>>(),
                "sample_truncated": agg.samples_dropped(s) > 0,
                "sample_dropped": agg.samples_dropped(s),
                "mode": if agg.is_aggregated() { "aggregated" } else { "per_event" },
                "sampling": sampling,
                "filter": {
                    "port": ctx.port.map_or(Value::Null, |p| json!(p)),
                    "addr": opt_str(ctx.addr),
                },
            });
            if s == TcpSurface::Resets {
                let o = facts.as_object_mut().expect("json! object");
                o.insert("sent".into(), json!(agg.seen(TcpEventKind::SendReset)));
                o.insert("received".into(), json!(agg.seen(TcpEventKind::ReceiveReset)));
            }
            let raw = agg.raw(s);
            Surface {
                id: s.id().into(),
                authority: format!("ebpf:tracepoint/{}", tracepoints.join(",tracepoint/")),
                status: if cut { SurfaceStatus::Truncated } else { SurfaceStatus::Ok },
                cause: cut.then(|| StatusCause {
                    errno: None,
                    message: if agg.is_aggregated() {
                        let k = agg.sampling.unwrap_or_default();
                        format!(
                            "{lost} event records and {} flow records lost in the kernel (ring buffer full), {} events refused by the flow map, {} events not in any flow summary (flow map eviction, a lost flow record, or the flow cap {})",
                            k.flow_records_lost,
                            k.flow_map_refused,
                            agg.untracked(s),
                            agg.limits().max_flows
                        )
                    } else {
                        format!(
                            "{lost} events lost in the kernel (ring buffer full), {} not summarized (flow cap {})",
                            agg.untracked(s),
                            agg.limits().max_flows
                        )
                    },
                }),
                deadline_ms: m.window_ms,
                elapsed_us: m.elapsed_us(),
                digest: raw.digest(),
                bytes: raw.bytes,
                truncated: cut,
                facts: obj(facts),
            }
        })
        .collect()
}

fn per_class(values: &[u64; crate::record::OFF_CLASSES]) -> Value {
    let mut m = Map::new();
    for c in OffCpuClass::ALL {
        m.insert(c.as_str().into(), json!(values[c as usize]));
    }
    Value::Object(m)
}

/// The off-CPU surface of a window.
pub fn offcpu_surface(w: &OffCpuWindow, m: &WindowMeta) -> Surface {
    let cut = w.counters.lost() > 0 || w.tasks_dropped > 0;
    let tasks: Vec<Value> = w
        .tasks
        .iter()
        .map(|t| {
            json!({
                "tid": t.tid,
                "tgid": t.totals.tgid,
                "comm": t.totals.comm,
                "off_cpu_ns": per_class(&t.totals.ns),
                "intervals": per_class(&t.totals.count),
                "max_ns": per_class(&t.totals.max_ns),
            })
        })
        .collect();
    let episodes: Vec<Value> = w
        .episodes
        .iter()
        .map(|e| {
            json!({
                "tid": e.tid,
                "tgid": e.tgid,
                "comm": e.comm,
                "start_t_ns": m.offset(e.start_ns),
                "start_monotonic_ns": e.start_ns.to_string(),
                "duration_ns": e.duration_ns,
                "ongoing": e.ongoing,
                "frozen": e.frozen,
                "since_before_watch": e.since_before_watch,
                "waker_tid": e.waker_tid.map_or(Value::Null, |w| json!(w)),
                "stack": e.stack,
            })
        })
        .collect();
    let facts = json!({
        "window_ms": m.window_ms,
        "tracepoints": ["sched/sched_switch", "sched/sched_wakeup"],
        "watched_pids": w.watched,
        "watch_all": w.watch_all,
        "d_min_ns": w.d_min_ns,
        "tasks": tasks,
        "tasks_dropped": w.tasks_dropped,
        "d_episodes": episodes,
        "episodes_completed": w.episodes_completed,
        "episodes_dropped": w.episodes_dropped,
        "switches": w.counters.switches,
        "lost": {
            "ring_buffer": w.counters.lost_ring,
            "start_map_full": w.counters.lost_start,
            "totals_map_full": w.counters.lost_totals,
        },
    });
    Surface {
        id: OFFCPU_SURFACE.into(),
        authority: "ebpf:tracepoint/sched/sched_switch,tracepoint/sched/sched_wakeup".into(),
        status: if cut {
            SurfaceStatus::Truncated
        } else {
            SurfaceStatus::Ok
        },
        cause: cut.then(|| StatusCause {
            errno: None,
            message: format!(
                "{} events lost in the kernel (maps or ring buffer full), {} tasks beyond the cap",
                w.counters.lost(),
                w.tasks_dropped
            ),
        }),
        deadline_ms: m.window_ms,
        elapsed_us: m.elapsed_us(),
        digest: w.raw.digest(),
        bytes: w.raw.bytes,
        truncated: cut,
        facts: obj(facts),
    }
}

/// The given surface ids, all carrying a failure's status and cause.
pub fn failed_surfaces(
    err: &EbpfError,
    ids: &[&str],
    deadline_ms: u64,
    elapsed_us: u64,
) -> Vec<Surface> {
    ids.iter()
        .map(|id| {
            Surface::unread(
                *id,
                "ebpf:pstack-ebpf",
                deadline_ms,
                elapsed_us,
                err.status(),
                StatusCause {
                    errno: err.errno(),
                    message: err.to_string(),
                },
            )
        })
        .collect()
}

/// Every TCP surface id.
pub fn tcp_surface_ids() -> Vec<&'static str> {
    TcpSurface::ALL.iter().map(|s| s.id()).collect()
}
