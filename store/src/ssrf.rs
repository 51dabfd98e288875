//! Which addresses a grant webhook may reach (seed 000: "SSRF-guarded").
//!
//! Invariants:
//! - The decision is made on socket addresses — every address a name
//!   resolves to — and the HTTP connector only ever receives addresses that
//!   passed ([`GuardedResolver`]); an IP-literal URL is checked the same way
//!   before any connection. A name with any refused address is refused
//!   whole (no "pick the public one"), as is a name that resolves to
//!   nothing.
//! - Refused unless private delivery is allowed: loopback, RFC 1918
//!   private, link-local, unique-local (fc00::/7), CGNAT (100.64/10),
//!   multicast, unspecified, broadcast, documentation/benchmark/reserved
//!   ranges, and every IPv6 form that embeds an IPv4 address — IPv4-mapped
//!   `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96` (SIIT), IPv4-compatible
//!   `::/96`, NAT64 `64:ff9b::/96` and its local-use `64:ff9b:1::/48`, 6to4
//!   `2002::/16` and Teredo `2001::/32` — refused whole, whatever IPv4
//!   address is inside: a translator or tunnel can carry the packet to an
//!   internal IPv4 host, and no webhook receiver needs such an address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Why an address is refused, or `None` when it is public.
pub fn refusal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refusal_v4(v4),
        IpAddr::V6(v6) => refusal_v6(v6),
    }
}

fn refusal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_unspecified() || o[0] == 0 {
        Some("unspecified or \"this network\" address")
    } else if ip.is_loopback() {
        Some("loopback address")
    } else if ip.is_private() {
        Some("private (RFC 1918) address")
    } else if ip.is_link_local() {
        Some("link-local address")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some("carrier-grade NAT (100.64.0.0/10) address")
    } else if ip.is_multicast() {
        Some("multicast address")
    } else if ip.is_broadcast() || o[0] >= 240 {
        Some("broadcast or reserved address")
    } else if matches!(
        (o[0], o[1], o[2]),
        (192, 0, 0 | 2) | (198, 51, 100) | (203, 0, 113) | (198, 18 | 19, _)
    ) {
        Some("special-purpose (IETF, documentation or benchmarking) address")
    } else {
        None
    }
}

fn refusal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified address");
    }
    if ip.is_loopback() {
        return Some("loopback address");
    }
    // Forms that carry an IPv4 address: refused whole (the mapped form
    // names the IPv4 address's own reason when it has one).
    if let Some(v4) = ip.to_ipv4_mapped() {
        return refusal_v4(v4).or(Some("IPv4-mapped (::ffff:0:0/96) IPv6 address"));
    }
    if s[0..6] == [0, 0, 0, 0, 0xffff, 0] {
        return Some("IPv4-translated (::ffff:0:0:0/96) address embedding an IPv4 address");
    }
    if s[0..6] == [0, 0, 0, 0, 0, 0] {
        // IPv4-compatible (deprecated): never a legitimate destination.
        return Some("IPv4-compatible (::/96) IPv6 address");
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return Some("NAT64 (64:ff9b::/96) address embedding an IPv4 address");
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        return Some("local-use NAT64 (64:ff9b:1::/48) address embedding an IPv4 address");
    }
    if s[0] == 0x64 && s[1] == 0xff9b {
        return Some("NAT64 prefix (64:ff9b::/32) address");
    }
    if s[0] == 0x2002 {
        return Some("6to4 (2002::/16) address embedding an IPv4 address");
    }
    if s[0] == 0x2001 && s[1] == 0 {
        return Some("Teredo (2001::/32) address embedding an IPv4 address");
    }
    if (s[0] & 0xfe00) == 0xfc00 {
        return Some("unique-local (fc00::/7) address");
    }
    if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0 {
        return Some("link-local or site-local address");
    }
    if ip.is_multicast() {
        return Some("multicast address");
    }
    if s[0] == 0x2001 && s[1] == 0x0db8 {
        return Some("documentation (2001:db8::/32) address");
    }
    if s[0] == 0x0100 && s[1..4] == [0, 0, 0] {
        return Some("discard-only (100::/64) address");
    }
    None
}

/// A resolver for the webhook client: resolves with the system resolver and
/// refuses the whole name unless every address is allowed, so the
/// connector only ever sees allowed addresses.
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver {
    /// `ALERT_WEBHOOK_ALLOW_PRIVATE=true`.
    pub allow_private: bool,
}

/// A name refused by the guard.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The name resolved to nothing.
    #[error("{0} does not resolve")]
    Unresolvable(String),
    /// An address is refused.
    #[error("{host} resolves to {addr}, a {why}; set ALERT_WEBHOOK_ALLOW_PRIVATE=true to allow")]
    Refused {
        /// The name.
        host: String,
        /// The refused address.
        addr: IpAddr,
        /// Why.
        why: &'static str,
    },
}

/// Check resolved addresses: all must pass.
pub fn check_all(host: &str, addrs: &[SocketAddr], allow_private: bool) -> Result<(), GuardError> {
    if addrs.is_empty() {
        return Err(GuardError::Unresolvable(host.to_string()));
    }
    if allow_private {
        return Ok(());
    }
    for a in addrs {
        if let Some(why) = refusal(a.ip()) {
            return Err(GuardError::Refused {
                host: host.to_string(),
                addr: a.ip(),
                why,
            });
        }
    }
    Ok(())
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow_private;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), 0)).await {
                Ok(it) => it.collect(),
                Err(_) => Vec::new(),
            };
            check_all(&host, &addrs, allow)?;
            let it: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(it)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_forms_are_refused_and_public_ones_pass() {
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
        ] {
            let ip: IpAddr = bad.parse().unwrap();
            assert!(refusal(ip).is_some(), "{bad} passed");
        }
        // A name that resolves to nothing is refused, override or not; one
        // refused address among public ones refuses the name.
        assert!(matches!(
            check_all("nowhere.invalid", &[], true),
            Err(GuardError::Unresolvable(_))
        ));
        let public: SocketAddr = "93.184.215.14:443".parse().unwrap();
        let private: SocketAddr = "10.0.0.1:443".parse().unwrap();
        assert!(check_all("mixed.example", &[public, private], false).is_err());
        assert!(check_all("mixed.example", &[public], false).is_ok());
        for good in ["93.184.215.14", "2606:4700::1111", "8.8.8.8"] {
            let ip: IpAddr = good.parse().unwrap();
            assert_eq!(refusal(ip), None, "{good}");
        }
    }

    // Regression (issue 28): IPv4-translated `::ffff:0:a.b.c.d` and Teredo
    // `2001::/32` passed the guard. Every IPv6 form embedding an IPv4
    // address, each with a loopback, a private and a public IPv4 inside, is
    // refused with the reason naming its form.
    #[test]
    fn every_ipv6_form_embedding_ipv4_is_refused_by_its_form() {
        let table: &[(&str, &str)] = &[
            // IPv4-mapped ::ffff:0:0/96
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:93.184.215.14", "IPv4-mapped"),
            // IPv4-translated (SIIT) ::ffff:0:0:0/96
            ("::ffff:0:127.0.0.1", "IPv4-translated"),
            ("::ffff:0:10.0.0.1", "IPv4-translated"),
            ("::ffff:0:93.184.215.14", "IPv4-translated"),
            // IPv4-compatible ::/96
            ("::127.0.0.1", "IPv4-compatible"),
            ("::10.0.0.1", "IPv4-compatible"),
            ("::93.184.215.14", "IPv4-compatible"),
            // NAT64 well-known 64:ff9b::/96 and local-use 64:ff9b:1::/48
            ("64:ff9b::7f00:1", "NAT64 (64:ff9b::/96)"),
            ("64:ff9b::10.0.0.1", "NAT64 (64:ff9b::/96)"),
            ("64:ff9b::93.184.215.14", "NAT64 (64:ff9b::/96)"),
            ("64:ff9b:1::7f00:1", "local-use NAT64"),
            ("64:ff9b:1:ffff::a00:1", "local-use NAT64"),
            ("64:ff9b:2::1", "NAT64 prefix"),
            // 6to4 2002::/16 (2002:AABB:CCDD::)
            ("2002:7f00:1::", "6to4"),
            ("2002:a00:1::1", "6to4"),
            ("2002:5db8:d70e::1", "6to4"),
            // Teredo 2001:0::/32 (server IPv4, flags, port, client IPv4 XOR ff)
            ("2001:0:7f00:1::", "Teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
            ("2001::80ff:fffe", "Teredo"),
        ];
        for (addr, why) in table {
            let ip: IpAddr = addr.parse().unwrap();
            match refusal(ip) {
                Some(reason) => assert!(reason.contains(why), "{addr}: {reason:?}, wanted {why:?}"),
                None => panic!("{addr} passed the guard"),
            }
        }
        // Neighbours of the refused prefixes stay public.
        for good in ["2001:200::1", "2001:4860::8888", "2003::1"] {
            let ip: IpAddr = good.parse().unwrap();
            assert_eq!(refusal(ip), None, "{good}");
        }
    }
}
