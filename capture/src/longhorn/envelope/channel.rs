//! The #13703 check of the idle control channels: a section of
//! [`super::transfer_envelope`].

use pstack_envelope::{ClaimCode, ClaimKind, Envelope, Surface, SurfaceStatus};
use serde_json::{Map, Value, json};

use super::{ChannelSockopts, IdleHazard, Out, endpoints, idle_hazard};
use crate::longhorn::flows::FlowRole;
use crate::longhorn::topology::Topology;
use crate::transport;

/// #13703: an idle gRPC channel's keepalive against its user timeout,
/// judged on the side that aborts: grpc-go sets TCP_USER_TIMEOUT (20 s)
/// only on the server's accepted socket (`internal/transport/http2_server.go`);
/// Longhorn's replica client sets none. So for sync_control (T→S:P_S+2,
/// `FileSend`) it is S's sync agent's socket, and for files_sync
/// (E→T:P_T+2, `FilesSync`, idle for the whole rebuild) T's.
pub(super) fn control_channel(
    roles: &[(&Envelope, FlowRole)],
    topo: Option<&Topology>,
    o: &mut Out,
) {
    let mut ctl_opts = Vec::new();
    for (e, role) in roles {
        if *role != FlowRole::SyncControl && *role != FlowRole::FilesSync {
            continue;
        }
        let Some(so) = e
            .surfaces
            .iter()
            .find(|s| s.id == "tcp/sockopt" && s.status == SurfaceStatus::Ok)
        else {
            continue;
        };
        let g = |k: &str| so.facts.get(k).and_then(Value::as_i64).unwrap_or(0);
        let server = if *role == FlowRole::SyncControl {
            topo.and_then(|t| t.source.as_ref())
        } else {
            topo.and_then(|t| t.target.as_ref())
        }
        .and_then(|p| p.block)
        .map(|b| b.start.saturating_add(2));
        let local_port = endpoints(e).map(|(l, _)| l.port());
        let o_ = ChannelSockopts {
            keepalive: so
                .facts
                .get("keepalive")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            user_timeout_ms: g("user_timeout_ms"),
            keepidle_s: g("keepidle_s"),
            keepintvl_s: g("keepintvl_s"),
            server_side: server.is_some() && server == local_port,
        };
        ctl_opts.push((e, *role, o_, idle_hazard(&o_)));
    }
    if !ctl_opts.is_empty() {
        let mut f = Map::new();
        f.insert(
            "idle_channel_sockopts".into(),
            Value::Array(
                ctl_opts
                    .iter()
                    .map(|(e, role, s, h)| json!({"digest": e.digest, "role": role.as_str(), "server_side": s.server_side, "keepalive": s.keepalive, "user_timeout_ms": s.user_timeout_ms, "keepidle_s": s.keepidle_s, "keepintvl_s": s.keepintvl_s, "hazard": h.as_str()}))
                    .collect(),
            ),
        );
        o.surfaces.push(Surface {
            id: "longhorn/control_channel".into(),
            authority:
                "pstack: tcp/sockopt of the linked sync_control and files_sync stream envelopes"
                    .into(),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: transport::SURFACE_DEADLINE_MS,
            elapsed_us: 0,
            digest: None,
            bytes: 0,
            truncated: false,
            facts: f,
        });
    }
    for (e, role, s, h) in &ctl_opts {
        let (ut, idle, intvl) = (s.user_timeout_ms, s.keepidle_s, s.keepintvl_s);
        let (server, channel) = if *role == FlowRole::SyncControl {
            ("the source's sync agent (S:P_S+2)", "FileSend")
        } else {
            ("the target's sync agent (T:P_T+2)", "FilesSync")
        };
        match h {
            IdleHazard::Hazardous => o.claim(
                ClaimKind::Hypothesis,
                ClaimCode::ControlChannelUserTimeoutBelowKeepaliveRetry,
                format!(
                    "the idle {channel} channel's server side here, {server} (stream {}, role {}), sends its first keepalive probe after {idle} s idle and the next {intvl} s later, but TCP_USER_TIMEOUT is {ut} ms: one unanswered probe (a single lost ACK) outlives the user timeout and this side's kernel aborts the channel (ETIMEDOUT) and resets it; the gRPC client at the other end reads `connection reset by peer` and the rebuild fails — the #13703 pattern (grpc-go sets 20 s TCP_USER_TIMEOUT on accepted connections, Go's listener keepalive is 15 s; longhorn-engine app/cmd/sync_agent.go v1.9.0 uses a plain net.Listen)",
                    e.digest,
                    role.as_str()
                ),
                &["longhorn/control_channel"],
                Some(format!(
                    "the channel survives an unanswered keepalive probe for longer than {ut} ms (drop the peer's ACKs for {} s: it stays ESTABLISHED), or the reset that ended it was received from the peer (eBPF tcp_receive_reset) rather than raised by this side's timer",
                    idle + intvl
                )),
            ),
            IdleHazard::PostFixOsKeepalive => o.claim(
                ClaimKind::Fact,
                ClaimCode::ControlChannelKeepaliveNotHazardous,
                format!(
                    "the idle {channel} channel's server side here (stream {}) keeps the OS keepalive ({idle} s idle, {intvl} s interval) with TCP_USER_TIMEOUT {ut} ms: the first probe comes only after {idle} s idle, so the #13703 abort needs an unanswered probe after that long — the settings of upstream's fix (longhorn-engine master \"preserve OS TCP keepalive settings\"), not the 15 s/20 s hazard",
                    e.digest
                ),
                &["longhorn/control_channel"],
                None,
            ),
            IdleHazard::ClientSide => o.claim(
                ClaimKind::Fact,
                ClaimCode::ControlChannelClientSide,
                format!(
                    "stream {} is the gRPC client's end of the idle {channel} channel (keepalive {}, TCP_USER_TIMEOUT {ut} ms): grpc-go sets its user timeout only on the server's accepted socket, so a #13703 abort would be raised by {server}, not here — capture on that node to read its socket options",
                    e.digest, s.keepalive
                ),
                &["longhorn/control_channel"],
                None,
            ),
            IdleHazard::NoUserTimeout | IdleHazard::NoKeepalive | IdleHazard::Safe => {}
        }
    }
}
