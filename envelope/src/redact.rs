//! Redaction of command lines and environments before anything leaves the
//! host. Arguments and environment values routinely carry secrets (tokens,
//! passwords, connection strings); the envelope keeps argv[0] and variable
//! names, which identify the program and its configuration surface, and
//! replaces everything else by a SHA-256 digest so two captures can still be
//! compared for equality without shipping the text.

use serde::{Deserialize, Serialize};

use crate::seal::sha256_digest;

/// A command line with everything after argv[0] replaced by a digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactedCommand {
    /// The program as invoked.
    pub argv0: String,
    /// Number of further arguments.
    pub args: u64,
    /// `sha256:` over the remaining arguments, NUL-separated; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_digest: Option<String>,
}

/// An environment with names kept and values replaced by one digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactedEnviron {
    /// Variable names, in the order the process holds them.
    pub names: Vec<String>,
    /// `sha256:` over the raw environment block.
    pub digest: String,
}

/// Redact a raw `/proc/<pid>/cmdline` block (NUL-separated arguments).
pub fn redact_cmdline(raw: &[u8]) -> RedactedCommand {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    let mut parts = raw.splitn(2, |b| *b == 0);
    let argv0 = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    match parts.next() {
        Some(rest) => RedactedCommand {
            argv0,
            args: rest.split(|b| *b == 0).count() as u64,
            args_digest: Some(sha256_digest(rest)),
        },
        None => RedactedCommand {
            argv0,
            args: 0,
            args_digest: None,
        },
    }
}

/// Redact an argument vector.
pub fn redact_argv<S: AsRef<str>>(argv: &[S]) -> RedactedCommand {
    let joined = argv
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join("\0");
    redact_cmdline(joined.as_bytes())
}

/// Redact a raw `/proc/<pid>/environ` block (NUL-separated `NAME=value`).
pub fn redact_environ(raw: &[u8]) -> RedactedEnviron {
    let names = raw
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let name = entry.split(|b| *b == b'=').next().unwrap_or_default();
            String::from_utf8_lossy(name).into_owned()
        })
        .collect();
    RedactedEnviron {
        names,
        digest: sha256_digest(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_keeps_argv0_only() {
        let r = redact_cmdline(b"/usr/bin/psql\0--password=hunter2\0db\0");
        assert_eq!(r.argv0, "/usr/bin/psql");
        assert_eq!(r.args, 2);
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(
            r.args_digest,
            Some(sha256_digest(b"--password=hunter2\0db"))
        );
    }

    #[test]
    fn cmdline_without_args_has_no_digest() {
        let r = redact_cmdline(b"sleep\0");
        assert_eq!(
            (r.argv0.as_str(), r.args, r.args_digest),
            ("sleep", 0, None)
        );
    }

    #[test]
    fn environ_keeps_names_not_values() {
        let r = redact_environ(b"PATH=/bin\0AWS_SECRET_ACCESS_KEY=abc123\0");
        assert_eq!(r.names, vec!["PATH", "AWS_SECRET_ACCESS_KEY"]);
        assert!(!serde_json::to_string(&r).unwrap().contains("abc123"));
    }
}
