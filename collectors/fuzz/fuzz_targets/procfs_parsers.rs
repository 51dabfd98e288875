//! Every procfs parser on hostile bytes (a process controls its own comm, cmdline and
//! environment; a kernel can change a format): a typed result, never a panic. The first
//! byte picks the parser, the rest is the file. Seeds: real /proc files of this machine.
//! Bounded run: `scripts/fuzz 60`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pstack_collectors::net::{conntrack, load, snmp};
use pstack_collectors::procfs::{freezer, parse};

fuzz_target!(|data: &[u8]| {
    let Some((&which, file)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(file);
    match which % 14 {
        0 => {
            if let Ok(stat) = parse::parse_stat(file) {
                // The comm is whatever sits between the first '(' and the last ')'.
                let _ = format!("{stat:?}");
            }
        }
        1 => drop(parse::parse_status(file)),
        2 => drop(parse::parse_io(file)),
        3 => drop(parse::parse_schedstat(file)),
        4 => drop(parse::parse_wchan(file)),
        5 => drop(parse::parse_stack(file)),
        6 => drop(parse::parse_syscall(file)),
        7 => drop(parse::parse_ns_inode(&text)),
        8 => drop(freezer::parse_freezer("freezer", file)),
        9 => drop(conntrack::parse_stat(&text)),
        10 => drop(load::parse_loadavg(&text, &mut load::LoadFacts::default())),
        11 => drop(load::parse_stat(&text, &mut load::LoadFacts::default())),
        12 => drop(load::parse_psi(&text, &mut load::LoadFacts::default())),
        _ => drop(snmp::parse_into(&text, &mut snmp::Counters::default())),
    }
});
