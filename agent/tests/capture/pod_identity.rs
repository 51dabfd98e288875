//! Pod-aware subjects: a real process moved into a real cgroup named the way
//! the kubelet (systemd driver) and containerd name a pod's container gets a
//! `proc/container` surface with the container ID and pod UID, and a
//! `k8s/pod` surface typed `unsupported` (no kubelet endpoint configured);
//! a process outside any container gets neither. Needs root to create the
//! cgroup and move the process (fails under CI without it).

use pstack_envelope::SurfaceStatus;

use pstack_capture::process::{self, Target};

use crate::fixtures::{Proc, budget, capture_pid, config, is_root, request, surface};

const ID: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
const UID: &str = "d4735e3a-265e-4d6e-8f41-6b2c7c3a9e10";

fn cgroup2_mount() -> std::path::PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split(' ').next() == Some("cgroup2"))
                .then(|| pre.split(' ').nth(4).unwrap().into())
        })
        .expect("no cgroup2 mount")
}

/// Capture a `sleep` moved into a kubelet-named (systemd driver,
/// containerd) cgroup, with `kubelet_url` configured or not; the cgroup is
/// removed before returning.
fn capture_in_pod(kubelet_url: Option<String>) -> pstack_envelope::Envelope {
    let mount = cgroup2_mount();
    let base = mount.join(format!(
        "pstack-test-pod-{}-{}",
        std::process::id(),
        kubelet_url.is_some()
    ));
    let rel = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
        UID.replace('-', "_")
    );
    let dir = base.join(&rel);
    std::fs::create_dir_all(&dir).unwrap();
    let p = Proc::spawn("sleep", &["1000"]);
    let origin = std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid())).unwrap();
    let origin = origin
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .to_string();
    std::fs::write(dir.join("cgroup.procs"), p.pid().to_string()).unwrap();

    let mut config = config();
    config.kubelet_url = kubelet_url;
    let tmp = tempfile::tempdir().unwrap();
    let env = process::capture(
        &request(Target::Process { pid: p.pid() }, 2000, 10_000),
        &config,
        &budget(tmp.path(), 4),
    );
    // Out again and clean up before asserting (a failed assert leaves no cgroup).
    std::fs::write(
        mount
            .join(origin.trim_start_matches('/'))
            .join("cgroup.procs"),
        p.pid().to_string(),
    )
    .unwrap();
    drop(p);
    let mut d = dir.clone();
    while d.starts_with(&base) {
        let _ = std::fs::remove_dir(&d);
        d = d.parent().unwrap().to_path_buf();
    }
    env.unwrap()
}

fn root_or_skip() -> bool {
    pstack_testkit::precondition(is_root(), "needs root to create cgroups")
}

#[test]
fn root_process_in_a_pod_cgroup_has_container_and_pod_surfaces() {
    if !root_or_skip() {
        return;
    }
    let env = capture_in_pod(None);
    let c = surface(&env, "proc/container");
    assert_eq!(c.status, SurfaceStatus::Ok, "{c:?}");
    assert_eq!(c.facts["container_id"], ID);
    assert_eq!(c.facts["pod_uid"], UID);
    assert_eq!(c.facts["runtime"], "containerd");
    assert_eq!(c.facts["qos_class"], "burstable");
    assert!(c.digest.is_some() && c.bytes > 0, "{c:?}");
    let pod = surface(&env, "k8s/pod");
    assert_eq!(pod.status, SurfaceStatus::Unsupported, "{pod:?}");
    assert!(pod.facts.is_empty(), "no pod name is guessed: {pod:?}");
    let cause = &pod.cause.as_ref().unwrap().message;
    assert!(
        cause.contains(UID) && cause.contains("crictl inspect"),
        "{cause}"
    );
}

/// A kubelet read-only endpoint on loopback: answers every request with
/// `body` (a real-shaped v1.PodList), counting the `GET /pods` it saw.
fn kubelet(body: String) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let _ = tx.send(request_line.trim().to_string());
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, rx)
}

fn pod_list(uid: &str) -> String {
    format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[{{"metadata":{{"name":"web-0","namespace":"shop","uid":"{uid}","creationTimestamp":"2026-12-03T07:00:00Z","labels":{{"app":"web"}}}},"spec":{{"nodeName":"node-a","containers":[{{"name":"app","image":"nginx:1.27"}}]}},"status":{{"phase":"Running","podIP":"10.244.1.7","containerStatuses":[{{"name":"app","ready":true,"restartCount":0,"image":"nginx:1.27","containerID":"containerd://{ID}","state":{{"running":{{"startedAt":"2026-12-03T07:00:02Z"}}}}}}]}}}}]}}"#
    )
}

#[test]
fn root_kubelet_pod_list_names_the_pod_namespace_and_container() {
    if !root_or_skip() {
        return;
    }
    let (url, requests) = kubelet(pod_list(UID));
    let env = capture_in_pod(Some(url.clone()));
    assert_eq!(requests.try_recv().unwrap(), "GET /pods HTTP/1.1");
    let pod = surface(&env, "k8s/pod");
    assert_eq!(pod.status, SurfaceStatus::Ok, "{pod:?}");
    assert_eq!(pod.authority, format!("kubelet:{url}/pods"));
    assert_eq!(pod.facts["pod_name"], "web-0");
    assert_eq!(pod.facts["namespace"], "shop");
    assert_eq!(pod.facts["container_name"], "app");
    assert_eq!(pod.facts["node_name"], "node-a");
    assert!(pod.digest.is_some() && pod.bytes > 0);

    // A pod list without this pod: an error naming why, no facts.
    let (url, _requests) = kubelet(pod_list("00000000-0000-4000-8000-000000000000"));
    let env = capture_in_pod(Some(url));
    let pod = surface(&env, "k8s/pod");
    assert_eq!(pod.status, SurfaceStatus::Error, "{pod:?}");
    assert!(pod.facts.is_empty());
    assert!(pod.cause.as_ref().unwrap().message.contains(UID), "{pod:?}");
}

#[test]
fn process_outside_any_container_has_no_pod_facts() {
    let p = Proc::spawn("sleep", &["1000"]);
    let env = capture_pid(p.pid());
    let ids: Vec<&str> = env.surfaces.iter().map(|s| s.id.as_str()).collect();
    assert!(
        !ids.contains(&"proc/container") && !ids.contains(&"k8s/pod"),
        "{ids:?}"
    );
}
