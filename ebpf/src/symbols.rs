//! Kernel stack symbolization from `/proc/kallsyms`.
//!
//! Only names leave this module: an address that does not resolve becomes
//! `?`, never a raw kernel address (that would leak the KASLR offset into
//! evidence that leaves the host). Loaded once, on demand, and only when a
//! D-state episode has a stack to resolve.

/// A sorted kernel symbol table.
#[derive(Debug, Clone, Default)]
pub struct Kallsyms {
    syms: Vec<(u64, String)>,
}

impl Kallsyms {
    /// Parse `/proc/kallsyms` text (`addr type name [module]`). Zero
    /// addresses (kptr_restrict) are skipped, leaving nothing to resolve.
    pub fn parse(text: &str) -> Kallsyms {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                    .then(|| (addr, name.to_string()))
            })
            .collect();
        syms.sort_unstable_by_key(|(a, _)| *a);
        Kallsyms { syms }
    }

    /// Read this kernel's table (empty when unreadable).
    pub fn load() -> Kallsyms {
        std::fs::read_to_string("/proc/kallsyms")
            .map(|t| Kallsyms::parse(&t))
            .unwrap_or_default()
    }

    /// `name+0xoff` for an address, or `?`.
    pub fn resolve(&self, addr: u64) -> String {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        match i.checked_sub(1).and_then(|j| self.syms.get(j)) {
            Some((a, name)) if addr - a < 1 << 20 => format!("{name}+{:#x}", addr - a),
            _ => "?".to_string(),
        }
    }

    /// Whether any symbol is known.
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_names_and_never_emits_addresses() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t schedule\nffffffff81000200 T io_schedule\n0000000000000000 T hidden\nffffffff82000000 d data\n",
        );
        assert_eq!(k.resolve(0xffffffff81000110), "schedule+0x10");
        assert_eq!(k.resolve(0xffffffff81000200), "io_schedule+0x0");
        assert_eq!(k.resolve(0x10), "?");
        assert_eq!(
            k.resolve(0xffffffffff000000),
            "?",
            "far past the last text symbol"
        );
        let restricted = Kallsyms::parse("0000000000000000 T schedule\n");
        assert!(restricted.is_empty());
        assert_eq!(restricted.resolve(0xffffffff81000110), "?");
    }
}
