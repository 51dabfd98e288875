//! What of the filesystem a helper can see.
//!
//! Invariants:
//! - A privileged helper (one that holds any capability) runs in its own
//!   mount namespace whose root is a read-only, empty tmpfs holding one
//!   read-only bind mount of `/proc` ([`enter_proc_view`]). Nothing else of
//!   the host exists there: `/etc/shadow`, `/etc/cron.d` and every other path
//!   outside `/proc` are `ENOENT`, and every write under `/proc` is `EROFS`
//!   (the seccomp filter already kills a writable `open`; this is the second
//!   lock). The old root is detached, not merely hidden.
//! - A net helper is in addition under a Landlock ruleset
//!   ([`restrict_net_helper`]): no write access anywhere, read access only
//!   beneath `/proc`, no TCP bind/connect, no signals to or abstract-socket
//!   connections with processes outside its domain.
//!
//! Why the procfs helper has no Landlock ruleset: any Landlock domain makes
//! the kernel refuse `PTRACE_MODE_ATTACH` checks against processes outside
//! that domain, which is every process the helper reads. Measured on
//! 6.18 with a ruleset that handles only `WRITE_FILE`: `/proc/PID/stack` and
//! `/proc/PID/syscall` of any other process fail with `EPERM`, and
//! `/proc/1/environ` with `EACCES`. The mount-namespace view gives the
//! helper the same "reads only `/proc`, writes nothing" property without a
//! domain.

use std::ffi::CString;
use std::path::Path;

use crate::confine_error::ConfineError;

/// Directories tried, in order, as the mount point of the new root. Any
/// existing directory works: the tmpfs is mounted over it in the helper's own
/// mount namespace only, then becomes `/`.
const NEW_ROOT_CANDIDATES: [&str; 4] = ["/tmp", "/mnt", "/run", "/var"];

fn sys(call: &'static str, rc: libc::c_int) -> Result<(), ConfineError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(ConfineError::View {
            call,
            source: std::io::Error::last_os_error(),
        })
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn mount(
    call: &'static str,
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), ConfineError> {
    let source = source.map(cstr);
    let target = cstr(target);
    let fstype = fstype.map(cstr);
    let data = data.map(cstr);
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that
    // lives until the call returns.
    sys(call, unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })
}

/// Move the calling (single-threaded, `CAP_SYS_ADMIN`) process into a new
/// mount namespace whose whole filesystem is a read-only `/proc`.
pub fn enter_proc_view() -> Result<(), ConfineError> {
    // SAFETY: unshare takes an integer flag set.
    sys("unshare(CLONE_NEWNS)", unsafe {
        libc::unshare(libc::CLONE_NEWNS)
    })?;
    // Nothing we mount may propagate back to the host's namespace.
    mount(
        "mount(/, MS_REC|MS_PRIVATE)",
        None,
        "/",
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let base = NEW_ROOT_CANDIDATES
        .iter()
        .find(|d| Path::new(d).is_dir())
        .ok_or(ConfineError::NoMountPoint)?;
    let nothing = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount(
        "mount(tmpfs new root)",
        Some("pstack-helper"),
        base,
        Some("tmpfs"),
        nothing,
        Some("size=16k,nr_inodes=8,mode=0755"),
    )?;
    let proc_dir = format!("{base}/proc");
    let proc_c = cstr(&proc_dir);
    // SAFETY: proc_c is a NUL-terminated path that outlives the call.
    sys("mkdir(new root/proc)", unsafe {
        libc::mkdir(proc_c.as_ptr(), 0o555)
    })?;
    // Not MS_REC: only procfs itself, none of the mounts stacked under it.
    mount(
        "mount(/proc, MS_BIND)",
        Some("/proc"),
        &proc_dir,
        None,
        libc::MS_BIND,
        None,
    )?;
    mount(
        "mount(/proc bind, MS_REMOUNT|MS_RDONLY)",
        None,
        &proc_dir,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | nothing,
        None,
    )?;
    mount(
        "mount(new root, MS_REMOUNT|MS_RDONLY)",
        None,
        base,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | nothing,
        None,
    )?;
    let base_c = cstr(base);
    let dot = cstr(".");
    // SAFETY: NUL-terminated paths that outlive each call.
    sys("chdir(new root)", unsafe { libc::chdir(base_c.as_ptr()) })?;
    // pivot_root(".", "."): the old root is stacked on top of the new one,
    // then detached below.
    // SAFETY: as above; pivot_root has no libc wrapper.
    sys("pivot_root", unsafe {
        libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) as libc::c_int
    })?;
    // SAFETY: as above.
    sys("umount2(old root, MNT_DETACH)", unsafe {
        libc::umount2(dot.as_ptr(), libc::MNT_DETACH)
    })?;
    let root = cstr("/");
    // SAFETY: as above.
    sys("chdir(/)", unsafe { libc::chdir(root.as_ptr()) })?;
    Ok(())
}

/// Put the calling process under the net helper's Landlock ruleset. Returns
/// whether the kernel enforced it fully; `Err` only when the ruleset could
/// not be built or applied at all.
pub fn restrict_net_helper() -> Result<landlock::RulesetStatus, ConfineError> {
    use landlock::{
        ABI, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
        path_beneath_rules,
    };
    let err = |e: landlock::RulesetError| ConfineError::Landlock(e.to_string());
    let abi = ABI::V6;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(err)?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(err)?
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(["/proc"], AccessFs::from_read(abi)))
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    Ok(status.ruleset)
}
