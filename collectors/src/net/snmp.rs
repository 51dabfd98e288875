//! `/proc/net/snmp` and `/proc/net/netstat`: every counter, not a chosen few.
//!
//! Both files are pairs of lines, `Section: Name1 Name2 …` then
//! `Section: v1 v2 …`. We keep every pair of every section (`Tcp`, `TcpExt`,
//! `IpExt`, `Ip`, `Udp`, …) as `Section.Name → value`. Values are signed
//! (`Tcp: MaxConn` is -1) and may exceed 2^53, so they are `i128` here; the
//! envelope layer decides how to carry them.
//!
//! Invariants: a header/value pair whose lengths differ, a section name that
//! differs between the two lines, or a non-integer value is a typed
//! [`SnmpError`], never a silently shortened map.

use std::collections::BTreeMap;

/// Counters keyed `Section.Name` (e.g. `TcpExt.TCPTimeouts`).
pub type Counters = BTreeMap<String, i128>;

/// A malformed counters file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum SnmpError {
    /// A header line has no value line.
    #[error("section {section}: header line without a value line")]
    Unpaired {
        /// Section name.
        section: String,
    },
    /// The header and value lines disagree.
    #[error("section {section}: {names} names but {values} values")]
    LengthMismatch {
        /// Section name.
        section: String,
        /// Names in the header.
        names: usize,
        /// Values in the value line.
        values: usize,
    },
    /// The value line belongs to another section.
    #[error("header section {header} followed by value section {values}")]
    SectionMismatch {
        /// Header's section.
        header: String,
        /// Value line's section.
        values: String,
    },
    /// A value is not an integer.
    #[error("section {section}: {name} = {value:?} is not an integer")]
    NotInteger {
        /// Section name.
        section: String,
        /// Counter name.
        name: String,
        /// The text.
        value: String,
    },
}

/// Parse one snmp-format file into `out`.
pub fn parse_into(text: &str, out: &mut Counters) -> Result<(), SnmpError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    while let Some(header) = lines.next() {
        let (section, names) = header.split_once(':').unwrap_or((header, ""));
        let Some(values_line) = lines.next() else {
            return Err(SnmpError::Unpaired {
                section: section.into(),
            });
        };
        let (vsection, values) = values_line.split_once(':').unwrap_or((values_line, ""));
        if vsection != section {
            return Err(SnmpError::SectionMismatch {
                header: section.into(),
                values: vsection.into(),
            });
        }
        let names: Vec<&str> = names.split_whitespace().collect();
        let values: Vec<&str> = values.split_whitespace().collect();
        if names.len() != values.len() {
            return Err(SnmpError::LengthMismatch {
                section: section.into(),
                names: names.len(),
                values: values.len(),
            });
        }
        for (n, v) in names.iter().zip(values) {
            let parsed: i128 = v.parse().map_err(|_| SnmpError::NotInteger {
                section: section.into(),
                name: (*n).into(),
                value: v.into(),
            })?;
            out.insert(format!("{section}.{n}"), parsed);
        }
    }
    Ok(())
}

/// Per-counter `end - start` over the union of keys (a key missing on one
/// side counts as 0 there, and is listed in the second return value).
pub fn delta(start: &Counters, end: &Counters) -> (BTreeMap<String, i128>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut one_sided = Vec::new();
    for k in start.keys().chain(end.keys()) {
        if out.contains_key(k) {
            continue;
        }
        match (start.get(k), end.get(k)) {
            (Some(a), Some(b)) => {
                out.insert(k.clone(), b - a);
            }
            (a, b) => {
                one_sided.push(k.clone());
                out.insert(k.clone(), b.copied().unwrap_or(0) - a.copied().unwrap_or(0));
            }
        }
    }
    (out, one_sided)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP: &str = "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens OutRsts RetransSegs\n\
                        Tcp: 1 200 120000 -1 12 3 18446744073709551615\n\
                        Udp: InDatagrams\nUdp: 5\n";
    const NETSTAT: &str = "TcpExt: TCPTimeouts TCPAbortOnData TCPZeroWindowDrop\nTcpExt: 4 1 0\n";

    #[test]
    fn keeps_every_counter_signed_and_above_2_pow_53() {
        let mut c = Counters::new();
        parse_into(SNMP, &mut c).unwrap();
        parse_into(NETSTAT, &mut c).unwrap();
        assert_eq!(c["Tcp.MaxConn"], -1);
        assert_eq!(c["Tcp.RetransSegs"], u64::MAX as i128);
        assert_eq!(c["TcpExt.TCPTimeouts"], 4);
        assert_eq!(c["Udp.InDatagrams"], 5);
        assert_eq!(c.len(), 11);
    }

    #[test]
    fn mismatched_lengths_are_refused() {
        let e = parse_into("Tcp: A B\nTcp: 1\n", &mut Counters::new()).unwrap_err();
        assert!(matches!(
            e,
            SnmpError::LengthMismatch {
                names: 2,
                values: 1,
                ..
            }
        ));
    }

    #[test]
    fn unpaired_and_mismatched_sections_are_refused() {
        assert!(matches!(
            parse_into("Tcp: A\n", &mut Counters::new()),
            Err(SnmpError::Unpaired { .. })
        ));
        assert!(matches!(
            parse_into("Tcp: A\nUdp: 1\n", &mut Counters::new()),
            Err(SnmpError::SectionMismatch { .. })
        ));
        assert!(matches!(
            parse_into("Tcp: A\nTcp: x\n", &mut Counters::new()),
            Err(SnmpError::NotInteger { .. })
        ));
    }

    #[test]
    fn delta_covers_the_union_and_names_one_sided_keys() {
        let mut a = Counters::new();
        let mut b = Counters::new();
        a.insert("Tcp.OutRsts".into(), 3);
        b.insert("Tcp.OutRsts".into(), 5);
        b.insert("TcpExt.New".into(), 2);
        let (d, one) = delta(&a, &b);
        assert_eq!(d["Tcp.OutRsts"], 2);
        assert_eq!(d["TcpExt.New"], 2);
        assert_eq!(one, vec!["TcpExt.New".to_string()]);
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Render counters in the kernel's two-line format and parse them back.
        #[test]
        fn counters_round_trip(
            sections in proptest::collection::btree_map(
                "[A-Z][a-zA-Z]{1,8}",
                proptest::collection::btree_map("[A-Z][A-Za-z0-9]{0,20}", any::<i64>(), 1..20),
                1..5,
            )
        ) {
            let mut text = String::new();
            for (sec, counters) in &sections {
                let names: Vec<&str> = counters.keys().map(String::as_str).collect();
                let values: Vec<String> = counters.values().map(|v| v.to_string()).collect();
                text.push_str(&format!("{sec}: {}\n{sec}: {}\n", names.join(" "), values.join(" ")));
            }
            let mut got = Counters::new();
            parse_into(&text, &mut got).unwrap();
            let want: usize = sections.values().map(|c| c.len()).sum();
            prop_assert_eq!(got.len(), want);
            for (sec, counters) in &sections {
                for (n, v) in counters {
                    prop_assert_eq!(got[&format!("{sec}.{n}")], i128::from(*v));
                }
            }
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
            let _ = parse_into(&text, &mut Counters::new());
            let _ = crate::net::conntrack::parse_stat(&text);
        }
    }
}
