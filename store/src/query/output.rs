//! What every query command shares: why one failed and its exit code, and
//! how a value and a table are printed.

use serde_json::Value;

use crate::client::ClientError;

/// Exit code of a failed query.
pub fn exit_code(e: &ClientError) -> i32 {
    match e {
        ClientError::NotFound { .. } => 3,
        ClientError::BadQuery { .. } | ClientError::BadUrl(_) => 2,
        _ => 1,
    }
}

/// Why a query command did not run.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The store (or the way to it) failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The key file could not be read.
    #[error("--api-key-file {path}: {source}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Writing to stdout failed (e.g. its reader went away).
    #[error(transparent)]
    Output(#[from] std::io::Error),
}

impl QueryError {
    /// Stdout's reader went away (`| head`): not an error worth a word.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, QueryError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            QueryError::Client(e) => exit_code(e),
            QueryError::KeyFile { .. } => 2,
            QueryError::Output(_) => 1,
        }
    }
}

pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Print rows with column widths; the last column takes what is left of
/// the terminal (and everything off a terminal).
pub(crate) fn print_table(
    header: &[&str],
    widths: &[usize],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
    use pstack_cli::output::{cell, fit_line, terminal_columns};
    let columns = terminal_columns();
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            match widths.get(i) {
                Some(w) => {
                    out.push_str(&cell(c, *w));
                    out.push_str("  ");
                }
                None => out.push_str(c),
            }
        }
        fit_line(out.trim_end(), columns).into_owned()
    };
    let mut out = line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    pstack_cli::out!("{out}")
}
