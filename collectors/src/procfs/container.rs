//! Container and pod identity from a process's cgroup path.
//!
//! On a Kubernetes node the kubelet and the container runtime name cgroups
//! after what they hold, so `/proc/<pid>/cgroup` alone tells which container
//! a process runs in and which pod that container belongs to. Only what the
//! path spells is reported: a runtime the path does not name is `None`, a
//! process in no recognised container gets no facts at all — never a guess.
//!
//! Naming schemes recognised (any cgroup version; a prefix such as a nested
//! node's own cgroup is allowed before them):
//!
//! | driver   | pod component                                  | container component                  |
//! |----------|------------------------------------------------|--------------------------------------|
//! | systemd  | `kubepods[-QOS]-pod<uid, _ for ->.slice`       | `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope` |
//! | cgroupfs | `pod<uid>` under `kubepods[/QOS]`              | `<id>`, `crio-<id>`, `docker-<id>`   |
//!
//! and, outside Kubernetes, Docker's `docker-<id>.scope` / `/docker/<id>` and
//! Podman's `libpod-<id>.scope`. `<id>` is 64 lowercase hex digits. A pod UID
//! is a UUID, or 32 hex digits for a static pod (the kubelet hashes its
//! manifest). CRI-O's `crio-conmon-<id>.scope` holds the runtime's monitor,
//! not the container, and is not attributed to it.

use serde::{Deserialize, Serialize};

use std::path::Path;

use super::raw::{ReadError, Reading, read_seq_capped};

/// What a cgroup path says about the container a process runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFacts {
    /// The container ID (64 hex digits), as the runtime names it.
    pub container_id: String,
    /// `containerd`, `cri-o`, `docker` or `podman`; `None` when the path is
    /// a bare ID (kubelet's cgroupfs driver with containerd or Docker).
    pub runtime: Option<String>,
    /// The pod's UID (dashed UUID, or 32 hex digits for a static pod);
    /// `None` outside Kubernetes.
    pub pod_uid: Option<String>,
    /// The pod's QoS class from its cgroup parent: `guaranteed`,
    /// `burstable` or `besteffort`; `None` outside Kubernetes.
    pub qos_class: Option<String>,
    /// `systemd` (`.slice`/`.scope` names) or `cgroupfs`.
    pub cgroup_driver: String,
    /// The cgroup path the facts were read from.
    pub cgroup: String,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A pod UID in dashed form, or `None` if `s` is not one.
fn pod_uid(s: &str) -> Option<String> {
    let dashed = s.replace('_', "-");
    let parts: Vec<&str> = dashed.split('-').collect();
    let uuid = parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| is_hex(p, n));
    (uuid || is_hex(&dashed, 32)).then_some(dashed)
}

/// `(runtime, id)` from a container component, if it is one.
fn container_component(c: &str) -> Option<(Option<&'static str>, String, &'static str)> {
    if let Some(scope) = c.strip_suffix(".scope") {
        for (prefix, runtime) in [
            ("cri-containerd-", "containerd"),
            ("crio-", "cri-o"),
            ("docker-", "docker"),
            ("libpod-", "podman"),
        ] {
            if let Some(id) = scope.strip_prefix(prefix)
                && is_hex(id, 64)
            {
                return Some((Some(runtime), id.to_string(), "systemd"));
            }
        }
        return None;
    }
    for (prefix, runtime) in [("crio-", "cri-o"), ("docker-", "docker")] {
        if let Some(id) = c.strip_prefix(prefix)
            && is_hex(id, 64)
        {
            return Some((Some(runtime), id.to_string(), "cgroupfs"));
        }
    }
    is_hex(c, 64).then(|| (None, c.to_string(), "cgroupfs"))
}

/// `(uid, qos)` from a pod component and the components above it.
fn pod_component(c: &str, parent: Option<&str>) -> Option<(String, String)> {
    if let Some(slice) = c.strip_suffix(".slice") {
        // kubepods-pod<uid>.slice / kubepods-<qos>-pod<uid>.slice
        let rest = slice.strip_prefix("kubepods-")?;
        let (qos, uid) = match rest.split_once("pod") {
            Some(("", uid)) => ("guaranteed", uid),
            Some(("burstable-", uid)) => ("burstable", uid),
            Some(("besteffort-", uid)) => ("besteffort", uid),
            _ => return None,
        };
        return Some((pod_uid(uid)?, qos.to_string()));
    }
    let uid = pod_uid(c.strip_prefix("pod")?)?;
    let qos = match parent? {
        "kubepods" => "guaranteed",
        "burstable" => "burstable",
        "besteffort" => "besteffort",
        _ => return None,
    };
    Some((uid, qos.to_string()))
}

/// The container facts one cgroup path spells, if any.
pub fn parse_cgroup_path(path: &str) -> Option<ContainerFacts> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    // The innermost container component: a runtime's own sub-cgroups
    // (e.g. `init.scope` under a container) stay attributed to it.
    let (at, (runtime, id, driver)) = comps
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, c)| container_component(c).map(|v| (i, v)))?;
    let pod = comps[..at].iter().enumerate().rev().find_map(|(i, c)| {
        let parent = i.checked_sub(1).map(|p| comps[p]);
        pod_component(c, parent)
    });
    // A cgroupfs bare ID is a container only under a pod or docker's parent:
    // any 64-hex directory name is not evidence of a container by itself.
    if runtime.is_none() && pod.is_none() {
        if at > 0 && comps[at - 1] == "docker" {
            return Some(ContainerFacts {
                container_id: id,
                runtime: Some("docker".into()),
                pod_uid: None,
                qos_class: None,
                cgroup_driver: driver.into(),
                cgroup: path.to_string(),
            });
        }
        return None;
    }
    let (pod_uid, qos_class) = match pod {
        Some((u, q)) => (Some(u), Some(q)),
        None => (None, None),
    };
    Some(ContainerFacts {
        container_id: id,
        runtime: runtime.map(str::to_string),
        pod_uid,
        qos_class,
        cgroup_driver: driver.into(),
        cgroup: path.to_string(),
    })
}

/// The container facts of an identity's `cgroup` text (the lines of
/// `/proc/<pid>/cgroup` joined by `;`). The unified (v2) line is preferred;
/// otherwise the first v1 hierarchy whose path names a container.
pub fn parse_cgroup(cgroup: &str) -> Option<ContainerFacts> {
    let mut v1 = None;
    for line in cgroup.split(';') {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Some(facts) = parse_cgroup_path(path) else {
            continue;
        };
        if controllers.is_empty() {
            return Some(facts);
        }
        v1.get_or_insert(facts);
    }
    v1
}

/// Read a `/proc/<pid>/cgroup` file and parse it: `Ok` with `None` facts
/// when the process is in no recognised container.
pub fn read_container(
    cgroup_file: &Path,
    max_bytes: u64,
) -> Result<Reading<Option<ContainerFacts>>, ReadError> {
    let raw = read_seq_capped(cgroup_file, max_bytes)?;
    let text = super::parse::join_cgroup(&raw.bytes);
    Ok(Reading {
        facts: parse_cgroup(&text),
        raw: raw.meta(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904a1b2c3d4e5f60718293a4b5c";
    const UID: &str = "0f3b9f6e-2d1c-4e7a-9b8c-5d6e7f8a9b0c";

    /// (id, runtime, pod uid, qos, driver).
    type Got = (
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        String,
    );
    /// (path, runtime, pod uid, qos, driver).
    type Row = (
        String,
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
        &'static str,
    );

    fn facts(path: &str) -> Option<Got> {
        parse_cgroup_path(path).map(|f| {
            (
                f.container_id,
                f.runtime,
                f.pod_uid,
                f.qos_class,
                f.cgroup_driver,
            )
        })
    }

    #[test]
    fn each_naming_scheme_gives_container_and_pod() {
        let us = UID.replace('-', "_");
        let table: Vec<Row> = vec![
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice/cri-containerd-{ID}.scope"
                ),
                Some("containerd"),
                Some(UID),
                Some("burstable"),
                "systemd",
            ),
            (
                format!("/kubepods.slice/kubepods-pod{us}.slice/crio-{ID}.scope"),
                Some("cri-o"),
                Some(UID),
                Some("guaranteed"),
                "systemd",
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{us}.slice/docker-{ID}.scope"
                ),
                Some("docker"),
                Some(UID),
                Some("besteffort"),
                "systemd",
            ),
            (
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                None,
                Some(UID),
                Some("burstable"),
                "cgroupfs",
            ),
            (
                format!("/kubepods/pod{UID}/crio-{ID}"),
                Some("cri-o"),
                Some(UID),
                Some("guaranteed"),
                "cgroupfs",
            ),
            (
                format!("/kubepods/besteffort/pod{UID}/docker-{ID}"),
                Some("docker"),
                Some(UID),
                Some("besteffort"),
                "cgroupfs",
            ),
            (
                format!("/system.slice/docker-{ID}.scope"),
                Some("docker"),
                None,
                None,
                "systemd",
            ),
            (
                format!("/docker/{ID}"),
                Some("docker"),
                None,
                None,
                "cgroupfs",
            ),
            (
                format!("/machine.slice/libpod-{ID}.scope"),
                Some("podman"),
                None,
                None,
                "systemd",
            ),
            // A nested node (kind): the node's own cgroup before kubepods.
            (
                format!(
                    "/docker/{}/kubepods/burstable/pod{UID}/{ID}",
                    "a".repeat(64)
                ),
                None,
                Some(UID),
                Some("burstable"),
                "cgroupfs",
            ),
        ];
        for (path, runtime, pod, qos, driver) in table {
            assert_eq!(
                facts(&path),
                Some((
                    ID.to_string(),
                    runtime.map(str::to_string),
                    pod.map(str::to_string),
                    qos.map(str::to_string),
                    driver.to_string()
                )),
                "{path}"
            );
        }
    }

    #[test]
    fn static_pod_uid_is_32_hex() {
        let uid = "6e9e5b3a3a1f1c7f0a8e4a2e2b1f3d4c";
        let f = parse_cgroup_path(&format!("/kubepods/burstable/pod{uid}/{ID}")).unwrap();
        assert_eq!(f.pod_uid.as_deref(), Some(uid));
    }

    #[test]
    fn no_container_no_facts() {
        for path in [
            "/",
            "/user.slice/user-1000.slice/session-3.scope",
            "/system.slice/pstackd.service",
            // conmon is CRI-O's monitor, not the container.
            &format!(
                "/kubepods.slice/kubepods-pod{}.slice/crio-conmon-{ID}.scope",
                UID.replace('-', "_")
            ),
            // A pod's own cgroup (the pause process's parent) names no container.
            &format!("/kubepods/burstable/pod{UID}"),
            // Any 64-hex directory is not a container by itself.
            &format!("/scratch/{ID}"),
            // Wrong lengths and case.
            &format!("/docker/{}", &ID[..63]),
            &format!("/docker/{}", ID.to_uppercase()),
            &format!("/kubepods/burstable/pod{}/{ID}", &UID[..35]),
        ] {
            assert_eq!(facts(path), None, "{path}");
        }
    }

    #[test]
    fn unified_line_wins_then_first_v1() {
        let v1 = format!("/kubepods/burstable/pod{UID}/{ID}");
        let other = "b".repeat(64);
        let text = format!(
            "12:memory:{v1};1:name=systemd:/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{other}.scope;0::/",
            UID.replace('-', "_")
        );
        assert_eq!(parse_cgroup(&text).unwrap().container_id, ID);
        let text = format!("12:memory:/;0::/system.slice/docker-{other}.scope");
        assert_eq!(parse_cgroup(&text).unwrap().container_id, other);
        assert_eq!(parse_cgroup("0::/init.scope"), None);
        assert_eq!(parse_cgroup(""), None);
    }
}
