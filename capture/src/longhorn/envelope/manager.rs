//! What the Longhorn manager reports at window start and end, and the
//! settings that bound a failure. Sections of [`super::transfer_envelope`].

use pstack_envelope::surface_id::storage_transfer::STREAMS;
use pstack_envelope::{
    ClaimCode, ClaimKind, Envelope, Subject, Surface, SurfaceStatus, sha256_digest,
};
use serde_json::{Map, json};

use super::{Cx, Out, Readings, endpoints, failed, role_in, volume_facts, volume_of};
use crate::longhorn::client::API_DEADLINE;
use crate::longhorn::flows::FlowRole;
use crate::longhorn::model::{RebuildEntry, Volume, parse_error_addrs};

/// Manager reads, start and end (and the instance managers'): their surfaces and volumes.
pub(super) fn manager_reads(r: &Readings, stripped_v1: bool, o: &mut Out) -> [Option<Volume>; 2] {
    let mut volumes: [Option<Volume>; 2] = [None, None];
    for (i, (id, read)) in [
        ("longhorn/manager/start", &r.start),
        ("longhorn/manager/end", &r.end),
    ]
    .into_iter()
    .enumerate()
    {
        let Some(read) = read else { continue };
        let auth = format!("http:GET {}", read.url);
        match volume_of(read) {
            Ok((v, body)) => {
                o.surfaces.push(Surface::read(
                    id,
                    auth,
                    API_DEADLINE.as_millis() as u64,
                    read.elapsed_us,
                    Some((sha256_digest(body), body.len() as u64)),
                    volume_facts(&v, read, stripped_v1),
                ));
                volumes[i] = Some(v);
            }
            Err(e) => o.surfaces.push(failed(id, auth, read, e)),
        }
    }
    for (im, read) in &r.ims {
        let id = format!("longhorn/instancemanager/{im}");
        let auth = format!("http:GET {}", read.url);
        match read
            .result
            .as_ref()
            .map_err(|f| (f.status, f.errno, f.message.clone()))
            .and_then(|b| {
                crate::longhorn::model::parse_instance_manager(b)
                    .map(|blocks| (blocks, b))
                    .map_err(|e| (SurfaceStatus::Error, None, e.to_string()))
            }) {
            Ok((blocks, body)) => {
                let mut facts = Map::new();
                facts.insert("read_at".into(), json!(read.at));
                facts.insert("port_blocks".into(), json!(blocks));
                o.surfaces.push(Surface {
                    id,
                    authority: auth,
                    status: SurfaceStatus::Ok,
                    cause: None,
                    deadline_ms: API_DEADLINE.as_millis() as u64,
                    elapsed_us: read.elapsed_us,
                    digest: Some(sha256_digest(body)),
                    bytes: body.len() as u64,
                    truncated: false,
                    facts,
                });
            }
            Err(e) => o.surfaces.push(failed(&id, auth, read, e)),
        }
    }
    volumes
}

/// What the manager reports, and what it no longer reports.
pub(super) fn manager_reports(
    cx: Cx,
    volumes: &[Option<Volume>; 2],
    roles: &[(&Envelope, FlowRole)],
    target_name: &Option<String>,
    o: &mut Out,
) -> (bool, Option<RebuildEntry>) {
    let Cx { a, r, .. } = cx;
    let streams = &r.streams;
    let role_of = |digest: &str| role_in(roles, digest);
    let mut terminal = false;
    let seen_start = volumes[0].as_ref().and_then(|v| {
        let t = target_name.as_deref()?;
        v.rebuild.iter().find(|e| e.replica == t).cloned()
    });
    for (i, sid) in ["longhorn/manager/start", "longhorn/manager/end"]
        .iter()
        .enumerate()
    {
        let Some(v) = &volumes[i] else { continue };
        let at = [&r.start, &r.end][i]
            .as_ref()
            .map(|x| x.at.clone())
            .unwrap_or_default();
        let when = if i == 0 { "window start" } else { "window end" };
        let entries: Vec<String> = v
            .rebuild
            .iter()
            .map(|e| {
                format!(
                    "{} from {} state {:?} progress {} (isRebuilding {:?}){}",
                    e.replica,
                    if e.from.is_empty() {
                        "?".into()
                    } else {
                        e.from.join("+")
                    },
                    e.state.as_str(),
                    e.progress
                        .map(|p| p.to_string())
                        .unwrap_or_else(|| "?".into()),
                    e.is_rebuilding,
                    if e.error.is_empty() {
                        String::new()
                    } else {
                        format!(", error {:?}", e.error)
                    }
                )
            })
            .collect();
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornManagerReportsRebuild,
            format!(
                "at {when} ({at}) the Longhorn manager reports for volume {} (state {}, robustness {}): {}",
                a.volume,
                v.state,
                v.robustness,
                if entries.is_empty() { "rebuildStatus [] (no replica is in WO mode now)".to_string() } else { entries.join("; ") }
            ),
            &[sid],
            None,
        );
        for e in &v.rebuild {
            if e.state.terminal() {
                terminal = true;
            }
            if e.error.is_empty() {
                continue;
            }
            let addrs = parse_error_addrs(&e.error);
            for (x, y) in &addrs.pairs {
                let hit = streams.flows.iter().find(|s| {
                    endpoints(s)
                        .is_some_and(|(l, rm)| (l == *x && rm == *y) || (l == *y && rm == *x))
                });
                let cause = addrs.cause.clone().unwrap_or_else(|| "an error".into());
                match hit {
                    Some(s) => {
                        let flow = match &s.subject {
                            Subject::NetworkStream(n) => n.flow_id.clone(),
                            _ => String::new(),
                        };
                        o.claim(
                            ClaimKind::Fact,
                            ClaimCode::LonghornErrorNamesStream,
                            format!(
                                "Longhorn reports {cause} on {x}→{y} (replica {}, {when}); this is flow {flow}, role {}, stream envelope {}",
                                e.replica,
                                role_of(&s.digest).map(FlowRole::as_str).unwrap_or("?"),
                                s.digest
                            ),
                            &[sid, STREAMS],
                            None,
                        );
                    }
                    None => o.claim(
                        ClaimKind::Fact,
                        ClaimCode::LonghornErrorNamesUnlinkedConnection,
                        format!(
                            "Longhorn reports {cause} on {x}→{y} (replica {}, {when}); no stream linked here has that address pair (it closed before the window, or is captured on the other node)",
                            e.replica
                        ),
                        &[sid, STREAMS],
                        None,
                    ),
                }
            }
        }
    }
    (terminal, seen_start)
}

/// The Longhorn settings that bound each failure.
pub(super) fn settings_section(r: &Readings, o: &mut Out) {
    if let Some(read) = &r.settings {
        let parsed = read
            .result
            .as_ref()
            .map_err(|f| (f.status, f.errno, f.message.clone()))
            .and_then(|b| {
                crate::longhorn::model::parse_settings(b)
                    .map(|m| (m, b))
                    .map_err(|e| (SurfaceStatus::Error, None, format!("GET {}: {e}", read.url)))
            });
        match parsed {
            Ok((all, body)) => {
                let mut facts = Map::new();
                facts.insert("read_at".into(), json!(read.at));
                let mut said = Vec::new();
                for name in crate::longhorn::model::BOUNDING_SETTINGS {
                    let v = all.get(name);
                    facts.insert(name.into(), json!(v));
                    said.push(match v {
                        Some(v) => format!("{name} {v:?}"),
                        None => format!("{name} not set on this manager"),
                    });
                }
                o.surfaces.push(Surface::read(
                    "longhorn/settings",
                    format!("longhorn-manager:GET {}", read.url),
                    API_DEADLINE.as_millis() as u64,
                    read.elapsed_us,
                    Some((sha256_digest(body), body.len() as u64)),
                    facts,
                ));
                o.claim(
                    ClaimKind::Fact,
                    ClaimCode::LonghornSettingsBoundFailures,
                    format!(
                        "the settings that bound a rebuild's failure: {} (engine-replica-timeout: seconds before the engine marks a replica ERR; replica-file-sync-http-client-timeout: seconds of the sync agents' HTTP transfer; long-grpc-timeout: seconds of FilesSync; replica-rebuild-concurrent-sync-limit: sources per rebuild from v1.11; storage-network: \"\" is the pod network)",
                        said.join(", ")
                    ),
                    &["longhorn/settings"],
                    None,
                );
            }
            Err(e) => o.surfaces.push(failed(
                "longhorn/settings",
                format!("longhorn-manager:GET {}", read.url),
                read,
                e,
            )),
        }
    }
}
