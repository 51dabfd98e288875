//! Secret-shaped text, recognised so it never leaves the host.
//!
//! [`redact_text`] keeps a short, human-meaningful string (a process's
//! `argv[0]` or rewritten title word, its `comm`, a thread name) and replaces
//! every part that looks like a credential with [`REDACTED`]. The rules,
//! in the order they are applied (documented for operators in
//! `docs/redaction.md`, tested against the corpus in this module's tests):
//!
//! 1. URLs with credentials: `scheme://user:password@host` keeps the scheme
//!    and host, not the `user:password`.
//! 2. PEM private keys: `-----BEGIN … PRIVATE KEY-----` and what follows.
//! 3. Authorization schemes: `Bearer X`, `Basic X`, `Token X` lose `X`.
//! 4. Named values: `key=value`, `key:value`, `--key=value`, `-key value`
//!    whose key names a credential (`pass`, `passwd`, `password`, `pwd`,
//!    `secret`, `token`, `api_key`/`apikey`, `access_key`, `private_key`,
//!    `auth`, `credential(s)`, `session`, `cookie`, `signature`, `sig`,
//!    `key` …) lose the value; the key stays, so the shape is still visible.
//! 5. Known key shapes: AWS access key ids (`AKIA`/`ASIA`/`ABIA`/`ACCA` + 16),
//!    GCP API keys (`AIza` + 35) and OAuth tokens (`ya29.`), GitHub tokens
//!    (`ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_` + 36+, `github_pat_`), Slack
//!    tokens (`xox?-`), JWTs (`eyJ….eyJ….`).
//! 6. Anything else long and random-looking: a run of 24 or more characters
//!    of `[A-Za-z0-9+/=_-]` with an upper-case letter, a lower-case letter
//!    and a digit (an AWS secret access key, a random API token).
//!
//! Not recognisable here: a value whose flag says nothing (`mysql -p X`).
//! That is why arguments are never shown at all ([`crate::redact_cmdline`]
//! keeps only the program word and digests the rest); these rules guard the
//! few strings that are shown.
//!
//! Over-redaction is the accepted failure mode: a program whose name looks
//! like a secret is shown as [`REDACTED`].

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::bytes::Regex;

/// What replaces a secret.
pub const REDACTED: &str = "<redacted>";

/// Key names whose values are secrets (rule 4), as a regex alternation.
const SECRET_KEYS: &str = r"pass(?:wd|word|phrase)?|pwd|secret|token|api[_.-]?key|access[_.-]?key|private[_.-]?key|client[_.-]?secret|auth[a-z]*|credentials?|session[_.-]?id|session|cookie|signature|sig|key";

struct Rule {
    pattern: Regex,
    replacement: &'static str,
}

fn rule(pattern: &str, replacement: &'static str) -> Rule {
    // ASCII-only matching (`(?-u)`): the rules name ASCII shapes, and a
    // Unicode-aware program costs a helper ~10x the compile time. Only
    // ASCII bytes are ever excluded by a class, so a match never splits a
    // multi-byte character and the output stays valid UTF-8.
    let ascii = format!("(?-u){pattern}");
    Rule {
        // The patterns are constants tested below; a bad one is a build defect.
        pattern: Regex::new(&ascii).unwrap_or_else(|e| panic!("redaction rule {pattern}: {e}")),
        replacement,
    }
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        // 1. URL credentials.
        rule(
            r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@:]*:[^/\s@]*@",
            "${1}<redacted>@",
        ),
        // 2. PEM private keys.
        rule(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*", "<redacted>"),
        // 3. Authorization schemes.
        rule(
            r"(?i)\b(bearer|basic|token)(\s+|%20|\+)[A-Za-z0-9._~+/=-]{6,}",
            "${1}${2}<redacted>",
        ),
        // 4. Named values: key=value / key:value / --key value.
        rule(
            &format!(
                r#"(?i)((?:^|[^a-z0-9])[a-z0-9_.-]*(?:{SECRET_KEYS})[a-z0-9_.-]*["']?\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s&;,"']+)"#
            ),
            "${1}<redacted>",
        ),
        rule(
            &format!(r"(?i)((?:^|\s)--?[a-z0-9_.-]*(?:{SECRET_KEYS})[a-z0-9_.-]*\s+)([^\s-]\S*)"),
            "${1}<redacted>",
        ),
        // 5. Known key shapes.
        rule(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b", "<redacted>"),
        rule(r"\bAIza[0-9A-Za-z_-]{35}", "<redacted>"),
        rule(r"\bya29\.[0-9A-Za-z_-]{10,}", "<redacted>"),
        rule(r"\bgh[pousr]_[A-Za-z0-9]{36,255}", "<redacted>"),
        rule(r"\bgithub_pat_[A-Za-z0-9_]{22,255}", "<redacted>"),
        rule(r"\bxox[abposr]-[A-Za-z0-9-]{10,}", "<redacted>"),
        rule(
            r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
            "<redacted>",
        ),
    ]
});

/// Rule 6: a long run of token characters.
static LONG_RUN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?-u)[A-Za-z0-9+/=_-]{24,}").unwrap_or_else(|e| panic!("long-run rule: {e}"))
});

fn random_looking(run: &[u8]) -> bool {
    run.iter().any(u8::is_ascii_uppercase)
        && run.iter().any(u8::is_ascii_lowercase)
        && run.iter().any(u8::is_ascii_digit)
}

/// Whether no rule can match `text`: shorter than the shortest key shape
/// (15 bytes: `ya29.` + 10, `xoxb-` + 10) and without the separators every
/// other rule needs. Most names (`sleep`, `python3`) never compile the rules.
fn plainly_harmless(text: &str) -> bool {
    text.len() < 15
        && !text
            .bytes()
            .any(|b| matches!(b, b'=' | b':' | b'@' | b'-') || b.is_ascii_whitespace())
}

/// `text` with every secret-shaped part replaced by [`REDACTED`] (borrowed
/// when nothing matched).
pub fn redact_text(text: &str) -> Cow<'_, str> {
    if plainly_harmless(text) {
        return Cow::Borrowed(text);
    }
    let mut out: Cow<'_, [u8]> = Cow::Borrowed(text.as_bytes());
    for r in RULES.iter() {
        if r.pattern.is_match(&out) {
            let replaced = r
                .pattern
                .replace_all(&out, r.replacement.as_bytes())
                .into_owned();
            out = Cow::Owned(replaced);
        }
    }
    if LONG_RUN
        .find_iter(&out)
        .any(|m| random_looking(m.as_bytes()))
    {
        let replaced = LONG_RUN
            .replace_all(&out, |c: &regex::bytes::Captures<'_>| {
                if random_looking(&c[0]) {
                    REDACTED.as_bytes().to_vec()
                } else {
                    c[0].to_vec()
                }
            })
            .into_owned();
        out = Cow::Owned(replaced);
    }
    match out {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        // Only whole ASCII-delimited runs were replaced by ASCII: still UTF-8.
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// Whether `text` holds anything secret-shaped.
pub fn looks_secret(text: &str) -> bool {
    matches!(redact_text(text), Cow::Owned(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (input, the secret that must be gone, what must remain).
    const CORPUS: &[(&str, &str, &str)] = &[
        ("--token=TOKzzSECRET456", "TOKzzSECRET456", "--token="),
        ("worker --token=TOKzzSECRET456", "TOKzzSECRET456", "worker"),
        ("--password=hunter2zz", "hunter2zz", "--password="),
        ("mysql --password hunter2zz", "hunter2zz", "--password"),
        ("PGPASSWORD=s3cr3t", "s3cr3t", "PGPASSWORD="),
        ("db_pass=s3cr3t", "s3cr3t", "db_pass="),
        ("api_key=abcd1234efgh", "abcd1234efgh", "api_key="),
        ("apikey: abcd1234efgh", "abcd1234efgh", "apikey"),
        ("client_secret='q w e'", "q w e", "client_secret="),
        ("session=8f7e6d5c4b3a", "8f7e6d5c4b3a", "session="),
        (
            "Authorization: Bearer abc.def.ghi123",
            "abc.def.ghi123",
            "Authorization:",
        ),
        ("curl -H Bearer abc.def.ghi123", "abc.def.ghi123", "Bearer"),
        (
            "bearer eyJhbGciOiJIUzI1NiJ9",
            "eyJhbGciOiJIUzI1NiJ9",
            "bearer",
        ),
        (
            "Basic dXNlcjpwYXNzd29yZA==",
            "dXNlcjpwYXNzd29yZA==",
            "Basic",
        ),
        (
            "postgres://app:Pa55w0rd@db.internal:5432/app",
            "Pa55w0rd",
            "db.internal:5432/app",
        ),
        (
            "https://user:tok@github.com/o/r.git",
            "user:tok",
            "github.com/o/r.git",
        ),
        ("redis://:onlypass@cache:6379", "onlypass", "cache:6379"),
        ("AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", ""),
        (
            "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "aws_secret_access_key=",
        ),
        (
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "",
        ),
        (
            "AIzaSyA1234567890abcdefghijklmnopqrstu",
            "AIzaSyA1234567890abcdefghijklmnopqrstu",
            "",
        ),
        (
            "ya29.a0AfH6SMBexampletoken",
            "ya29.a0AfH6SMBexampletoken",
            "",
        ),
        (
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "",
        ),
        (
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
            "",
        ),
        (
            "xoxb-123456789012-abcdefghij",
            "xoxb-123456789012-abcdefghij",
            "",
        ),
        (
            "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBg",
            "MIIEvQIBADANBg",
            "",
        ),
        ("--token=TOKzzSE", "TOKzzSE", "--token="),
    ];

    /// Ordinary names that must survive untouched.
    const KEEP: &[&str] = &[
        "postgres: checkpointer",
        "/usr/sbin/nginx",
        "kworker/0:1H-kblockd",
        "systemd-journald",
        "worker",
        "python3",
        "java",
        "sshd: root@pts/0",
        "containerd-shim-runc-v2",
        "--keep-alive",
        "sleep",
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
        "https://example.com/path",
    ];

    #[test]
    fn every_corpus_secret_is_redacted_and_context_kept() {
        for (input, secret, kept) in CORPUS {
            let out = redact_text(input);
            assert!(!out.contains(secret), "{input:?} -> {out:?}");
            assert!(out.contains(kept), "{input:?} -> {out:?} lost {kept:?}");
            assert!(out.contains(REDACTED), "{input:?} -> {out:?}");
            assert!(looks_secret(input));
        }
    }

    #[test]
    fn ordinary_names_are_untouched() {
        for input in KEEP {
            assert_eq!(redact_text(input), *input, "{input:?}");
            assert!(!looks_secret(input), "{input:?}");
        }
    }
}

#[cfg(test)]
mod unicode_tests {
    use super::*;

    #[test]
    fn non_ascii_text_survives_and_secrets_next_to_it_do_not() {
        assert_eq!(redact_text("café-worker"), "café-worker");
        let out = redact_text("naïve password=sécret ünd");
        assert!(!out.contains("sécret"), "{out}");
        assert!(out.contains("naïve") && out.contains("ünd"), "{out}");
    }
}
