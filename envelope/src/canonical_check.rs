//! Verify near the hash: one pass over canonical envelope bytes that checks
//! them and hashes them, building no typed model (issue 31 item 4).
//!
//! # Invariants
//!
//! - **Yes only where verify says yes.** [`check`] answers `Some(digest)` only when the
//!   bytes are exactly the canonical form the model fast path
//!   (`canonical_read.rs`) accepts, every semantic rule of `rules.rs` holds,
//!   and the declared digest equals the SHA-256 of the bytes minus the
//!   `digest` member. Anything else — not canonical, a rule broken, a wrong
//!   digest, or a case this pass does not judge (a free-form member name
//!   holding an escape) — is `None`, and the caller runs the full verify,
//!   which gives the verdict and names what is wrong. So the answer where this
//!   pass decides is the full verify's answer; a property test checks it on
//!   every mutation the verify tests make.
//! - **No model, no allocation per call.** Strings are byte ranges of the
//!   input (decoded only when a rule reads one that holds an escape); the ids
//!   the cross-references need (surfaces, claims, unknowns) go into tables
//!   kept per thread and reused, so a steady stream of canonical envelopes
//!   allocates nothing here.
//! - **Strict in the same pass.** Canonical form (member order, no
//!   whitespace, RFC 8785 escapes only, plain integers, no `-0`), duplicate
//!   names (as names not strictly ascending), floats, integers beyond
//!   ±(2^53-1) or their field's type, depth past [`MAX_DEPTH`] and UTF-8 are
//!   checked by the scan that hashes.
//! - **One thread.** The bytes are hashed in blocks as the check passes
//!   them, still in cache, on the caller's thread. A hashing thread beside
//!   the check was measured and not kept: on a loaded machine the wait for
//!   it to be scheduled cost more than the hash (BENCHMARKS.md, issue 31
//!   item 4).
//! - **Bounded.** Recursion is bounded by [`MAX_DEPTH`]; every read is
//!   bounds-checked; hostile input costs at most this pass plus the full
//!   verify.

use std::borrow::Cow;
use std::cell::RefCell;

use sha2::{Digest, Sha256};

use crate::canonical_cursor::{Cursor, is_ws};
use crate::form::{DIGEST_PREFIX, is_sha256_digest};
use crate::model::{
    ClaimKind, Completeness, SCHEMA_ID, Scope, SurfaceStatus, TRIGGER_KINDS, is_cap_name,
};
use crate::scan::name_before;
use crate::strict::MAX_DEPTH;

/// `None`: the full verify decides.
type R<T> = Option<T>;

/// Hash in blocks of about this many bytes as the check passes them.
const HASH_BLOCK: usize = 32 * 1024;

/// SHA-256 of the digest input of canonical, valid bytes whose declared
/// digest matches it; `None` where the full verify must decide.
pub(crate) fn check(bytes: &[u8]) -> R<[u8; 32]> {
    check_picks(bytes).map(|(digest, _)| digest)
}

/// Where the members a store indexes lie in bytes [`check_picks`] accepted:
/// each a byte range of the input holding one whole JSON value, and the
/// completeness already read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Picks {
    /// `clock`'s object.
    pub clock: (usize, usize),
    /// `subject`'s object.
    pub subject: (usize, usize),
    /// `unknowns`' array.
    pub unknowns: (usize, usize),
    /// `claims`' array.
    pub claims: (usize, usize),
    pub completeness: Completeness,
}

/// [`check`], and where the indexed members lie ([`Picks`]).
pub(crate) fn check_picks(bytes: &[u8]) -> R<([u8; 32], Picks)> {
    let start = bytes.iter().position(|b| !is_ws(*b))?;
    let end = bytes.len() - bytes.iter().rev().position(|b| !is_ws(*b))?;
    let body = &bytes[..end];
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => check_with(body, start, &mut scratch),
        // Not reentrant in practice; a fresh table is still correct.
        Err(_) => check_with(body, start, &mut Scratch::default()),
    })
}

fn check_with(body: &[u8], start: usize, scratch: &mut Scratch) -> R<([u8; 32], Picks)> {
    scratch.clear();
    let mut c = Checker {
        at: Cursor {
            b: body,
            pos: start,
        },
        hasher: Sha256::new(),
        hashed: start,
        s: scratch,
        completeness: Completeness::Partial,
        picks: Picks {
            clock: (0, 0),
            subject: (0, 0),
            unknowns: (0, 0),
            claims: (0, 0),
            completeness: Completeness::Partial,
        },
    };
    c.eat(b'{')?;
    c.head()?;
    // `,"digest":"…"` is not part of what it digests.
    c.feed_to(c.pos);
    c.next_key(b"\"digest\":")?;
    let declared = c.raw_string()?;
    c.hashed = c.pos;
    c.tail()?;
    c.feed_to(body.len());
    let computed = c.hasher.finalize();
    let computed: [u8; 32] = computed.into();
    let picks = Picks {
        completeness: c.completeness,
        ..c.picks
    };
    written_as(&body[declared.start..declared.end], &computed).then_some((computed, picks))
}

/// Whether `declared` is `sha256:` + the lowercase hex of `digest`.
pub(crate) fn written_as(declared: &[u8], digest: &[u8; 32]) -> bool {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let Some(hex) = declared.strip_prefix(DIGEST_PREFIX.as_bytes()) else {
        return false;
    };
    hex.len() == 64
        && digest
            .iter()
            .zip(hex.chunks_exact(2))
            .all(|(d, h)| h[0] == HEX[usize::from(d >> 4)] && h[1] == HEX[usize::from(d & 0xf)])
}

thread_local! {
    /// Id tables reused from call to call on this thread.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A string member: the bytes between its quotes.
#[derive(Clone, Copy)]
struct Raw {
    start: usize,
    end: usize,
    /// Holds at least one (canonical) escape.
    escaped: bool,
}

/// What a claim's rules need once completeness and the surfaces are known.
struct ClaimRecord {
    kind: ClaimKind,
    scope: Scope,
    /// Its cited surface ids: `cites[from..to]`.
    from: usize,
    to: usize,
}

#[derive(Default)]
struct Scratch {
    surfaces: IdTable,
    statuses: Vec<SurfaceStatus>,
    claim_ids: IdTable,
    claims: Vec<ClaimRecord>,
    cites: Vec<(usize, usize)>,
    unknown_ids: IdTable,
}

impl Scratch {
    fn clear(&mut self) {
        self.surfaces.clear();
        self.statuses.clear();
        self.claim_ids.clear();
        self.claims.clear();
        self.cites.clear();
        self.unknown_ids.clear();
    }
}

/// A set of ids given as byte ranges of one input: open addressing over
/// indices into `keys`. Equal raw bytes are equal ids: canonical escaping
/// is one spelling per string.
#[derive(Default)]
struct IdTable {
    /// `index + 1` into `keys`, 0 for an empty slot; a power of two long.
    slots: Vec<u32>,
    keys: Vec<(usize, usize)>,
}

impl IdTable {
    fn clear(&mut self) {
        self.slots.fill(0);
        self.keys.clear();
    }

    fn hash(id: &[u8]) -> usize {
        // FNV-1a: ids are short; this is not exposed to collisions that
        // matter (a collision costs a probe, never a wrong answer).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in id {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        (h ^ (h >> 29)) as usize
    }

    /// The slot holding `id`, or the empty slot where it would go.
    fn slot(&self, input: &[u8], id: &[u8]) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = Self::hash(id) & mask;
        loop {
            match self.slots[i] {
                0 => return i,
                k => {
                    let (a, b) = self.keys[k as usize - 1];
                    if &input[a..b] == id {
                        return i;
                    }
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Add `input[range]`; its index, or `None` when it is already there.
    fn insert(&mut self, input: &[u8], range: (usize, usize)) -> R<usize> {
        if (self.keys.len() + 1) * 2 > self.slots.len() {
            self.grow(input);
        }
        let i = self.slot(input, &input[range.0..range.1]);
        if self.slots[i] != 0 {
            return None;
        }
        self.keys.push(range);
        self.slots[i] = u32::try_from(self.keys.len()).ok()?;
        Some(self.keys.len() - 1)
    }

    fn get(&self, input: &[u8], id: &[u8]) -> R<usize> {
        if self.slots.is_empty() {
            return None;
        }
        match self.slots[self.slot(input, id)] {
            0 => None,
            k => Some(k as usize - 1),
        }
    }

    fn grow(&mut self, input: &[u8]) {
        let len = (self.slots.len() * 2).max(64);
        self.slots.clear();
        self.slots.resize(len, 0);
        for (k, &(a, b)) in self.keys.iter().enumerate() {
            let mask = len - 1;
            let mut i = Self::hash(&input[a..b]) & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = (k + 1) as u32;
        }
    }
}

struct Checker<'a, 's> {
    /// The input and the position in it (`self.b`, `self.pos` through
    /// `Deref`).
    at: Cursor<'a>,
    hasher: Sha256,
    /// Bytes before this offset (minus the digest member) are hashed.
    hashed: usize,
    s: &'s mut Scratch,
    completeness: Completeness,
    picks: Picks,
}

impl<'a> std::ops::Deref for Checker<'a, '_> {
    type Target = Cursor<'a>;
    fn deref(&self) -> &Cursor<'a> {
        &self.at
    }
}

impl std::ops::DerefMut for Checker<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.at
    }
}

impl<'a> Checker<'a, '_> {
    fn feed_to(&mut self, to: usize) {
        if to > self.hashed {
            self.hasher.update(&self.b[self.hashed..to]);
            self.hashed = to;
        }
    }

    #[inline]
    fn feed(&mut self) {
        if self.pos.saturating_sub(self.hashed) >= HASH_BLOCK {
            self.feed_to(self.pos);
        }
    }

    /// A string, as the range between its quotes: UTF-8, and escaped only
    /// as RFC 8785 escapes (the escapes `canonical_read` accepts).
    #[inline]
    fn raw_string(&mut self) -> R<Raw> {
        self.eat(b'"')?;
        let start = self.pos;
        let stop = scan_plain(self.b, start);
        if self.b.get(stop) == Some(&b'"') {
            self.pos = stop + 1;
            return Some(Raw {
                start,
                end: stop,
                escaped: false,
            });
        }
        self.raw_string_slow(start, stop)
    }

    /// The rest of a string holding an escape, a control or a non-ASCII
    /// byte from `at` on.
    #[cold]
    fn raw_string_slow(&mut self, start: usize, mut at: usize) -> R<Raw> {
        let mut escaped = false;
        let mut high_from = None;
        loop {
            match *self.b.get(at)? {
                b'"' => break,
                b'\\' => {
                    at += escape_len(self.b, at)?;
                    escaped = true;
                }
                c if c >= 0x80 => {
                    high_from.get_or_insert(at);
                    at += 1;
                }
                _ => return None, // a raw control character
            }
            at = if high_from.is_some() {
                crate::scan::find_special(self.b, at)
            } else {
                scan_plain(self.b, at)
            };
        }
        if let Some(from) = high_from {
            // Escapes are ASCII and never split a character.
            std::str::from_utf8(&self.b[from..at]).ok()?;
        }
        self.pos = at + 1;
        Some(Raw {
            start,
            end: at,
            escaped,
        })
    }

    /// A string's text (decoded, so allocated, only when it holds escapes).
    fn text(&self, r: Raw) -> R<Cow<'a, str>> {
        let b: &'a [u8] = self.b;
        let raw = std::str::from_utf8(&b[r.start..r.end]).ok()?;
        if !r.escaped {
            return Some(Cow::Borrowed(raw));
        }
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            out.push(match chars.next()? {
                'b' => '\u{8}',
                'f' => '\u{c}',
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                }
                other => other, // `"` and `\`
            });
        }
        Some(Cow::Owned(out))
    }

    /// A string whose text, trimmed, is not empty.
    fn filled(&mut self) -> R<Raw> {
        let r = self.raw_string()?;
        (!self.text(r)?.trim().is_empty()).then_some(r)
    }

    /// A string's bytes, for comparing with a fixed word; `None` when it
    /// holds an escape (no word the envelope names needs one).
    fn word(&mut self) -> R<&'a [u8]> {
        let r = self.raw_string()?;
        let b: &'a [u8] = self.b;
        (!r.escaped).then(|| &b[r.start..r.end])
    }

    /// `[` items `]`, each checked by `item`; how many.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> R<()>) -> R<usize> {
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(0);
        }
        let mut n = 0;
        loop {
            item(self)?;
            n += 1;
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(n);
                }
                _ => return None,
            }
        }
    }

    /// Any JSON value at nesting `depth` (the strict parser's count).
    fn value(&mut self, depth: usize) -> R<()> {
        match self.peek()? {
            b'"' => self.raw_string().map(drop),
            b'{' => self.object(depth),
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.pos += 1;
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.value(depth + 1)?;
                    match self.peek()? {
                        b',' => self.pos += 1,
                        b']' => {
                            self.pos += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b't' | b'f' => self.bool().map(drop),
            b'n' => self.key(b"null"),
            b'-' => self.i64().map(drop),
            _ => self.u64().map(drop),
        }
    }

    /// A free-form object at nesting `depth`: names strictly ascending in
    /// RFC 8785 order (which also rules out duplicates). A name holding an
    /// escape is left to the full verify (its order is that of its text).
    fn object(&mut self, depth: usize) -> R<()> {
        self.members(depth, |c| c.value(depth + 1))
    }

    fn members(&mut self, depth: usize, mut value: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        let mut prev: Option<(usize, usize)> = None;
        loop {
            let name = self.raw_string()?;
            if name.escaped {
                return None;
            }
            if let Some((a, b)) = prev
                && !name_before(&self.b[a..b], &self.b[name.start..name.end])
            {
                return None;
            }
            self.eat(b':')?;
            value(self)?;
            prev = Some((name.start, name.end));
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `bounds` to `completeness`, the members before `digest`.
    fn head(&mut self) -> R<()> {
        self.key(b"\"bounds\":")?;
        self.bounds()?;
        self.next_key(b"\"claims\":")?;
        let at = self.pos;
        self.array(Self::claim)?;
        self.picks.claims = (at, self.pos);
        self.next_key(b"\"clock\":")?;
        let at = self.pos;
        self.clock()?;
        self.picks.clock = (at, self.pos);
        self.next_key(b"\"collector\":")?;
        self.collector()?;
        self.next_key(b"\"completeness\":")?;
        self.completeness = match self.word()? {
            b"complete" => Completeness::Complete,
            b"bounded" => Completeness::Bounded,
            b"partial" => Completeness::Partial,
            b"identity_race" => Completeness::IdentityRace,
            _ => return None,
        };
        Some(())
    }

    /// `next_transition` to the end, then the rules that cross members.
    fn tail(&mut self) -> R<()> {
        self.next_key(b"\"next_transition\":")?;
        self.next_transition()?;
        self.next_key(b"\"schema\":")?;
        if self.word()? != SCHEMA_ID.as_bytes() {
            return None;
        }
        self.next_key(b"\"subject\":")?;
        let at = self.pos;
        self.subject()?;
        self.picks.subject = (at, self.pos);
        self.next_key(b"\"surfaces\":")?;
        self.array(|c| {
            c.surface()?;
            c.feed();
            Some(())
        })?;
        self.next_key(b"\"universe\":")?;
        self.universe()?;
        self.next_key(b"\"unknowns\":")?;
        let at = self.pos;
        self.array(Self::unknown)?;
        self.picks.unknowns = (at, self.pos);
        self.eat(b'}')?;
        if self.pos != self.b.len() {
            return None;
        }
        self.claims_hold()
    }

    fn bounds(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"bundle_deadline_ms\":")?;
        self.u64()?;
        if self.opt_key(b"\"caps\":") {
            if self.peek()? == b'{' && self.b.get(self.pos + 1) == Some(&b'}') {
                return None; // the model omits empty caps
            }
            let start = self.pos;
            self.members(0, |c| c.u64().map(drop))?;
            // Names were checked to be unescaped and ascending; now each
            // must be a cap name. Re-walk the (short) object for them.
            let end = self.pos;
            self.pos = start + 1;
            while self.pos < end {
                let name = self.raw_string()?;
                if !is_cap_name(&self.text(name)?) {
                    return None;
                }
                self.eat(b':')?;
                self.u64()?;
                self.pos += 1; // `,` or `}`
            }
        }
        for tag in [
            &b"\"leak_budget\":"[..],
            b"\"max_bytes_per_surface\":",
            b"\"max_threads\":",
            b"\"surface_deadline_ms\":",
        ] {
            self.next_key(tag)?;
            self.u64()?;
        }
        self.eat(b'}')
    }

    fn claim(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"code\":")?;
        self.raw_string()?;
        let falsifier = if self.opt_key(b"\"falsifier\":") {
            Some(self.raw_string()?)
        } else {
            None
        };
        self.next_key(b"\"id\":")?;
        let id = self.raw_string()?;
        self.next_key(b"\"kind\":")?;
        let kind = match self.word()? {
            b"fact" => ClaimKind::Fact,
            b"inference" => ClaimKind::Inference,
            b"hypothesis" => ClaimKind::Hypothesis,
            _ => return None,
        };
        self.next_key(b"\"scope\":")?;
        let scope = match self.word()? {
            b"existential" => Scope::Existential,
            b"universal" => Scope::Universal,
            _ => return None,
        };
        self.next_key(b"\"statement\":")?;
        self.raw_string()?;
        self.next_key(b"\"surfaces\":")?;
        let from = self.s.cites.len();
        self.array(|c| {
            let r = c.raw_string()?;
            c.s.cites.push((r.start, r.end));
            Some(())
        })?;
        let to = self.s.cites.len();
        self.eat(b'}')?;
        // The claim rules that need nothing read later.
        if from == to {
            return None; // unbound
        }
        match (kind, falsifier) {
            (ClaimKind::Hypothesis, None) => return None,
            (ClaimKind::Hypothesis, Some(f)) if self.text(f)?.trim().is_empty() => return None,
            (ClaimKind::Fact | ClaimKind::Inference, Some(_)) => return None,
            _ => {}
        }
        self.s.claim_ids.insert(self.b, (id.start, id.end))?;
        self.s.claims.push(ClaimRecord {
            kind,
            scope,
            from,
            to,
        });
        Some(())
    }

    /// The claim rules that need completeness and the surfaces.
    fn claims_hold(&self) -> R<()> {
        for claim in &self.s.claims {
            if self.completeness == Completeness::IdentityRace
                && claim.kind != ClaimKind::Hypothesis
            {
                return None;
            }
            if claim.scope == Scope::Universal && self.completeness != Completeness::Complete {
                return None;
            }
            for &(a, b) in &self.s.cites[claim.from..claim.to] {
                let i = self.s.surfaces.get(self.b, &self.b[a..b])?;
                let read = matches!(
                    self.s.statuses[i],
                    SurfaceStatus::Ok | SurfaceStatus::Truncated
                );
                if claim.kind != ClaimKind::Hypothesis && !read {
                    return None;
                }
            }
        }
        Some(())
    }

    fn clock(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"bundle_deadline_ms\":")?;
        self.u64()?;
        for tag in [&b"\"monotonic_end_ns\":"[..], b"\"monotonic_start_ns\":"] {
            self.next_key(tag)?;
            let r = self.raw_string()?;
            if !is_decimal(&self.text(r)?) {
                return None;
            }
        }
        self.next_key(b"\"wall_time\":")?;
        let r = self.raw_string()?;
        crate::wall_time::parse(&self.text(r)?)?;
        self.eat(b'}')
    }

    fn collector(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"name\":")?;
        self.raw_string()?;
        self.next_key(b"\"source_commit\":")?;
        self.raw_string()?;
        if self.opt_key(b"\"trigger\":") {
            self.eat(b'{')?;
            self.key(b"\"condition\":")?;
            self.members(0, |c| c.raw_string().map(drop))?;
            self.next_key(b"\"fired_at\":")?;
            let r = self.raw_string()?;
            crate::wall_time::parse(&self.text(r)?)?;
            self.next_key(b"\"kind\":")?;
            let r = self.raw_string()?;
            if !TRIGGER_KINDS.contains(&&*self.text(r)?) {
                return None;
            }
            self.next_key(b"\"rule\":")?;
            self.filled()?;
            self.eat(b'}')?;
        }
        self.next_key(b"\"version\":")?;
        self.raw_string()?;
        self.eat(b'}')
    }

    fn next_transition(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"abort_conditions\":")?;
        let mut any_filled = false;
        self.array(|c| {
            let r = c.raw_string()?;
            any_filled |= !c.text(r)?.trim().is_empty();
            Some(())
        })?;
        if !any_filled {
            return None;
        }
        self.next_key(b"\"action\":")?;
        self.filled()?;
        self.next_key(b"\"success_receipt\":")?;
        self.filled()?;
        self.eat(b'}')
    }

    /// `{"identity":{…},"kind":"…"}`: the identity precedes the kind that
    /// says how to read it, so it is checked once generically, then again
    /// as the kind's shape.
    fn subject(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"identity\":")?;
        let identity_at = self.pos;
        self.object(2)?;
        let identity_end = self.pos;
        self.next_key(b"\"kind\":")?;
        let kind = self.word()?;
        self.eat(b'}')?;
        let after = self.pos;
        self.pos = identity_at;
        match kind {
            b"process" => self.process_identity()?,
            b"thread" => {
                self.eat(b'{')?;
                self.key(b"\"process\":")?;
                self.process_identity()?;
                self.next_key(b"\"tid\":")?;
                self.u32()?;
                self.eat(b'}')?;
            }
            b"network_stream" => {
                self.eat(b'{')?;
                self.key(b"\"dst\":")?;
                self.filled()?;
                self.next_key(b"\"flow_id\":")?;
                self.filled()?;
                if self.opt_key(b"\"net_ns\":") {
                    self.raw_string()?;
                }
                self.next_key(b"\"protocol\":")?;
                self.filled()?;
                self.next_key(b"\"src\":")?;
                self.filled()?;
                self.eat(b'}')?;
            }
            b"storage_transfer" => {
                self.eat(b'{')?;
                self.key(b"\"engine\":")?;
                self.filled()?;
                for tag in [
                    &b"\"source_node\":"[..],
                    b"\"target_node\":",
                    b"\"transfer_id\":",
                    b"\"volume\":",
                ] {
                    self.next_key(tag)?;
                    self.filled()?;
                }
                self.eat(b'}')?;
            }
            b"host" => {
                self.eat(b'{')?;
                self.key(b"\"boot_id\":")?;
                self.filled()?;
                self.next_key(b"\"host\":")?;
                self.filled()?;
                self.eat(b'}')?;
            }
            _ => return None,
        }
        if self.pos != identity_end {
            return None;
        }
        self.pos = after;
        Some(())
    }

    fn process_identity(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"boot_id\":")?;
        self.filled()?;
        self.next_key(b"\"cgroup\":")?;
        self.filled()?;
        self.next_key(b"\"host\":")?;
        self.filled()?;
        self.next_key(b"\"pid\":")?;
        self.u32()?;
        self.next_key(b"\"pid_ns\":")?;
        self.filled()?;
        self.next_key(b"\"start_ticks\":")?;
        self.u64()?;
        self.next_key(b"\"uid\":")?;
        self.u32()?;
        self.eat(b'}')
    }

    fn surface(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"authority\":")?;
        self.raw_string()?;
        self.next_key(b"\"bytes\":")?;
        self.u64()?;
        let mut explained = false;
        if self.opt_key(b"\"cause\":") {
            self.eat(b'{')?;
            if self.key(b"\"errno\":").is_some() {
                i32::try_from(self.i64()?).ok()?;
                self.eat(b',')?;
            }
            self.key(b"\"message\":")?;
            let r = self.raw_string()?;
            explained = !self.text(r)?.trim().is_empty();
            self.eat(b'}')?;
        }
        self.next_key(b"\"deadline_ms\":")?;
        self.u64()?;
        if self.opt_key(b"\"digest\":") {
            let r = self.raw_string()?;
            if !is_sha256_digest(&self.text(r)?) {
                return None;
            }
        }
        self.next_key(b"\"elapsed_us\":")?;
        self.u64()?;
        self.next_key(b"\"facts\":")?;
        self.object(3)?; // $ -> surfaces -> [i] -> facts
        self.next_key(b"\"id\":")?;
        let id = self.raw_string()?;
        self.next_key(b"\"status\":")?;
        let r = self.raw_string()?;
        let status = SurfaceStatus::parse(&self.text(r)?)?;
        self.next_key(b"\"truncated\":")?;
        let truncated = self.bool()?;
        self.eat(b'}')?;
        if status == SurfaceStatus::Error && !explained {
            return None;
        }
        if self.completeness == Completeness::Complete && (status != SurfaceStatus::Ok || truncated)
        {
            return None;
        }
        self.s.surfaces.insert(self.b, (id.start, id.end))?;
        self.s.statuses.push(status);
        Some(())
    }

    fn universe(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"expected_count\":")?;
        self.u64()?;
        self.next_key(b"\"observed_count\":")?;
        self.u64()?;
        self.next_key(b"\"selector\":")?;
        self.raw_string()?;
        self.next_key(b"\"selector_digest\":")?;
        let r = self.raw_string()?;
        if !is_sha256_digest(&self.text(r)?) {
            return None;
        }
        self.next_key(b"\"termination\":")?;
        let exhausted = match self.word()? {
            b"exhausted" => true,
            b"cap" | b"deadline" => false,
            _ => return None,
        };
        if self.completeness == Completeness::Complete && !exhausted {
            return None;
        }
        self.eat(b'}')
    }

    fn unknown(&mut self) -> R<()> {
        self.eat(b'{')?;
        self.key(b"\"blocks\":")?;
        self.filled()?;
        self.next_key(b"\"id\":")?;
        let id = self.raw_string()?;
        self.next_key(b"\"owner\":")?;
        self.filled()?;
        // Required here: the model renders an absent probe as "".
        self.next_key(b"\"probe\":")?;
        self.filled()?;
        self.next_key(b"\"question\":")?;
        self.filled()?;
        if self.opt_key(b"\"surface\":") {
            let r = self.raw_string()?;
            self.s.surfaces.get(self.b, &self.b[r.start..r.end])?;
        }
        self.eat(b'}')?;
        self.s.unknown_ids.insert(self.b, (id.start, id.end))?;
        Some(())
    }
}

/// Length of the canonical escape at `at` (a `\`), `None` for any escape
/// RFC 8785 would not write.
fn escape_len(b: &[u8], at: usize) -> R<usize> {
    Some(match b.get(at + 1)? {
        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
        b'u' => {
            let h = b.get(at + 2..at + 6)?;
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
            6
        }
        _ => return None,
    })
}

fn is_decimal(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 20
        && s.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<u64>().is_ok()
}

/// Whether a byte ends the plain run of a string: `"`, `\`, a control, or
/// a non-ASCII byte (whose UTF-8 the slow path checks).
#[inline(always)]
fn ends_plain(b: u8) -> bool {
    !(0x20..0x80).contains(&b) || b == b'"' || b == b'\\'
}

/// Index of the first byte at or after `from` that ends a plain run
/// ([`ends_plain`]), or `bytes.len()`.
#[inline(always)]
fn scan_plain(bytes: &[u8], from: usize) -> usize {
    let mut i = from;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8,
            _mm_or_si128, _mm_set1_epi8,
        };
        while let Some(block) = bytes.get(i..i + 16) {
            // SAFETY: SSE2 is part of the x86_64 baseline, so these
            // intrinsics are always available; `block` is 16 readable bytes
            // and `loadu` needs no alignment.
            let mask = unsafe {
                let v = _mm_loadu_si128(block.as_ptr().cast::<__m128i>());
                // Signed compare: below 0x20, or at/above 0x80 (negative as
                // i8).
                let hits = _mm_or_si128(
                    _mm_or_si128(
                        _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                        _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
                    ),
                    _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)),
                );
                _mm_movemask_epi8(hits) as u32
            };
            if mask != 0 {
                return i + mask.trailing_zeros() as usize;
            }
            i += 16;
        }
    }
    while i < bytes.len() && !ends_plain(bytes[i]) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_plain_agrees_with_a_byte_loop() {
        let mut text = Vec::new();
        for b in 0u8..=255 {
            text.extend_from_slice(b"abcdefghijklmnopq");
            text.push(b);
        }
        for from in 0..text.len() {
            let expected = (from..text.len())
                .find(|&i| ends_plain(text[i]))
                .unwrap_or(text.len());
            assert_eq!(scan_plain(&text, from), expected, "from {from}");
        }
    }

    #[test]
    fn id_table_finds_what_it_holds_and_refuses_repeats() {
        let input: Vec<u8> = (0..500)
            .flat_map(|i| format!("id{i};").into_bytes())
            .collect();
        let mut ranges = Vec::new();
        let mut at = 0;
        for part in input.split(|&b| b == b';').filter(|p| !p.is_empty()) {
            ranges.push((at, at + part.len()));
            at += part.len() + 1;
        }
        let mut t = IdTable::default();
        for (k, &r) in ranges.iter().enumerate() {
            assert_eq!(t.insert(&input, r), Some(k));
        }
        for (k, &(a, b)) in ranges.iter().enumerate() {
            assert_eq!(t.get(&input, &input[a..b]), Some(k));
            assert_eq!(t.insert(&input, (a, b)), None, "a repeat is refused");
        }
        assert_eq!(t.get(&input, b"id500"), None);
        t.clear();
        assert_eq!(t.get(&input, b"id1"), None);
    }
}
