//! Constructors of a [`Surface`], so that engines state what they read (or
//! why they could not) instead of rebuilding the struct field by field.
//!
//! Invariants: a read surface has no cause; an unread one has a cause, no
//! digest, no bytes and is not truncated. The constructors set nothing the
//! caller did not give them (the envelope's bytes are the caller's choice).

use serde_json::{Map, Value};

use crate::{StatusCause, Surface, SurfaceStatus};

impl Surface {
    /// A surface that was read (`ok`): its raw bytes' digest and length
    /// when they were kept, and the facts read from them.
    pub fn read(
        id: impl Into<String>,
        authority: impl Into<String>,
        deadline_ms: u64,
        elapsed_us: u64,
        raw: Option<(String, u64)>,
        facts: Map<String, Value>,
    ) -> Surface {
        let (digest, bytes) = match raw {
            Some((d, b)) => (Some(d), b),
            None => (None, 0),
        };
        Surface {
            id: id.into(),
            authority: authority.into(),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms,
            elapsed_us,
            digest,
            bytes,
            truncated: false,
            facts,
        }
    }

    /// A surface that was not read: its status (timeout, denied, skipped, …)
    /// and the cause, no facts (add some with [`Surface::with_facts`]).
    pub fn unread(
        id: impl Into<String>,
        authority: impl Into<String>,
        deadline_ms: u64,
        elapsed_us: u64,
        status: SurfaceStatus,
        cause: StatusCause,
    ) -> Surface {
        Surface {
            id: id.into(),
            authority: authority.into(),
            status,
            cause: Some(cause),
            deadline_ms,
            elapsed_us,
            digest: None,
            bytes: 0,
            truncated: false,
            facts: Map::new(),
        }
    }

    /// The same surface with these facts.
    pub fn with_facts(mut self, facts: Map<String, Value>) -> Surface {
        self.facts = facts;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_and_unread_surfaces_carry_what_they_were_given() {
        let mut facts = Map::new();
        facts.insert("n".into(), 1.into());
        let s = Surface::read(
            "a",
            "auth",
            2000,
            7,
            Some(("sha256:x".into(), 3)),
            facts.clone(),
        );
        assert_eq!(
            (
                s.status,
                s.cause.is_none(),
                s.digest.as_deref(),
                s.bytes,
                s.truncated
            ),
            (SurfaceStatus::Ok, true, Some("sha256:x"), 3, false)
        );
        assert_eq!(s.facts, facts);
        let s = Surface::read("a", "auth", 2000, 7, None, Map::new());
        assert_eq!((s.digest, s.bytes), (None, 0));
        let cause = StatusCause {
            errno: Some(13),
            message: "denied".into(),
        };
        let u = Surface::unread(
            "b",
            "auth",
            5,
            9,
            SurfaceStatus::PermissionDenied,
            cause.clone(),
        )
        .with_facts(facts.clone());
        assert_eq!(u.status, SurfaceStatus::PermissionDenied);
        assert_eq!(u.cause, Some(cause));
        assert_eq!(
            (u.deadline_ms, u.elapsed_us, u.bytes, u.digest),
            (5, 9, 0, None)
        );
        assert_eq!(u.facts, facts);
    }
}
