//! Verify's fast path: one pass over bytes that are already the canonical
//! form, as every envelope pstack writes is (`serde_json::to_vec` of the
//! model, whose fields are declared in RFC 8785 member order).
//!
//! # Invariants
//!
//! - **Accept only what the general path would accept identically.** The pass
//!   returns a typed envelope only when the bytes (leading and trailing
//!   whitespace aside) are exactly the canonical rendering of that envelope:
//!   members in RFC 8785 order, no insignificant whitespace, strings escaped
//!   as RFC 8785 escapes them and nothing else escaped, integers in plain
//!   decimal without `-0`. Anything else — a byte out of place, a float, an
//!   integer beyond ±(2^53-1) or its field's type, nesting past
//!   [`MAX_DEPTH`], invalid UTF-8, a duplicate or unknown member, a missing
//!   one, `null` in an optional member, `"caps":{}` or an absent `probe`
//!   (which the model would not render back) — makes it return `None`, and
//!   the caller runs the general path, which names the problem. So the fast
//!   path never produces a verdict of its own making: where it decides, the
//!   general path would decide the same (a property test checks this).
//! - **No second serialization.** Because the bytes are canonical, the digest
//!   input is the bytes themselves minus the `digest` member: canonical order
//!   puts `digest` between `completeness` and `next_transition`, so the hash
//!   covers `{...,"completeness":"…"` and then `,"next_transition":…}`, fed to
//!   SHA-256 while the parse advances (in blocks, so the bytes are hashed
//!   while still in cache). From 256 KiB up a hashing thread scoped to the
//!   call takes the bytes before the digest member as soon as the parse has
//!   passed them and everything after it at once (the input is fixed, so the
//!   hash may run ahead of the parse: a refusal discards it), so the hash
//!   runs beside the parse; the thread ends when the reader is dropped, on
//!   success or refusal.
//! - **Strict in the same pass.** Duplicate keys (as keys not strictly
//!   ascending), floats, unsafe integers, depth and UTF-8 are checked by the
//!   same scan that parses and checks canonical form.
//! - **Bounded.** Recursion is bounded by [`MAX_DEPTH`]; every read is
//!   bounds-checked; hostile input costs at most this pass plus the general
//!   path.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

use crate::canonical_cursor::{Cursor, is_ws};
use crate::model::*;
use crate::scan::{find_special, name_before};
use crate::strict::MAX_DEPTH;

/// `None`: not canonical or not valid; the general path decides.
type R<T> = Option<T>;

/// Hash in blocks of about this many bytes as the parse passes them.
const HASH_BLOCK: usize = 32 * 1024;

/// Parse canonical envelope bytes and hash them minus `digest`, in one pass.
/// Returns the envelope and `sha256:<hex>` of its canonical form without
/// `digest`, or `None` when the general path must decide.
pub(crate) fn read_canonical(bytes: &[u8]) -> R<(Envelope, String)> {
    let start = bytes.iter().position(|b| !is_ws(*b))?;
    let end = bytes.len() - bytes.iter().rev().position(|b| !is_ws(*b))?;
    let body = &bytes[..end];
    let (env, digest) = if body.len() >= PIPELINE_FROM {
        // Large envelopes use both cores. A second thread parses the last
        // part of the surfaces array (from a surface boundary found by
        // search, see `tail_split`) and then hashes, while this thread
        // parses the rest and hands the second the ranges to hash. Same
        // bytes, same order, same digest; each byte parsed once.
        let split = tail_split(body, start);
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, usize)>(PIPELINE_DEPTH);
            let (tail_tx, tail_rx) = std::sync::mpsc::sync_channel::<R<(Vec<Surface>, usize)>>(1);
            let second = scope.spawn(move || {
                if let Some(at) = split {
                    // Refused by the receiver only once it has moved past
                    // `at` (not a boundary): the tail is then not needed.
                    let _ = tail_tx.send(surfaces_from(body, at));
                }
                let mut hasher = Sha256::new();
                while let Ok((from, to)) = rx.recv() {
                    hasher.update(&body[from..to]);
                }
                hasher.finalize()
            });
            let tail = split.map(|at| (at, tail_rx));
            let parsed = parse_all(body, start, HashSink::Thread(tx), tail);
            // The sender is dropped with the reader, which ends the thread.
            let digest = second.join().expect("the second thread does not panic");
            parsed.map(|env| (env, digest))
        })?
    } else {
        let mut hasher = Sha256::new();
        let env = parse_all(body, start, HashSink::Inline(&mut hasher), None)?;
        (env, hasher.finalize())
    };
    let mut out = String::with_capacity(crate::form::DIGEST_PREFIX.len() + 64);
    out.push_str(crate::form::DIGEST_PREFIX);
    out.push_str(&hex::encode(digest));
    Some((env, out))
}

/// Envelopes at least this large are verified on two threads.
const PIPELINE_FROM: usize = 256 * 1024;
/// Blocks in flight between the parse and the hashing thread.
const PIPELINE_DEPTH: usize = 64;
/// Where the second thread's part of the surfaces begins, in thousandths of
/// the input: it also hashes the whole input (about 0.4 of a parse), so it
/// parses the smaller part.
const TAIL_FROM_PERMILLE: usize = 600;
/// Every surface object starts with its `authority` member, so in canonical
/// bytes a boundary between two surfaces reads like this.
const SURFACE_BOUNDARY: &[u8] = b"},{\"authority\":\"";

/// Where the bytes the parse has passed go to be hashed.
enum HashSink<'h> {
    Inline(&'h mut Sha256),
    /// Ranges of the input, in order, to the hashing thread.
    Thread(std::sync::mpsc::SyncSender<(usize, usize)>),
    /// Nowhere: a part parsed by the second thread, which the hash covers
    /// through the main parse's ranges.
    Skip,
}

/// The second thread's part: from the first thing after
/// `TAIL_FROM_PERMILLE` that looks like a surface boundary, the offset of
/// that surface's `{`. Only a guess: the pattern can also occur inside a
/// fact (an array of objects with an `authority` member); it is a real
/// split only if the main parse, reading surfaces, stops exactly there.
fn tail_split(body: &[u8], start: usize) -> Option<usize> {
    let from = start + (body.len() - start) / 1000 * TAIL_FROM_PERMILLE;
    body.get(from..)?
        .windows(SURFACE_BOUNDARY.len())
        .position(|w| w == SURFACE_BOUNDARY)
        .map(|at| from + at + 2)
}

/// Surfaces from `at` to the end of their array: the surfaces and the
/// offset just past the array's `]`, or `None` where the bytes are not that
/// (whether because `at` was no boundary or because they are not canonical).
fn surfaces_from(body: &[u8], at: usize) -> R<(Vec<Surface>, usize)> {
    let mut r = Reader {
        at: Cursor { b: body, pos: at },
        sink: HashSink::Skip,
        hashed: at,
        stack: Vec::new(),
        tail: None,
    };
    let mut out = Vec::new();
    loop {
        out.push(r.surface()?);
        match r.peek()? {
            b',' => r.pos += 1,
            b']' => return Some((out, r.pos + 1)),
            _ => return None,
        }
    }
}

/// The whole envelope and nothing after it; every byte up to the end fed to
/// the sink (minus the digest member).
fn parse_all(
    body: &[u8],
    start: usize,
    sink: HashSink<'_>,
    tail: Option<(usize, TailReceiver)>,
) -> R<Envelope> {
    let mut r = Reader {
        at: Cursor {
            b: body,
            pos: start,
        },
        sink,
        hashed: start,
        stack: Vec::new(),
        tail,
    };
    let env = r.envelope()?;
    if r.pos != r.b.len() {
        return None;
    }
    r.feed_to(r.pos);
    Some(env)
}

/// The second thread's surfaces, when its split was a real boundary.
type TailReceiver = std::sync::mpsc::Receiver<R<(Vec<Surface>, usize)>>;

struct Reader<'a, 'h> {
    /// The input and the position in it (`self.b`, `self.pos` through
    /// `Deref`).
    at: Cursor<'a>,
    sink: HashSink<'h>,
    /// Bytes before this offset (minus the digest member) are hashed.
    hashed: usize,
    /// Items of the arrays being read, so each array is allocated once at
    /// its final length.
    stack: Vec<Value>,
    /// Where the second thread's surfaces begin, and its answer.
    tail: Option<(usize, TailReceiver)>,
}

impl<'a> std::ops::Deref for Reader<'a, '_> {
    type Target = Cursor<'a>;
    fn deref(&self) -> &Cursor<'a> {
        &self.at
    }
}

impl std::ops::DerefMut for Reader<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.at
    }
}

impl<'a> Reader<'a, '_> {
    fn feed_to(&mut self, to: usize) {
        if to > self.hashed {
            let b = self.at.b;
            match &mut self.sink {
                HashSink::Inline(hasher) => hasher.update(&b[self.hashed..to]),
                // A send fails only when the thread is gone, which it is not
                // before the reader is dropped.
                HashSink::Thread(tx) => {
                    let _ = tx.send((self.hashed, to));
                }
                HashSink::Skip => {}
            }
            self.hashed = to;
        }
    }

    /// With a hashing thread: hand it everything after the digest member at
    /// once, ahead of the parse. The bytes are fixed and the digest input
    /// past this point is all of them, so the thread needs nothing more from
    /// the parse (no handoff per block, no wake-ups); if the parse later
    /// refuses the bytes, the digest is discarded with them.
    fn hash_rest_ahead(&mut self) {
        if let HashSink::Thread(tx) = &self.sink {
            let _ = tx.send((self.hashed, self.b.len()));
            self.hashed = self.b.len();
        }
    }

    /// Hash what the parse has passed, once a block's worth has gathered.
    #[inline]
    fn feed(&mut self) {
        if self.pos.saturating_sub(self.hashed) >= HASH_BLOCK {
            self.feed_to(self.pos);
        }
    }

    /// A string's text, borrowed from the input unless it holds escapes.
    fn text(&mut self) -> R<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.pos;
        let stop = find_special(self.b, start);
        match self.b.get(stop) {
            Some(b'"') => {
                self.pos = stop + 1;
                let b: &'a [u8] = self.b;
                Some(Cow::Borrowed(std::str::from_utf8(&b[start..stop]).ok()?))
            }
            Some(b'\\') => self.escaped_string(start, stop).map(Cow::Owned),
            _ => None,
        }
    }

    fn string(&mut self) -> R<String> {
        self.text().map(Cow::into_owned)
    }

    /// A string holding escapes from `stop` on: each must be the one RFC 8785
    /// writes for its character, and only characters it escapes are escaped.
    fn escaped_string(&mut self, start: usize, mut stop: usize) -> R<String> {
        let mut out = Vec::with_capacity(stop - start + 16);
        let mut from = start;
        loop {
            out.extend_from_slice(&self.b[from..stop]);
            match self.b.get(stop)? {
                b'"' => {
                    self.pos = stop + 1;
                    return String::from_utf8(out).ok();
                }
                b'\\' => {
                    let (c, len) = match self.b.get(stop + 1)? {
                        b'"' => (b'"', 2),
                        b'\\' => (b'\\', 2),
                        b'b' => (0x08, 2),
                        b'f' => (0x0c, 2),
                        b'n' => (b'\n', 2),
                        b'r' => (b'\r', 2),
                        b't' => (b'\t', 2),
                        b'u' => {
                            let h = self.b.get(stop + 2..stop + 6)?;
                            if h[0] != b'0' || h[1] != b'0' || !matches!(h[2], b'0' | b'1') {
                                return None;
                            }
                            let lo = match h[3] {
                                d @ b'0'..=b'9' => d - b'0',
                                d @ b'a'..=b'f' => d - b'a' + 10,
                                _ => return None,
                            };
                            let c = (h[2] - b'0') << 4 | lo;
                            if matches!(c, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                                return None; // has a short escape
                            }
                            (c, 6)
                        }
                        _ => return None,
                    };
                    out.push(c);
                    from = stop + len;
                    stop = find_special(self.b, from);
                }
                _ => return None, // a raw control character
            }
        }
    }

    /// `[` items `]` read by `item`.
    fn array<T>(&mut self, mut item: impl FnMut(&mut Self) -> R<T>) -> R<Vec<T>> {
        self.eat(b'[')?;
        let mut out = Vec::new();
        if self.eat(b']').is_some() {
            return Some(out);
        }
        loop {
            out.push(item(self)?);
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    /// An object whose members are free-form (facts, caps, a trigger's
    /// condition): names strictly ascending in RFC 8785 order, which also
    /// rules out duplicates.
    fn members<T>(&mut self, mut value: impl FnMut(&mut Self) -> R<T>) -> R<Vec<(String, T)>> {
        self.eat(b'{')?;
        let mut out: Vec<(String, T)> = Vec::new();
        if self.eat(b'}').is_some() {
            return Some(out);
        }
        loop {
            let name = self.string()?;
            if let Some((prev, _)) = out.last()
                && !name_before(prev.as_bytes(), name.as_bytes())
            {
                return None;
            }
            self.eat(b':')?;
            let v = value(self)?;
            out.push((name, v));
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    /// Any JSON value at nesting `depth` (the strict parser's count).
    fn value(&mut self, depth: usize) -> R<Value> {
        match self.peek()? {
            b'"' => self.string().map(Value::String),
            b'{' => self.object(depth).map(Value::Object),
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.pos += 1;
                let base = self.stack.len();
                if self.eat(b']').is_none() {
                    loop {
                        let item = self.value(depth + 1)?;
                        self.stack.push(item);
                        match self.peek()? {
                            b',' => self.pos += 1,
                            b']' => {
                                self.pos += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                Some(Value::Array(self.stack.split_off(base)))
            }
            b't' | b'f' => self.bool().map(Value::Bool),
            b'n' => self.key(b"null").map(|()| Value::Null),
            b'-' => self.i64().map(|n| Value::Number(Number::from(n))),
            _ => self.u64().map(|n| Value::Number(Number::from(n))),
        }
    }

    /// A free-form object at nesting `depth`: names strictly ascending in
    /// RFC 8785 order (which also rules out duplicates).
    fn object(&mut self, depth: usize) -> R<Map<String, Value>> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        let mut map = Map::new();
        if self.eat(b'}').is_some() {
            return Some(map);
        }
        let mut prev: Option<Cow<'a, str>> = None;
        loop {
            let name = self.text()?;
            if let Some(p) = &prev
                && !name_before(p.as_bytes(), name.as_bytes())
            {
                return None;
            }
            self.eat(b':')?;
            let v = self.value(depth + 1)?;
            map.insert(name.to_string(), v);
            prev = Some(name);
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Some(map);
                }
                _ => return None,
            }
        }
    }

    fn envelope(&mut self) -> R<Envelope> {
        self.eat(b'{')?;
        self.key(b"\"bounds\":")?;
        let bounds = self.bounds()?;
        self.next_key(b"\"claims\":")?;
        let claims = self.array(Self::claim)?;
        self.next_key(b"\"clock\":")?;
        let clock = self.clock()?;
        self.next_key(b"\"collector\":")?;
        let collector = self.collector()?;
        self.next_key(b"\"completeness\":")?;
        let completeness = self.completeness()?;
        // The digest member is not part of what it digests.
        self.feed_to(self.pos);
        self.next_key(b"\"digest\":")?;
        let digest = self.string()?;
        self.hashed = self.pos;
        self.hash_rest_ahead();
        self.next_key(b"\"next_transition\":")?;
        let next_transition = self.next_transition()?;
        self.next_key(b"\"schema\":")?;
        let schema = self.string()?;
        if schema != SCHEMA_ID {
            return None;
        }
        self.next_key(b"\"subject\":")?;
        let subject = self.subject()?;
        self.next_key(b"\"surfaces\":")?;
        let surfaces = self.surfaces()?;
        self.next_key(b"\"universe\":")?;
        let universe = self.universe()?;
        self.next_key(b"\"unknowns\":")?;
        let unknowns = self.array(Self::unknown)?;
        self.eat(b'}')?;
        Some(Envelope {
            bounds,
            claims,
            clock,
            collector,
            completeness,
            digest,
            next_transition,
            schema,
            subject,
            surfaces,
            universe,
            unknowns,
        })
    }

    fn bounds(&mut self) -> R<Bounds> {
        self.eat(b'{')?;
        self.key(b"\"bundle_deadline_ms\":")?;
        let bundle_deadline_ms = self.u64()?;
        let caps: BTreeMap<String, u64> = if self.opt_key(b"\"caps\":") {
            let caps = self.members(|r| r.u64())?;
            if caps.is_empty() {
                return None; // the model omits empty caps
            }
            caps.into_iter().collect()
        } else {
            BTreeMap::new()
        };
        self.next_key(b"\"leak_budget\":")?;
        let leak_budget = self.u64()?;
        self.next_key(b"\"max_bytes_per_surface\":")?;
        let max_bytes_per_surface = self.u64()?;
        self.next_key(b"\"max_threads\":")?;
        let max_threads = self.u64()?;
        self.next_key(b"\"surface_deadline_ms\":")?;
        let surface_deadline_ms = self.u64()?;
        self.eat(b'}')?;
        Some(Bounds {
            bundle_deadline_ms,
            caps,
            leak_budget,
            max_bytes_per_surface,
            max_threads,
            surface_deadline_ms,
        })
    }

    fn claim(&mut self) -> R<Claim> {
        self.eat(b'{')?;
        self.key(b"\"code\":")?;
        let code = self.string()?;
        let falsifier = if self.opt_key(b"\"falsifier\":") {
            Some(self.string()?)
        } else {
            None
        };
        self.next_key(b"\"id\":")?;
        let id = self.string()?;
        self.next_key(b"\"kind\":")?;
        let kind = match &*self.text()? {
            "fact" => ClaimKind::Fact,
            "inference" => ClaimKind::Inference,
            "hypothesis" => ClaimKind::Hypothesis,
            _ => return None,
        };
        self.next_key(b"\"scope\":")?;
        let scope = match &*self.text()? {
            "existential" => Scope::Existential,
            "universal" => Scope::Universal,
            _ => return None,
        };
        self.next_key(b"\"statement\":")?;
        let statement = self.string()?;
        self.next_key(b"\"surfaces\":")?;
        let surfaces = self.array(Self::string)?;
        self.eat(b'}')?;
        Some(Claim {
            code,
            falsifier,
            id,
            kind,
            scope,
            statement,
            surfaces,
        })
    }

    fn clock(&mut self) -> R<Clock> {
        self.eat(b'{')?;
        self.key(b"\"bundle_deadline_ms\":")?;
        let bundle_deadline_ms = self.u64()?;
        self.next_key(b"\"monotonic_end_ns\":")?;
        let monotonic_end_ns = self.string()?;
        self.next_key(b"\"monotonic_start_ns\":")?;
        let monotonic_start_ns = self.string()?;
        self.next_key(b"\"wall_time\":")?;
        let wall_time = self.string()?;
        self.eat(b'}')?;
        Some(Clock {
            bundle_deadline_ms,
            monotonic_end_ns,
            monotonic_start_ns,
            wall_time,
        })
    }

    fn collector(&mut self) -> R<Collector> {
        self.eat(b'{')?;
        self.key(b"\"name\":")?;
        let name = self.string()?;
        self.next_key(b"\"source_commit\":")?;
        let source_commit = self.string()?;
        let trigger = if self.opt_key(b"\"trigger\":") {
            Some(self.trigger()?)
        } else {
            None
        };
        self.next_key(b"\"version\":")?;
        let version = self.string()?;
        self.eat(b'}')?;
        Some(Collector {
            name,
            source_commit,
            trigger,
            version,
        })
    }

    fn trigger(&mut self) -> R<Trigger> {
        self.eat(b'{')?;
        self.key(b"\"condition\":")?;
        let condition = self.members(Self::string)?.into_iter().collect();
        self.next_key(b"\"fired_at\":")?;
        let fired_at = self.string()?;
        self.next_key(b"\"kind\":")?;
        let kind = self.string()?;
        self.next_key(b"\"rule\":")?;
        let rule = self.string()?;
        self.eat(b'}')?;
        Some(Trigger {
            condition,
            fired_at,
            kind,
            rule,
        })
    }

    fn completeness(&mut self) -> R<Completeness> {
        Some(match &*self.text()? {
            "complete" => Completeness::Complete,
            "bounded" => Completeness::Bounded,
            "partial" => Completeness::Partial,
            "identity_race" => Completeness::IdentityRace,
            _ => return None,
        })
    }

    fn next_transition(&mut self) -> R<NextTransition> {
        self.eat(b'{')?;
        self.key(b"\"abort_conditions\":")?;
        let abort_conditions = self.array(Self::string)?;
        self.next_key(b"\"action\":")?;
        let action = self.string()?;
        self.next_key(b"\"success_receipt\":")?;
        let success_receipt = self.string()?;
        self.eat(b'}')?;
        Some(NextTransition {
            abort_conditions,
            action,
            success_receipt,
        })
    }

    /// `{"identity":{…},"kind":"…"}`: the identity precedes the kind that
    /// says how to read it, so it is read once generically (checking its
    /// form), then again as the kind's type.
    fn subject(&mut self) -> R<Subject> {
        self.eat(b'{')?;
        self.key(b"\"identity\":")?;
        let identity_at = self.pos;
        self.object(2)?;
        let identity_end = self.pos;
        self.next_key(b"\"kind\":")?;
        let kind = self.text()?;
        self.eat(b'}')?;
        let after = self.pos;
        self.pos = identity_at;
        let subject = match &*kind {
            "process" => Subject::Process(self.process_identity()?),
            "thread" => {
                self.eat(b'{')?;
                self.key(b"\"process\":")?;
                let process = self.process_identity()?;
                self.next_key(b"\"tid\":")?;
                let tid = self.u32()?;
                self.eat(b'}')?;
                Subject::Thread(ThreadIdentity { process, tid })
            }
            "network_stream" => {
                self.eat(b'{')?;
                self.key(b"\"dst\":")?;
                let dst = self.string()?;
                self.next_key(b"\"flow_id\":")?;
                let flow_id = self.string()?;
                let net_ns = if self.opt_key(b"\"net_ns\":") {
                    Some(self.string()?)
                } else {
                    None
                };
                self.next_key(b"\"protocol\":")?;
                let protocol = self.string()?;
                self.next_key(b"\"src\":")?;
                let src = self.string()?;
                self.eat(b'}')?;
                Subject::NetworkStream(StreamIdentity {
                    dst,
                    flow_id,
                    net_ns,
                    protocol,
                    src,
                })
            }
            "storage_transfer" => {
                self.eat(b'{')?;
                self.key(b"\"engine\":")?;
                let engine = self.string()?;
                self.next_key(b"\"source_node\":")?;
                let source_node = self.string()?;
                self.next_key(b"\"target_node\":")?;
                let target_node = self.string()?;
                self.next_key(b"\"transfer_id\":")?;
                let transfer_id = self.string()?;
                self.next_key(b"\"volume\":")?;
                let volume = self.string()?;
                self.eat(b'}')?;
                Subject::StorageTransfer(TransferIdentity {
                    engine,
                    source_node,
                    target_node,
                    transfer_id,
                    volume,
                })
            }
            "host" => {
                self.eat(b'{')?;
                self.key(b"\"boot_id\":")?;
                let boot_id = self.string()?;
                self.next_key(b"\"host\":")?;
                let host = self.string()?;
                self.eat(b'}')?;
                Subject::Host(HostIdentity { boot_id, host })
            }
            _ => return None,
        };
        if self.pos != identity_end {
            return None;
        }
        self.pos = after;
        Some(subject)
    }

    fn process_identity(&mut self) -> R<ProcessIdentity> {
        self.eat(b'{')?;
        self.key(b"\"boot_id\":")?;
        let boot_id = self.string()?;
        self.next_key(b"\"cgroup\":")?;
        let cgroup = self.string()?;
        self.next_key(b"\"host\":")?;
        let host = self.string()?;
        self.next_key(b"\"pid\":")?;
        let pid = self.u32()?;
        self.next_key(b"\"pid_ns\":")?;
        let pid_ns = self.string()?;
        self.next_key(b"\"start_ticks\":")?;
        let start_ticks = self.u64()?;
        self.next_key(b"\"uid\":")?;
        let uid = self.u32()?;
        self.eat(b'}')?;
        Some(ProcessIdentity {
            boot_id,
            cgroup,
            host,
            pid,
            pid_ns,
            start_ticks,
            uid,
        })
    }

    /// The surfaces array. Reaching the second thread's split exactly at a
    /// boundary between surfaces, the rest of the array is its answer; passing
    /// it anywhere else (the guess was inside a fact), the second thread's
    /// work is dropped and this parse goes on.
    fn surfaces(&mut self) -> R<Vec<Surface>> {
        self.eat(b'[')?;
        let mut out = Vec::new();
        if self.eat(b']').is_some() {
            return Some(out);
        }
        loop {
            out.push(self.surface()?);
            self.feed();
            match self.peek()? {
                b',' => {
                    self.pos += 1;
                    match &self.tail {
                        Some((at, _)) if *at == self.pos => {
                            let (_, answer) = self.tail.take()?;
                            let (rest, end) = answer.recv().ok()??;
                            out.extend(rest);
                            self.pos = end;
                            return Some(out);
                        }
                        Some((at, _)) if *at < self.pos => self.tail = None,
                        _ => {}
                    }
                }
                b']' => {
                    self.pos += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    fn surface(&mut self) -> R<Surface> {
        self.eat(b'{')?;
        self.key(b"\"authority\":")?;
        let authority = self.string()?;
        self.next_key(b"\"bytes\":")?;
        let bytes = self.u64()?;
        let cause = if self.opt_key(b"\"cause\":") {
            self.eat(b'{')?;
            let errno = if self.key(b"\"errno\":").is_some() {
                let n = i32::try_from(self.i64()?).ok()?;
                self.eat(b',')?;
                Some(n)
            } else {
                None
            };
            self.key(b"\"message\":")?;
            let message = self.string()?;
            self.eat(b'}')?;
            Some(StatusCause { errno, message })
        } else {
            None
        };
        self.next_key(b"\"deadline_ms\":")?;
        let deadline_ms = self.u64()?;
        let digest = if self.opt_key(b"\"digest\":") {
            Some(self.string()?)
        } else {
            None
        };
        self.next_key(b"\"elapsed_us\":")?;
        let elapsed_us = self.u64()?;
        self.next_key(b"\"facts\":")?;
        let facts = self.object(3)?; // $ -> surfaces -> [i] -> facts
        self.next_key(b"\"id\":")?;
        let id = self.string()?;
        self.next_key(b"\"status\":")?;
        let status = SurfaceStatus::parse(&self.text()?)?;
        self.next_key(b"\"truncated\":")?;
        let truncated = self.bool()?;
        self.eat(b'}')?;
        Some(Surface {
            authority,
            bytes,
            cause,
            deadline_ms,
            digest,
            elapsed_us,
            facts,
            id,
            status,
            truncated,
        })
    }

    fn universe(&mut self) -> R<Universe> {
        self.eat(b'{')?;
        self.key(b"\"expected_count\":")?;
        let expected_count = self.u64()?;
        self.next_key(b"\"observed_count\":")?;
        let observed_count = self.u64()?;
        self.next_key(b"\"selector\":")?;
        let selector = self.string()?;
        self.next_key(b"\"selector_digest\":")?;
        let selector_digest = self.string()?;
        self.next_key(b"\"termination\":")?;
        let termination = match &*self.text()? {
            "exhausted" => Termination::Exhausted,
            "cap" => Termination::Cap,
            "deadline" => Termination::Deadline,
            _ => return None,
        };
        self.eat(b'}')?;
        Some(Universe {
            expected_count,
            observed_count,
            selector,
            selector_digest,
            termination,
        })
    }

    fn unknown(&mut self) -> R<Unknown> {
        self.eat(b'{')?;
        self.key(b"\"blocks\":")?;
        let blocks = self.string()?;
        self.next_key(b"\"id\":")?;
        let id = self.string()?;
        self.next_key(b"\"owner\":")?;
        let owner = self.string()?;
        // Required here: the model renders an absent probe as "".
        self.next_key(b"\"probe\":")?;
        let probe = self.string()?;
        self.next_key(b"\"question\":")?;
        let question = self.string()?;
        let surface = if self.opt_key(b"\"surface\":") {
            Some(self.string()?)
        } else {
            None
        };
        self.eat(b'}')?;
        Some(Unknown {
            blocks,
            id,
            owner,
            probe,
            question,
            surface,
        })
    }
}
