//! What operators read is true (issue 19, items 5 and 8): the exit codes at
//! the end of every binary's `--help` are the README's table, row for row,
//! and `trace tcp` as non-root exits with the code its `--help` documents.

use std::path::PathBuf;
use std::process::Command;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap()
}

/// `(code, meaning)` rows of `binary` in the README's exit-code table.
fn readme_rows(binary: &str) -> Vec<(u32, String)> {
    let prefix = format!("| `{binary}` | ");
    readme()
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let (code, meaning) = rest.split_once(" | ").unwrap();
            (
                code.parse().unwrap(),
                meaning.trim_end_matches(" |").to_string(),
            )
        })
        .collect()
}

fn normalize(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `Exit codes:` section of a `--help` text (clap wraps long lines).
fn help_rows(help: &str) -> Vec<(u32, String)> {
    let mut rows: Vec<(u32, String)> = Vec::new();
    let mut lines = help
        .lines()
        .skip_while(|l| l.trim() != "Exit codes:")
        .skip(1);
    for line in lines.by_ref() {
        let t = line.trim_start();
        let code = t
            .split_whitespace()
            .next()
            .and_then(|c| c.parse::<u32>().ok());
        match code {
            Some(code) if line.starts_with("  ") && !line.starts_with("   ") => {
                let meaning = t.split_once(char::is_whitespace).unwrap().1;
                rows.push((code, meaning.trim().to_string()));
            }
            _ if !t.is_empty() && line.starts_with("  ") && !rows.is_empty() => {
                rows.last_mut().unwrap().1.push(' ');
                rows.last_mut().unwrap().1.push_str(t);
            }
            _ => break,
        }
    }
    rows.into_iter().map(|(c, m)| (c, normalize(&m))).collect()
}

fn bin(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_pstackctl"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: cargo build -p pstack-helper (cargo test --workspace does)",
        path.display()
    );
    path
}

fn help(path: &std::path::Path, args: &[&str]) -> String {
    let o = Command::new(path).args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{} {args:?}", path.display());
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn every_help_ends_with_the_readmes_exit_codes() {
    let ctl = PathBuf::from(env!("CARGO_BIN_EXE_pstackctl"));
    let d = PathBuf::from(env!("CARGO_BIN_EXE_pstackd"));
    let cases: Vec<(&str, PathBuf, Vec<&str>)> = vec![
        ("pstackctl", ctl.clone(), vec!["--help"]),
        ("pstackctl", ctl.clone(), vec!["capture", "--help"]),
        ("pstackctl", ctl.clone(), vec!["trace", "tcp", "--help"]),
        ("pstackctl", ctl.clone(), vec!["envelope", "--help"]),
        (
            "pstackctl",
            ctl.clone(),
            vec!["envelope", "verify", "--help"],
        ),
        (
            "pstackctl",
            ctl.clone(),
            vec!["capture", "transport", "--help"],
        ),
        ("pstackctl", ctl, vec!["status", "--help"]),
        ("pstackd", d, vec!["--help"]),
        ("pstack-helper", bin("pstack-helper"), vec!["--help"]),
    ];
    for (name, path, args) in cases {
        let want: Vec<(u32, String)> = readme_rows(name)
            .into_iter()
            .map(|(c, m)| (c, normalize(&m)))
            .collect();
        assert!(!want.is_empty(), "no README rows for {name}");
        let got = help_rows(&help(&path, &args));
        assert_eq!(got, want, "{name} {args:?}");
    }
}

/// Issue 19: as non-root `trace tcp` exited 4 while its help said 0/1/2.
#[test]
fn trace_tcp_as_nobody_exits_with_a_documented_code() {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test drops to nobody and must start as root");
    let o = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["trace", "tcp", "--window", "100ms"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let code = o.status.code().unwrap() as u32;
    assert_eq!(code, 4, "{}", String::from_utf8_lossy(&o.stderr));
    let documented = readme_rows("pstackctl");
    let row = documented.iter().find(|(c, _)| *c == code).unwrap();
    assert!(row.1.contains("permission_denied"), "{row:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("permission_denied"), "{err}");
}

/// Flatten a TOML table into `section.key -> value`.
fn flatten(
    prefix: &str,
    v: &toml::Value,
    out: &mut std::collections::BTreeMap<String, toml::Value>,
) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

fn real_defaults() -> std::collections::BTreeMap<String, toml::Value> {
    let v = toml::Value::try_from(pstackd::config::Config::default()).unwrap();
    let mut out = std::collections::BTreeMap::new();
    flatten("", &v, &mut out);
    out
}

/// The shipped example spells every key at its real default, and nothing else.
#[test]
fn example_config_is_the_real_defaults() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/pstackd.toml"
    ))
    .unwrap();
    let parsed = pstackd::config::Config::parse(&text).unwrap();
    assert_eq!(parsed, pstackd::config::Config::default());
    let mut keys = std::collections::BTreeMap::new();
    flatten(
        "",
        &toml::from_str::<toml::Value>(&text).unwrap(),
        &mut keys,
    );
    assert_eq!(
        keys,
        real_defaults(),
        "examples/pstackd.toml vs Config::default()"
    );
}

/// docs/configuration.md has one row per key, with the real default.
#[test]
fn configuration_reference_matches_the_real_defaults() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .unwrap();
    let mut documented = std::collections::BTreeMap::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let key = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_string();
        let default = cells[1].trim_matches('`');
        let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {default}"))
            .unwrap_or_else(|e| panic!("{key}: {default:?}: {e}"))["v"]
            .clone();
        documented.insert(key, value);
    }
    assert_eq!(documented, real_defaults());
}

/// `pstackd --check-config` on an absent default file says so (it used to
/// print "valid"), and a named file that is absent is an error.
#[test]
fn check_config_says_when_the_file_is_missing() {
    let d = PathBuf::from(env!("CARGO_BIN_EXE_pstackd"));
    let default = std::path::Path::new(pstackd::config::DEFAULT_CONFIG_PATH);
    // An installed default file is hidden under an empty tmpfs in a private
    // mount namespace, so the absent case is always what runs.
    let o = if default.exists() {
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs none {} && exec \"$0\" --check-config",
                default.parent().unwrap().display()
            ))
            .arg(&d)
            .output()
            .unwrap()
    } else {
        Command::new(&d).arg("--check-config").output().unwrap()
    };
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("not found") && !out.contains("valid"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.toml");
    let o = Command::new(&d)
        .arg("--check-config")
        .arg("-c")
        .arg(&absent)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/pstackd.toml");
    let o = Command::new(&d)
        .args(["--check-config", "-c", example])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("valid"));
}
