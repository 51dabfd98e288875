//! Facts about this kernel the net readers rely on: after `setns` in one
//! thread, `/proc/thread-self/net/*` shows that thread's netns while
//! `/proc/self/net/*` follows the thread-group leader; netlink sockets opened
//! there belong to the entered netns.

use pstack_collectors::net::netns::{NetnsTarget, run_in};
use pstack_collectors::net::sockdiag;

use crate::testbed::*;

#[test]
fn root_thread_self_net_follows_the_thread_not_the_leader() {
    if !root_or_skip("root_thread_self_net_follows_the_thread_not_the_leader") {
        return;
    }
    let _s = serial();
    let bed = Testbed::new("sem");
    let ((thread_dev, self_dev), ino) = run_in(&NetnsTarget::Named(bed.b.name.clone()), || {
        (
            std::fs::read_to_string("/proc/thread-self/net/dev").unwrap(),
            std::fs::read_to_string("/proc/self/net/dev").unwrap(),
        )
    })
    .unwrap();
    assert!(
        thread_dev.contains("pb0:"),
        "thread-self shows the entered netns"
    );
    assert!(
        !self_dev.contains("pb0:"),
        "self/net shows the leader's netns: never use it in a setns thread"
    );
    let want = std::fs::metadata(format!("/run/netns/{}", bed.b.name))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    assert_eq!(ino, want);
    // A sock_diag dump in B sees B's listener only.
    let _t = Transfer::start(&bed, false, None);
    let (dump, _) = run_in(&NetnsTarget::Named(bed.b.name.clone()), || {
        sockdiag::dump_tcp(&|_| true)
    })
    .unwrap();
    let dump = dump.unwrap();
    assert!(
        dump.sockets
            .iter()
            .any(|s| s.local.port() == DATA_PORT && s.state == 10)
    );
    assert!(
        dump.sockets
            .iter()
            .all(|s| s.local.ip().to_string() != A_V4)
    );
}
