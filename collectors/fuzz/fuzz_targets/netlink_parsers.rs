//! The netlink decoders (sock_diag dumps, inet_diag messages, rtnetlink routes and links,
//! tcp_info, NLMSG_ERROR) on hostile bytes: a typed `NetlinkError`, never a panic or an
//! out-of-bounds read. The first byte picks the decoder. Bounded run: `scripts/fuzz 60`.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use pstack_collectors::net::{TcpInfo, netlink, rtnl, sockdiag};

fuzz_target!(|data: &[u8]| {
    let Some((&which, msg)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            if let Ok(sockets) = sockdiag::parse_dump(msg) {
                // Each socket came from at least one 72-byte inet_diag_msg.
                assert!(sockets.len() * 72 <= msg.len(), "{} sockets from {} bytes", sockets.len(), msg.len());
            }
        }
        1 => drop(sockdiag::parse_socket(msg)),
        2 => drop(rtnl::parse_route(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), msg)),
        3 => drop(rtnl::parse_link(msg)),
        4 => drop(TcpInfo::parse(msg)),
        _ => drop(netlink::error_code(msg)),
    }
});
