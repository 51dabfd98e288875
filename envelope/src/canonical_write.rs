//! Seal's canonical writer: the typed model straight into RFC 8785 bytes,
//! with no `serde_json::Value` tree and no serde `Serializer` in between.
//!
//! # Invariants
//!
//! - **Same bytes as the general canonicalizer.** For every envelope it
//!   accepts, the output equals `canonical_without_digest` of the model
//!   rendered as a `Value` (the JCS reference data and a property test against
//!   an independent canonicalizer check this): members in RFC 8785 order
//!   (struct fields written in name order, which for these ASCII names is
//!   UTF-16 order; free-form maps in `BTreeMap` byte order, re-sorted by
//!   UTF-16 code units only when a name holds a character above U+FFFF),
//!   optional members omitted exactly when serde omits them, strings escaped
//!   as ECMAScript's `JSON.stringify` does, integers in plain decimal.
//! - **Refuse, never render, what the envelope forbids.** A float or an
//!   integer beyond ±(2^53-1) makes it return [`Refused`]; the caller then
//!   runs the general canonicalizer, which names the value and its path.
//! - **The digest excludes `digest`.** The writer renders the envelope minus
//!   its `digest` member; when hashing it streams the bytes into SHA-256 in
//!   blocks, so a large envelope never sits whole in memory.
//!
//! Hand-written on purpose: no maintained crate serializes a typed model
//! straight into RFC 8785 while refusing floats and unsafe integers (the JCS
//! crates canonicalize a `Value` they are given, and render floats), and the
//! envelope's member order is fixed by its schema, so a writer per struct is
//! both exact and the fastest way to the bytes.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::model::*;
use crate::scan::find_special;
use crate::strict::MAX_SAFE_INTEGER;

/// The writer met a float or an unsafe integer: the general path must name it.
#[derive(Debug)]
pub(crate) struct Refused;

type W = Result<(), Refused>;

/// Hash the buffer once it holds about this much (at a surface boundary).
const HASH_BLOCK: usize = 64 * 1024;

/// Canonical bytes of `e` minus its digest.
pub(crate) fn body_bytes(e: &Envelope) -> Result<Vec<u8>, Refused> {
    let mut w = Writer {
        buf: Vec::with_capacity(4096),
        hasher: None,
    };
    w.envelope(e)?;
    Ok(w.buf)
}

/// `sha256:<hex>` of the canonical bytes of `e` minus its digest.
pub(crate) fn body_digest(e: &Envelope) -> Result<String, Refused> {
    let mut w = Writer {
        buf: Vec::with_capacity(HASH_BLOCK + HASH_BLOCK / 2),
        hasher: Some(Sha256::new()),
    };
    w.envelope(e)?;
    let mut hasher = w.hasher.take().unwrap_or_default();
    hasher.update(&w.buf);
    let mut out = String::with_capacity(crate::form::DIGEST_PREFIX.len() + 64);
    out.push_str(crate::form::DIGEST_PREFIX);
    out.push_str(&hex::encode(hasher.finalize()));
    Ok(out)
}

struct Writer {
    buf: Vec<u8>,
    hasher: Option<Sha256>,
}

impl Writer {
    #[inline]
    fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn flush_if_full(&mut self) {
        if let Some(h) = &mut self.hasher
            && self.buf.len() >= HASH_BLOCK
        {
            h.update(&self.buf);
            self.buf.clear();
        }
    }

    fn string(&mut self, s: &str) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let b = s.as_bytes();
        self.buf.reserve(b.len() + 2);
        self.buf.push(b'"');
        let mut from = 0;
        loop {
            let stop = find_special(b, from);
            self.buf.extend_from_slice(&b[from..stop]);
            let Some(&c) = b.get(stop) else { break };
            match c {
                b'"' => self.raw(b"\\\""),
                b'\\' => self.raw(b"\\\\"),
                b'\n' => self.raw(b"\\n"),
                b'\r' => self.raw(b"\\r"),
                b'\t' => self.raw(b"\\t"),
                0x08 => self.raw(b"\\b"),
                0x0c => self.raw(b"\\f"),
                _ => self.raw(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(c >> 4) as usize],
                    HEX[(c & 0xf) as usize],
                ]),
            }
            from = stop + 1;
        }
        self.buf.push(b'"');
    }

    fn u64(&mut self, v: u64) -> W {
        if v > MAX_SAFE_INTEGER {
            return Err(Refused);
        }
        self.raw(itoa::Buffer::new().format(v).as_bytes());
        Ok(())
    }

    fn i64(&mut self, v: i64) -> W {
        if v.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(Refused);
        }
        self.raw(itoa::Buffer::new().format(v).as_bytes());
        Ok(())
    }

    fn bool(&mut self, v: bool) {
        self.raw(if v { b"true" } else { b"false" });
    }

    fn strings(&mut self, items: &[String]) {
        self.buf.push(b'[');
        for (i, s) in items.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            self.string(s);
        }
        self.buf.push(b']');
    }

    /// A free-form object: `map` iterates in byte order (a `BTreeMap`), which
    /// is RFC 8785's UTF-16 order unless a name holds a character above
    /// U+FFFF; only then are the members sorted again.
    fn members<'a, V: 'a, I>(&mut self, map: I, mut value: impl FnMut(&mut Self, &'a V) -> W) -> W
    where
        I: Iterator<Item = (&'a String, &'a V)> + Clone,
    {
        self.buf.push(b'{');
        let astral = map.clone().any(|(k, _)| k.bytes().any(|b| b >= 0xF0));
        let mut write = |w: &mut Self, i: usize, k: &str, v: &'a V| {
            if i > 0 {
                w.buf.push(b',');
            }
            w.string(k);
            w.buf.push(b':');
            value(w, v)
        };
        if astral {
            let mut items: Vec<(&String, &V)> = map.collect();
            items.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            for (i, (k, v)) in items.into_iter().enumerate() {
                write(self, i, k, v)?;
            }
        } else {
            for (i, (k, v)) in map.enumerate() {
                write(self, i, k, v)?;
            }
        }
        self.buf.push(b'}');
        Ok(())
    }

    fn value(&mut self, v: &Value) -> W {
        match v {
            Value::Null => self.raw(b"null"),
            Value::Bool(b) => self.bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    self.u64(u)?;
                } else if let Some(i) = n.as_i64() {
                    self.i64(i)?;
                } else {
                    return Err(Refused);
                }
            }
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                self.buf.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.buf.push(b',');
                    }
                    self.value(item)?;
                }
                self.buf.push(b']');
            }
            Value::Object(map) => self.object(map)?,
        }
        Ok(())
    }

    fn object(&mut self, map: &Map<String, Value>) -> W {
        self.members(map.iter(), |w, v| w.value(v))
    }

    fn envelope(&mut self, e: &Envelope) -> W {
        self.raw(b"{\"bounds\":");
        self.bounds(&e.bounds)?;
        self.raw(b",\"claims\":[");
        for (i, c) in e.claims.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            self.claim(c);
        }
        self.raw(b"],\"clock\":{\"bundle_deadline_ms\":");
        self.u64(e.clock.bundle_deadline_ms)?;
        self.raw(b",\"monotonic_end_ns\":");
        self.string(&e.clock.monotonic_end_ns);
        self.raw(b",\"monotonic_start_ns\":");
        self.string(&e.clock.monotonic_start_ns);
        self.raw(b",\"wall_time\":");
        self.string(&e.clock.wall_time);
        self.raw(b"},\"collector\":");
        self.collector(&e.collector)?;
        self.raw(b",\"completeness\":\"");
        self.raw(e.completeness.as_str().as_bytes());
        // `digest` sorts here and is left out.
        self.raw(b"\",\"next_transition\":{\"abort_conditions\":");
        self.strings(&e.next_transition.abort_conditions);
        self.raw(b",\"action\":");
        self.string(&e.next_transition.action);
        self.raw(b",\"success_receipt\":");
        self.string(&e.next_transition.success_receipt);
        self.raw(b"},\"schema\":");
        self.string(&e.schema);
        self.raw(b",\"subject\":");
        self.subject(&e.subject)?;
        self.raw(b",\"surfaces\":[");
        for (i, s) in e.surfaces.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            self.surface(s)?;
            self.flush_if_full();
        }
        self.raw(b"],\"universe\":{\"expected_count\":");
        self.u64(e.universe.expected_count)?;
        self.raw(b",\"observed_count\":");
        self.u64(e.universe.observed_count)?;
        self.raw(b",\"selector\":");
        self.string(&e.universe.selector);
        self.raw(b",\"selector_digest\":");
        self.string(&e.universe.selector_digest);
        self.raw(b",\"termination\":\"");
        self.raw(e.universe.termination.as_str().as_bytes());
        self.raw(b"\"},\"unknowns\":[");
        for (i, u) in e.unknowns.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            self.unknown(u);
        }
        self.raw(b"]}");
        Ok(())
    }

    fn bounds(&mut self, b: &Bounds) -> W {
        self.raw(b"{\"bundle_deadline_ms\":");
        self.u64(b.bundle_deadline_ms)?;
        if !b.caps.is_empty() {
            self.raw(b",\"caps\":");
            self.members(b.caps.iter(), |w, v| w.u64(*v))?;
        }
        self.raw(b",\"leak_budget\":");
        self.u64(b.leak_budget)?;
        self.raw(b",\"max_bytes_per_surface\":");
        self.u64(b.max_bytes_per_surface)?;
        self.raw(b",\"max_threads\":");
        self.u64(b.max_threads)?;
        self.raw(b",\"surface_deadline_ms\":");
        self.u64(b.surface_deadline_ms)?;
        self.buf.push(b'}');
        Ok(())
    }

    fn claim(&mut self, c: &Claim) {
        self.raw(b"{\"code\":");
        self.string(&c.code);
        if let Some(f) = &c.falsifier {
            self.raw(b",\"falsifier\":");
            self.string(f);
        }
        self.raw(b",\"id\":");
        self.string(&c.id);
        self.raw(b",\"kind\":\"");
        self.raw(c.kind.as_str().as_bytes());
        self.raw(match c.scope {
            Scope::Existential => b"\",\"scope\":\"existential\",\"statement\":".as_slice(),
            Scope::Universal => b"\",\"scope\":\"universal\",\"statement\":",
        });
        self.string(&c.statement);
        self.raw(b",\"surfaces\":");
        self.strings(&c.surfaces);
        self.buf.push(b'}');
    }

    fn collector(&mut self, c: &Collector) -> W {
        self.raw(b"{\"name\":");
        self.string(&c.name);
        self.raw(b",\"source_commit\":");
        self.string(&c.source_commit);
        if let Some(t) = &c.trigger {
            self.raw(b",\"trigger\":{\"condition\":");
            self.members(t.condition.iter(), |w, v| {
                w.string(v);
                Ok(())
            })?;
            self.raw(b",\"fired_at\":");
            self.string(&t.fired_at);
            self.raw(b",\"kind\":");
            self.string(&t.kind);
            self.raw(b",\"rule\":");
            self.string(&t.rule);
            self.buf.push(b'}');
        }
        self.raw(b",\"version\":");
        self.string(&c.version);
        self.buf.push(b'}');
        Ok(())
    }

    fn process_identity(&mut self, p: &ProcessIdentity) -> W {
        self.raw(b"{\"boot_id\":");
        self.string(&p.boot_id);
        self.raw(b",\"cgroup\":");
        self.string(&p.cgroup);
        self.raw(b",\"host\":");
        self.string(&p.host);
        self.raw(b",\"pid\":");
        self.u64(p.pid.into())?;
        self.raw(b",\"pid_ns\":");
        self.string(&p.pid_ns);
        self.raw(b",\"start_ticks\":");
        self.u64(p.start_ticks)?;
        self.raw(b",\"uid\":");
        self.u64(p.uid.into())?;
        self.buf.push(b'}');
        Ok(())
    }

    fn subject(&mut self, s: &Subject) -> W {
        self.raw(b"{\"identity\":");
        match s {
            Subject::Process(p) => self.process_identity(p)?,
            Subject::Thread(t) => {
                self.raw(b"{\"process\":");
                self.process_identity(&t.process)?;
                self.raw(b",\"tid\":");
                self.u64(t.tid.into())?;
                self.buf.push(b'}');
            }
            Subject::NetworkStream(n) => {
                self.raw(b"{\"dst\":");
                self.string(&n.dst);
                self.raw(b",\"flow_id\":");
                self.string(&n.flow_id);
                if let Some(ns) = &n.net_ns {
                    self.raw(b",\"net_ns\":");
                    self.string(ns);
                }
                self.raw(b",\"protocol\":");
                self.string(&n.protocol);
                self.raw(b",\"src\":");
                self.string(&n.src);
                self.buf.push(b'}');
            }
            Subject::StorageTransfer(t) => {
                self.raw(b"{\"engine\":");
                self.string(&t.engine);
                self.raw(b",\"source_node\":");
                self.string(&t.source_node);
                self.raw(b",\"target_node\":");
                self.string(&t.target_node);
                self.raw(b",\"transfer_id\":");
                self.string(&t.transfer_id);
                self.raw(b",\"volume\":");
                self.string(&t.volume);
                self.buf.push(b'}');
            }
            Subject::Host(h) => {
                self.raw(b"{\"boot_id\":");
                self.string(&h.boot_id);
                self.raw(b",\"host\":");
                self.string(&h.host);
                self.buf.push(b'}');
            }
        }
        self.raw(b",\"kind\":\"");
        self.raw(s.kind().as_bytes());
        self.raw(b"\"}");
        Ok(())
    }

    fn surface(&mut self, s: &Surface) -> W {
        self.raw(b"{\"authority\":");
        self.string(&s.authority);
        self.raw(b",\"bytes\":");
        self.u64(s.bytes)?;
        if let Some(c) = &s.cause {
            self.raw(b",\"cause\":{");
            if let Some(errno) = c.errno {
                self.raw(b"\"errno\":");
                self.i64(errno.into())?;
                self.buf.push(b',');
            }
            self.raw(b"\"message\":");
            self.string(&c.message);
            self.buf.push(b'}');
        }
        self.raw(b",\"deadline_ms\":");
        self.u64(s.deadline_ms)?;
        if let Some(d) = &s.digest {
            self.raw(b",\"digest\":");
            self.string(d);
        }
        self.raw(b",\"elapsed_us\":");
        self.u64(s.elapsed_us)?;
        self.raw(b",\"facts\":");
        self.object(&s.facts)?;
        self.raw(b",\"id\":");
        self.string(&s.id);
        self.raw(b",\"status\":\"");
        self.raw(s.status.as_str().as_bytes());
        self.raw(b"\",\"truncated\":");
        self.bool(s.truncated);
        self.buf.push(b'}');
        Ok(())
    }

    fn unknown(&mut self, u: &Unknown) {
        self.raw(b"{\"blocks\":");
        self.string(&u.blocks);
        self.raw(b",\"id\":");
        self.string(&u.id);
        self.raw(b",\"owner\":");
        self.string(&u.owner);
        self.raw(b",\"probe\":");
        self.string(&u.probe);
        self.raw(b",\"question\":");
        self.string(&u.question);
        if let Some(s) = &u.surface {
            self.raw(b",\"surface\":");
            self.string(s);
        }
        self.buf.push(b'}');
    }
}
