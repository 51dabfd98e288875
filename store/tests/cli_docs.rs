//! `pstack-store --help` ends with the README's exit-code table, row for row.

use std::process::Command;

fn normalize(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn readme_rows() -> Vec<(u32, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `pstack-store` | "))
        .map(|rest| {
            let (code, meaning) = rest.split_once(" | ").expect("a row");
            (
                code.parse().expect("a code"),
                normalize(meaning.trim_end_matches(" |")),
            )
        })
        .collect()
}

fn help_rows(help: &str) -> Vec<(u32, String)> {
    let mut rows: Vec<(u32, String)> = Vec::new();
    for line in help
        .lines()
        .skip_while(|l| l.trim() != "Exit codes:")
        .skip(1)
    {
        let t = line.trim_start();
        let code = t
            .split_whitespace()
            .next()
            .and_then(|c| c.parse::<u32>().ok());
        match (code, rows.last_mut()) {
            (Some(code), _) if !line.starts_with("   ") => {
                let meaning = t.split_once(char::is_whitespace).map_or("", |m| m.1);
                rows.push((code, meaning.trim().to_string()));
            }
            (_, Some(last)) if !t.is_empty() && line.starts_with("  ") => {
                last.1.push(' ');
                last.1.push_str(t);
            }
            _ => break,
        }
    }
    rows.into_iter().map(|(c, m)| (c, normalize(&m))).collect()
}

#[test]
fn help_ends_with_the_readmes_exit_codes() {
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["envelopes", "get", "--help"],
        vec!["keys", "create", "--help"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_pstack-store"))
            .args(&args)
            .output()
            .expect("run pstack-store");
        assert_eq!(o.status.code(), Some(0));
        let help = String::from_utf8_lossy(&o.stdout);
        let want = readme_rows();
        assert!(!want.is_empty());
        assert_eq!(help_rows(&help), want, "{args:?}");
    }
}
