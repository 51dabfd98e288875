//! Redaction of command lines and environments before anything leaves the
//! host. Arguments and environment values routinely carry secrets (tokens,
//! passwords, connection strings); the envelope keeps argv[0] and variable
//! names, which identify the program and its configuration surface, and
//! replaces everything else by a keyed digest ([`DigestKey`]: HMAC-SHA-256
//! under a per-host key) so two captures on one host can still be compared
//! for equality without shipping the text, and nobody holding the envelope
//! can confirm a guess.
//!
//! A process may rewrite its title (`$0 = "worker --token=X"` in Perl,
//! `setproctitle`): the kernel then shows one argument with spaces in
//! `/proc/PID/cmdline`. Such a block is split on whitespace and redacted like
//! an argv — its first word is the program, the rest only count and feed the
//! digest. The program word itself, like every `comm`, goes through
//! [`crate::redact_text`] (a program named like a secret is shown redacted).

use serde::{Deserialize, Serialize};

use crate::keyed::DigestKey;
use crate::secrets::redact_text;

/// A command line with everything after argv[0] replaced by a digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactedCommand {
    /// The program as invoked.
    pub argv0: String,
    /// Number of further arguments.
    pub args: u64,
    /// `hmac-sha256:` over the remaining arguments, NUL-separated, under the
    /// host's digest key; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_digest: Option<String>,
}

/// An environment with names kept and values replaced by one digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactedEnviron {
    /// Variable names, in the order the process holds them.
    pub names: Vec<String>,
    /// `hmac-sha256:` over the raw environment block, under the host's key.
    pub digest: String,
}

/// Redact a raw `/proc/<pid>/cmdline` block (NUL-separated arguments, or
/// one rewritten title with spaces).
pub fn redact_cmdline(raw: &[u8], key: &DigestKey) -> RedactedCommand {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    let title_words: Vec<&[u8]>;
    let (first, rest): (&[u8], Option<Vec<u8>>) = if raw.contains(&0) {
        let mut parts = raw.splitn(2, |b| *b == 0);
        let first = parts.next().unwrap_or_default();
        (first, parts.next().map(<[u8]>::to_vec))
    } else {
        // A single block: a program path, or a title rewritten with spaces.
        title_words = raw
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty())
            .collect();
        match title_words.split_first() {
            Some((first, [])) => (first, None),
            Some((first, more)) => (first, Some(more.join(&0u8))),
            None => (&[][..], None),
        }
    };
    let argv0 = redact_text(&String::from_utf8_lossy(first)).into_owned();
    match rest {
        Some(rest) => RedactedCommand {
            argv0,
            args: rest.split(|b| *b == 0).count() as u64,
            args_digest: Some(key.digest(&rest)),
        },
        None => RedactedCommand {
            argv0,
            args: 0,
            args_digest: None,
        },
    }
}

/// Redact an argument vector.
pub fn redact_argv<S: AsRef<str>>(argv: &[S], key: &DigestKey) -> RedactedCommand {
    let joined = argv
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join("\0");
    redact_cmdline(joined.as_bytes(), key)
}

/// Redact a raw `/proc/<pid>/environ` block (NUL-separated `NAME=value`).
pub fn redact_environ(raw: &[u8], key: &DigestKey) -> RedactedEnviron {
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
        digest: key.digest(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::sha256_digest;

    fn key() -> DigestKey {
        DigestKey::from_bytes([7; 32])
    }

    #[test]
    fn cmdline_keeps_argv0_only() {
        let r = redact_cmdline(b"/usr/bin/psql\0--password=hunter2\0db\0", &key());
        assert_eq!(r.argv0, "/usr/bin/psql");
        assert_eq!(r.args, 2);
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(r.args_digest, Some(key().digest(b"--password=hunter2\0db")));
    }

    #[test]
    fn a_guessed_password_does_not_match_the_digest() {
        // Issue 10: with an unkeyed SHA-256, hashing the guess matched.
        let r = redact_cmdline(b"psql\0--password=hunter2zz\0", &key());
        let digest = r.args_digest.unwrap();
        assert_ne!(digest, sha256_digest(b"--password=hunter2zz"));
        assert!(!digest.ends_with(&sha256_digest(b"--password=hunter2zz")[7..]));
        // Same host, same key: still comparable.
        assert_eq!(
            Some(digest),
            redact_cmdline(b"psql\0--password=hunter2zz\0", &key()).args_digest
        );
    }

    #[test]
    fn a_rewritten_title_is_split_and_its_arguments_digested() {
        let r = redact_cmdline(b"worker --token=TOKzzSECRET456", &key());
        assert_eq!((r.argv0.as_str(), r.args), ("worker", 1));
        assert!(!serde_json::to_string(&r).unwrap().contains("TOKzz"));
        // Padded with NULs after the title, as some runtimes leave it.
        let r = redact_cmdline(b"--token=TOKzzSECRET456 x\0\0", &key());
        assert!(
            !serde_json::to_string(&r).unwrap().contains("TOKzz"),
            "{r:?}"
        );
    }

    #[test]
    fn cmdline_without_args_has_no_digest() {
        let r = redact_cmdline(b"sleep\0", &key());
        assert_eq!(
            (r.argv0.as_str(), r.args, r.args_digest),
            ("sleep", 0, None)
        );
    }

    #[test]
    fn environ_keeps_names_not_values() {
        let r = redact_environ(b"PATH=/bin\0AWS_SECRET_ACCESS_KEY=abc123\0", &key());
        assert_eq!(r.names, vec!["PATH", "AWS_SECRET_ACCESS_KEY"]);
        assert!(!serde_json::to_string(&r).unwrap().contains("abc123"));
        assert!(crate::keyed::is_hmac_digest(&r.digest));
    }
}
