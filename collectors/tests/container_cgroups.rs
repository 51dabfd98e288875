//! Pod identity from real cgroups: each kubelet/runtime naming scheme is
//! built as real cgroup directories in a scratch hierarchy (subdirectories
//! of the host's cgroup2 mount, and a cgroup v1 named hierarchy mounted for
//! the test), a real process is moved into each, and its
//! `/proc/<pid>/cgroup` as the kernel writes it must give the right
//! container ID and pod UID. Needs root (to create cgroups and move
//! processes); under CI a missing precondition fails the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use pstack_collectors::procfs::container::{ContainerFacts, read_container};

const ID: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const UID: &str = "6b1f2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

/// Root, or (under strict mode) a failure that says why; outside strict mode a
/// logged skip.
#[track_caller]
fn precondition(what: &str) -> bool {
    pstack_testkit::precondition(pstack_testkit::is_root(), &format!("{what} needs root"))
}

/// The cgroup2 mount point, from /proc/self/mountinfo.
fn cgroup2_mount() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in info.lines() {
        let (pre, post) = line.split_once(" - ").unwrap();
        if post.split(' ').next() == Some("cgroup2") {
            return PathBuf::from(pre.split(' ').nth(4).unwrap());
        }
    }
    panic!("no cgroup2 mount in /proc/self/mountinfo");
}

/// A child that sleeps until killed, moved out of its cgroup on drop.
struct Sleeper {
    child: Child,
}

impl Sleeper {
    fn spawn() -> Sleeper {
        Sleeper {
            child: Command::new("sleep").arg("300").spawn().unwrap(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn move_into(&self, cgroup_dir: &Path) {
        std::fs::write(cgroup_dir.join("cgroup.procs"), self.pid().to_string())
            .unwrap_or_else(|e| panic!("moving {} into {}: {e}", self.pid(), cgroup_dir.display()));
    }

    fn facts(&self) -> Option<ContainerFacts> {
        let file = PathBuf::from(format!("/proc/{}/cgroup", self.pid()));
        let reading = read_container(&file, 1 << 16).unwrap();
        assert!(!reading.raw.truncated);
        reading.facts
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch cgroup subtree; removed (deepest first) on drop, after its
/// processes are gone.
struct Scratch {
    base: PathBuf,
}

impl Scratch {
    fn mkdir(&self, rel: &str) -> PathBuf {
        let d = self.base.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        d
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let mut dirs = Vec::new();
        let mut stack = vec![self.base.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        stack.push(e.path());
                    }
                }
            }
            dirs.push(d);
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// (relative cgroup path, runtime, pod uid, qos, driver); `None` uid/runtime
/// where the path does not spell one.
type Case = (
    String,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
    &'static str,
);

fn systemd_driver_cases() -> Vec<Case> {
    let us = UID.replace('-', "_");
    vec![
        (
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice/cri-containerd-{ID}.scope"
            ),
            Some("containerd"),
            Some(UID),
            Some("burstable"),
            "systemd",
        ),
        (
            format!("kubepods.slice/kubepods-pod{us}.slice/crio-{ID}.scope"),
            Some("cri-o"),
            Some(UID),
            Some("guaranteed"),
            "systemd",
        ),
        (
            format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{us}.slice/docker-{ID}.scope"
            ),
            Some("docker"),
            Some(UID),
            Some("besteffort"),
            "systemd",
        ),
    ]
}

fn cgroupfs_driver_cases() -> Vec<Case> {
    vec![
        (
            format!("kubepods/burstable/pod{UID}/{ID}"),
            None,
            Some(UID),
            Some("burstable"),
            "cgroupfs",
        ),
        (
            format!("kubepods/pod{UID}/crio-{ID}"),
            Some("cri-o"),
            Some(UID),
            Some("guaranteed"),
            "cgroupfs",
        ),
        (
            format!("kubepods/besteffort/pod{UID}/docker-{ID}"),
            Some("docker"),
            Some(UID),
            Some("besteffort"),
            "cgroupfs",
        ),
        (
            format!("docker/{ID}"),
            Some("docker"),
            None,
            None,
            "cgroupfs",
        ),
    ]
}

fn check(sleeper: &Sleeper, scratch: &Scratch, case: &Case) {
    let (rel, runtime, uid, qos, driver) = case;
    sleeper.move_into(&scratch.mkdir(rel));
    let f = sleeper
        .facts()
        .unwrap_or_else(|| panic!("{rel}: no container facts"));
    assert_eq!(f.container_id, ID, "{rel}");
    assert_eq!(f.runtime.as_deref(), *runtime, "{rel}");
    assert_eq!(f.pod_uid.as_deref(), *uid, "{rel}");
    assert_eq!(f.qos_class.as_deref(), *qos, "{rel}");
    assert_eq!(f.cgroup_driver, *driver, "{rel}");
    assert!(f.cgroup.ends_with(rel.as_str()), "{} vs {rel}", f.cgroup);
}

#[test]
fn cgroup_v2_each_scheme_names_container_and_pod() {
    if !precondition("cgroup v2 container identity") {
        return;
    }
    let mount = cgroup2_mount();
    let scratch = Scratch {
        base: mount.join(format!("pstack-test-container-{}", std::process::id())),
    };
    let sleeper = Sleeper::spawn();
    let origin = std::fs::read_to_string(format!("/proc/{}/cgroup", sleeper.pid())).unwrap();
    let origin_v2 = origin
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .to_string();
    for case in systemd_driver_cases()
        .iter()
        .chain(&cgroupfs_driver_cases())
    {
        check(&sleeper, &scratch, case);
    }
    // Outside any pod: a service cgroup next to them gives no facts.
    sleeper.move_into(&scratch.mkdir("system.slice/pstack-test.service"));
    assert_eq!(sleeper.facts(), None);
    // Back where it started, so the scratch tree can be removed.
    sleeper.move_into(&mount.join(origin_v2.trim_start_matches('/')));
    drop(sleeper);
}

/// A cgroup v1 named hierarchy (no controllers), unmounted on drop.
struct V1Mount {
    dir: tempfile::TempDir,
}

impl Drop for V1Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn cgroup_v1_named_hierarchy_each_scheme_names_container_and_pod() {
    if !precondition("cgroup v1 container identity") {
        return;
    }
    let name = format!("pstack-test-{}", std::process::id());
    let mnt = V1Mount {
        dir: tempfile::Builder::new()
            .prefix("pstack-cgv1-")
            .tempdir_in("/var/tmp")
            .unwrap(),
    };
    let st = Command::new("mount")
        .args(["-t", "cgroup", "-o", &format!("none,name={name}"), "cgroup"])
        .arg(mnt.dir.path())
        .status()
        .unwrap();
    assert!(
        st.success(),
        "mount -t cgroup -o none,name={name} failed (kernel without cgroup v1 named hierarchies?)"
    );
    let sleeper = Sleeper::spawn();
    {
        let scratch = Scratch {
            base: mnt.dir.path().join("scratch"),
        };
        for case in cgroupfs_driver_cases()
            .iter()
            .chain(&systemd_driver_cases())
        {
            check(&sleeper, &scratch, case);
            // The kernel names the hierarchy on the process's line.
            let text = std::fs::read_to_string(format!("/proc/{}/cgroup", sleeper.pid())).unwrap();
            assert!(
                text.lines()
                    .any(|l| l.contains(&format!(":name={name}:/scratch/"))),
                "{text}"
            );
        }
        sleeper.move_into(&scratch.mkdir("user.slice/session-1.scope"));
        assert_eq!(sleeper.facts(), None);
        sleeper.move_into(mnt.dir.path());
    }
    drop(sleeper);
}
