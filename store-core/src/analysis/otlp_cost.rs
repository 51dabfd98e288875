//! What decoding an OTLP trace body will cost, read from the body before
//! anything is decoded (issue 28): the span count, for the per-request span
//! cap, and an upper bound of the heap the decoded request takes, charged
//! against the store's in-flight memory budget before a byte of it is
//! allocated.
//!
//! Why: protobuf and JSON amplify. An empty span is 2 bytes of protobuf
//! (`0x12 0x00`) and a 264-byte `Span` decoded, in a `Vec` that doubles; an
//! empty attribute is 2 bytes and a 64-byte `KeyValue`. Gzip makes the wire
//! body another ~1000× smaller. The body's size says nothing about the
//! memory its decoding takes; this census does.
//!
//! Invariants:
//! - **An upper bound, for every body the decoder accepts.** The protobuf
//!   census walks the wire format with the schema of exactly the messages
//!   `opentelemetry-proto` decodes (field numbers and kinds from its
//!   generated code; struct sizes are `size_of` of those types, so they
//!   cannot drift). Each element of a repeated message field costs
//!   [`VEC_PEAK`] times its struct (a `Vec` starts at 4 elements and then
//!   holds at most twice its length, plus the old buffer while it grows);
//!   each string or bytes field
//!   its length plus an allocation's overhead. Unknown fields cost nothing
//!   (the decoder drops them). A body the census cannot walk is refused as
//!   malformed — the decoder would refuse it too.
//! - **JSON** is charged without the schema: every object as the largest
//!   OTLP message, every string at its length, and — because the
//!   `AnyValue` deserializer buffers its subtree (serde `flatten`) once per
//!   nesting level — every token inside `AnyValue`s once more per level.
//!   Spans are counted exactly (objects at `resourceSpans[].scopeSpans[].spans[]`,
//!   keys compared after unescaping, as serde does).
//! - **Pure**: no allocation proportional to the body, no I/O; the budget
//!   itself is reached through the closure handed to [`Meter`].

use std::mem::size_of;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, EntityRef, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};

/// Bytes a heap allocation costs beyond its length (glibc's chunk header
/// and 16-byte rounding, with room to spare).
pub const ALLOC_OVERHEAD: usize = 32;
/// A `Vec` element's peak cost, in multiples of its size: a `Vec`'s first
/// allocation holds 4 elements (so one element costs 4), and past that its
/// capacity is at most twice its length, plus the old buffer while it grows.
pub const VEC_PEAK: usize = 4;
/// Peak bytes a B-tree map entry costs, in multiples of its size (nodes
/// hold up to 11 entries and are often half full, plus node headers).
pub const NODE_PEAK: usize = 3;
/// Nesting the protobuf census follows (prost's own recursion limit).
pub const MAX_DEPTH: usize = 100;

/// What a body will cost decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Spans in the body.
    pub spans: usize,
    /// Upper bound of the heap its decoded request takes, bytes.
    pub decoded_bytes: usize,
}

/// Why the census could not walk a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CensusError(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    Request,
    ResourceSpans,
    Resource,
    ScopeSpans,
    Scope,
    Span,
    Event,
    Link,
    Status,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
    EntityRef,
}

impl Msg {
    fn size(self) -> usize {
        match self {
            Msg::Request => size_of::<ExportTraceServiceRequest>(),
            Msg::ResourceSpans => size_of::<ResourceSpans>(),
            Msg::Resource => size_of::<Resource>(),
            Msg::ScopeSpans => size_of::<ScopeSpans>(),
            Msg::Scope => size_of::<InstrumentationScope>(),
            Msg::Span => size_of::<Span>(),
            Msg::Event => size_of::<span::Event>(),
            Msg::Link => size_of::<span::Link>(),
            Msg::Status => size_of::<Status>(),
            Msg::KeyValue => size_of::<KeyValue>(),
            Msg::AnyValue => size_of::<AnyValue>(),
            Msg::ArrayValue => size_of::<ArrayValue>(),
            Msg::KeyValueList => size_of::<KeyValueList>(),
            Msg::EntityRef => size_of::<EntityRef>(),
        }
    }

    /// The largest message struct (what the JSON census charges an object).
    fn largest() -> usize {
        [
            Msg::Request,
            Msg::ResourceSpans,
            Msg::Resource,
            Msg::ScopeSpans,
            Msg::Scope,
            Msg::Span,
            Msg::Event,
            Msg::Link,
            Msg::Status,
            Msg::KeyValue,
            Msg::AnyValue,
            Msg::ArrayValue,
            Msg::KeyValueList,
            Msg::EntityRef,
        ]
        .into_iter()
        .map(Msg::size)
        .max()
        .unwrap_or(0)
    }
}

/// How a field of a message decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// A sub-message: inline when singular, a `Vec` element when repeated.
    Message(Msg, bool),
    /// A `String` or `Vec<u8>`; repeated: an element of a `Vec<String>`.
    Heap(bool),
    /// A number, enum or bool (inline), or a field the decoder drops.
    Inline,
}

/// The field table of the OTLP trace messages, from opentelemetry-proto
/// 0.33's generated code (`opentelemetry.proto.{collector.trace,trace,
/// resource,common}.v1.rs`).
fn field(msg: Msg, number: u64) -> Field {
    use Field::{Heap, Inline, Message};
    const REP: bool = true;
    const ONE: bool = false;
    match (msg, number) {
        (Msg::Request, 1) => Message(Msg::ResourceSpans, REP),
        (Msg::ResourceSpans, 1) => Message(Msg::Resource, ONE),
        (Msg::ResourceSpans, 2) => Message(Msg::ScopeSpans, REP),
        (Msg::ResourceSpans, 3) => Heap(ONE),
        (Msg::Resource, 1) => Message(Msg::KeyValue, REP),
        (Msg::Resource, 3) => Message(Msg::EntityRef, REP),
        (Msg::ScopeSpans, 1) => Message(Msg::Scope, ONE),
        (Msg::ScopeSpans, 2) => Message(Msg::Span, REP),
        (Msg::ScopeSpans, 3) => Heap(ONE),
        (Msg::Scope, 1 | 2) => Heap(ONE),
        (Msg::Scope, 3) => Message(Msg::KeyValue, REP),
        (Msg::Span, 1..=5) => Heap(ONE),
        (Msg::Span, 9) => Message(Msg::KeyValue, REP),
        (Msg::Span, 11) => Message(Msg::Event, REP),
        (Msg::Span, 13) => Message(Msg::Link, REP),
        (Msg::Span, 15) => Message(Msg::Status, ONE),
        (Msg::Event, 2) => Heap(ONE),
        (Msg::Event, 3) => Message(Msg::KeyValue, REP),
        (Msg::Link, 1..=3) => Heap(ONE),
        (Msg::Link, 4) => Message(Msg::KeyValue, REP),
        (Msg::Status, 2) => Heap(ONE),
        (Msg::KeyValue, 1) => Heap(ONE),
        (Msg::KeyValue, 2) => Message(Msg::AnyValue, ONE),
        (Msg::AnyValue, 1 | 7) => Heap(ONE),
        (Msg::AnyValue, 5) => Message(Msg::ArrayValue, ONE),
        (Msg::AnyValue, 6) => Message(Msg::KeyValueList, ONE),
        (Msg::ArrayValue, 1) => Message(Msg::AnyValue, REP),
        (Msg::KeyValueList, 1) => Message(Msg::KeyValue, REP),
        (Msg::EntityRef, 1 | 2) => Heap(ONE),
        (Msg::EntityRef, 3 | 4) => Heap(REP),
        _ => Inline,
    }
}

fn malformed(what: &str) -> CensusError {
    CensusError(what.to_string())
}

fn read_varint(buf: &[u8], at: &mut usize) -> Result<u64, CensusError> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let Some(&b) = buf.get(*at) else {
            return Err(malformed("truncated varint"));
        };
        *at += 1;
        if shift == 63 && b > 1 {
            return Err(malformed("varint overflows 64 bits"));
        }
        value |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(value);
        }
    }
    Err(malformed("varint longer than 10 bytes"))
}

/// Skip a value of `wire_type` at `at` (groups included, as prost does).
fn skip(
    buf: &[u8],
    at: &mut usize,
    wire_type: u64,
    number: u64,
    depth: usize,
) -> Result<(), CensusError> {
    let advance = |at: &mut usize, n: usize| -> Result<(), CensusError> {
        match at.checked_add(n) {
            Some(end) if end <= buf.len() => {
                *at = end;
                Ok(())
            }
            _ => Err(malformed("field runs past the end of its message")),
        }
    };
    match wire_type {
        0 => read_varint(buf, at).map(|_| ()),
        1 => advance(at, 8),
        5 => advance(at, 4),
        2 => {
            let len = read_varint(buf, at)?;
            advance(
                at,
                usize::try_from(len).map_err(|_| malformed("length too large"))?,
            )
        }
        3 => {
            if depth >= MAX_DEPTH {
                return Err(malformed(
                    "nesting deeper than the decoder's recursion limit",
                ));
            }
            loop {
                let key = read_varint(buf, at)?;
                let (n, wt) = (key >> 3, key & 7);
                if wt == 4 {
                    return if n == number {
                        Ok(())
                    } else {
                        Err(malformed("unmatched end group"))
                    };
                }
                skip(buf, at, wt, n, depth + 1)?;
            }
        }
        _ => Err(malformed("invalid wire type")),
    }
}

/// Walk one message's bytes, adding what it allocates to `census`.
fn walk(buf: &[u8], msg: Msg, depth: usize, census: &mut Census) -> Result<(), CensusError> {
    if depth > MAX_DEPTH {
        return Err(malformed(
            "nesting deeper than the decoder's recursion limit",
        ));
    }
    let mut at = 0;
    while at < buf.len() {
        let key = read_varint(buf, &mut at)?;
        let (number, wire_type) = (key >> 3, key & 7);
        if number == 0 {
            return Err(malformed("field number 0"));
        }
        let kind = field(msg, number);
        if kind != Field::Inline && wire_type != 2 {
            return Err(malformed(
                "a message, string or bytes field is not length-delimited",
            ));
        }
        match kind {
            Field::Inline => skip(buf, &mut at, wire_type, number, depth)?,
            Field::Heap(repeated) => {
                let len = usize::try_from(read_varint(buf, &mut at)?)
                    .map_err(|_| malformed("length too large"))?;
                let end = at
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| malformed("field runs past the end of its message"))?;
                at = end;
                let element = if repeated {
                    VEC_PEAK * size_of::<String>()
                } else {
                    0
                };
                census.decoded_bytes = census
                    .decoded_bytes
                    .saturating_add(element + len + ALLOC_OVERHEAD);
            }
            Field::Message(sub, repeated) => {
                let len = usize::try_from(read_varint(buf, &mut at)?)
                    .map_err(|_| malformed("length too large"))?;
                let end = at
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| malformed("field runs past the end of its message"))?;
                if repeated {
                    census.decoded_bytes = census
                        .decoded_bytes
                        .saturating_add(VEC_PEAK * sub.size() + ALLOC_OVERHEAD);
                    if sub == Msg::Span {
                        census.spans += 1;
                    }
                }
                walk(&buf[at..end], sub, depth + 1, census)?;
                at = end;
            }
        }
    }
    Ok(())
}

/// The census of a protobuf `ExportTraceServiceRequest`.
pub fn protobuf(body: &[u8]) -> Result<Census, CensusError> {
    let mut census = Census {
        spans: 0,
        decoded_bytes: Msg::Request.size(),
    };
    walk(body, Msg::Request, 0, &mut census)?;
    Ok(census)
}

/// What the JSON census charges a `serde` buffered node (a `Content` in a
/// `Vec` that doubles, with its share of a map entry).
const CONTENT_NODE: usize = 128;

/// Where a JSON container sits, as far as the span count cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Root,
    ResourceSpansArray,
    ResourceSpans,
    ScopeSpansArray,
    ScopeSpans,
    SpansArray,
    Other,
}

/// serde_json's recursion limit: a body nested deeper is refused by the
/// decoder at that depth, so the census stops there too.
const JSON_MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, Copy)]
struct Frame {
    object: bool,
    role: Role,
    /// `AnyValue` levels this container sits in (each buffers its subtree).
    any_depth: usize,
    /// An array: what each object in it costs decoded (the struct its key
    /// names; the largest for a key OTLP does not have).
    element: usize,
    /// An array under the key `values`: its objects are `AnyValue`s (of an
    /// `ArrayValue`) or key-values (of a `KeyValueList`).
    values_array: bool,
    /// An object, after a key: what the key's value is.
    next: Next,
}

/// What the value after a key is.
#[derive(Debug, Clone, Copy)]
struct Next {
    role: Role,
    /// The key was `value`: an object here is an `AnyValue`.
    any_value: bool,
    /// The key was `values`.
    values: bool,
    /// An array here: what each object in it costs.
    element: usize,
}

impl Next {
    fn unknown() -> Next {
        Next {
            role: Role::Other,
            any_value: false,
            values: false,
            element: Msg::largest(),
        }
    }
}

/// The struct each object of an array under `key` decodes to (OTLP's
/// array-valued keys; the largest message for any other).
fn element_of(key: &[u8]) -> usize {
    let pairs: [(&str, usize); 8] = [
        ("resourceSpans", Msg::ResourceSpans.size()),
        ("scopeSpans", Msg::ScopeSpans.size()),
        ("spans", Msg::Span.size()),
        ("attributes", Msg::KeyValue.size()),
        ("events", Msg::Event.size()),
        ("links", Msg::Link.size()),
        ("values", Msg::KeyValue.size().max(Msg::AnyValue.size())),
        ("entityRefs", Msg::EntityRef.size()),
    ];
    pairs
        .iter()
        .find(|(name, _)| key_is(key, name))
        .map_or(Msg::largest(), |(_, size)| *size)
}

/// Compare a JSON string's raw bytes (between the quotes) with `name`,
/// unescaping as serde does (`"sp\u0061ns"` is `spans`).
fn key_is(raw: &[u8], name: &str) -> bool {
    if !raw.contains(&b'\\') {
        return raw == name.as_bytes();
    }
    let mut want = name.bytes();
    let mut i = 0;
    while i < raw.len() {
        let b = if raw[i] == b'\\' {
            match raw.get(i + 1) {
                Some(b'u') => {
                    let code = raw
                        .get(i + 2..i + 6)
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .and_then(|h| u8::from_str_radix(h, 16).ok());
                    // Beyond one byte: no OTLP key has it.
                    let Some(code) = code else { return false };
                    i += 6;
                    code
                }
                Some(&c) => {
                    i += 2;
                    match c {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        b'b' => 8,
                        b'f' => 12,
                        other => other,
                    }
                }
                None => return false,
            }
        } else {
            i += 1;
            raw[i - 1]
        };
        if want.next() != Some(b) {
            return false;
        }
    }
    want.next().is_none()
}

fn is_delimiter(b: u8) -> bool {
    matches!(
        b,
        b',' | b':' | b'{' | b'}' | b'[' | b']' | b'"' | b' ' | b'\t' | b'\n' | b'\r'
    )
}

/// The census of an OTLP/JSON body (see the module doc). Of a body that is
/// not JSON, the part before the error is charged: all the decoder builds
/// before it refuses.
pub fn json(body: &[u8]) -> Census {
    let mut census = Census {
        spans: 0,
        decoded_bytes: Msg::Request.size(),
    };
    let charge = |census: &mut Census, n: usize| {
        census.decoded_bytes = census.decoded_bytes.saturating_add(n);
    };
    let mut stack: Vec<Frame> = Vec::new();
    let mut expecting_key = false;
    let mut longest_string = 0;
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        match b {
            b'{' | b'[' => {
                if stack.len() >= JSON_MAX_DEPTH {
                    break;
                }
                let object = b == b'{';
                let mut frame = Frame {
                    object,
                    role: Role::Other,
                    any_depth: stack.last().map_or(0, |p| p.any_depth),
                    element: Msg::largest(),
                    values_array: false,
                    next: Next::unknown(),
                };
                // An object or array as a key's value is inline in its
                // struct; an object in an array is a Vec element.
                let mut own = ALLOC_OVERHEAD;
                match stack.last() {
                    None => frame.role = Role::Root,
                    Some(p) if p.object => {
                        frame.role = p.next.role;
                        frame.any_depth += usize::from(p.next.any_value && object);
                        frame.values_array = p.next.values && !object;
                        frame.element = p.next.element;
                    }
                    Some(p) => {
                        if object {
                            own += VEC_PEAK * p.element;
                            if p.role == Role::SpansArray {
                                census.spans += 1;
                            }
                            frame.role = match p.role {
                                Role::ResourceSpansArray => Role::ResourceSpans,
                                Role::ScopeSpansArray => Role::ScopeSpans,
                                _ => Role::Other,
                            };
                            frame.any_depth += usize::from(p.values_array);
                        }
                    }
                }
                charge(&mut census, own + frame.any_depth * CONTENT_NODE);
                stack.push(frame);
                expecting_key = object;
                i += 1;
            }
            b'}' | b']' => {
                stack.pop();
                expecting_key = false;
                i += 1;
            }
            b',' => {
                expecting_key = stack.last().is_some_and(|f| f.object);
                i += 1;
            }
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < body.len() && body[j] != b'"' {
                    j += if body[j] == b'\\' { 2 } else { 1 };
                }
                let raw = &body[start..j.min(body.len())];
                i = j + 1;
                longest_string = longest_string.max(raw.len());
                let any_depth = stack.last().map_or(0, |f| f.any_depth);
                let buffered = any_depth * (CONTENT_NODE + raw.len() + ALLOC_OVERHEAD);
                match stack.last_mut() {
                    Some(top) if expecting_key && top.object => {
                        // A key: it decides what the value after it is.
                        let role = match top.role {
                            Role::Root if key_is(raw, "resourceSpans") => Role::ResourceSpansArray,
                            Role::ResourceSpans if key_is(raw, "scopeSpans") => {
                                Role::ScopeSpansArray
                            }
                            Role::ScopeSpans if key_is(raw, "spans") => Role::SpansArray,
                            _ => Role::Other,
                        };
                        top.next = Next {
                            role,
                            any_value: key_is(raw, "value"),
                            values: key_is(raw, "values"),
                            element: element_of(raw),
                        };
                        expecting_key = false;
                        charge(&mut census, buffered);
                    }
                    top => {
                        // A value: a String (in a Vec<String> when in an
                        // array); hex ids and numbers-as-strings go through
                        // a transient copy first (twice the bytes).
                        let in_array = top.is_some_and(|f| !f.object);
                        let element = if in_array {
                            VEC_PEAK * size_of::<String>()
                        } else {
                            0
                        };
                        charge(
                            &mut census,
                            element + 2 * (raw.len() + ALLOC_OVERHEAD) + buffered,
                        );
                    }
                }
            }
            b':' | b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ => {
                // A number or literal: inline in its struct, or one buffered node.
                while i < body.len() && !is_delimiter(body[i]) {
                    i += 1;
                }
                let any_depth = stack.last().map_or(0, |f| f.any_depth);
                charge(&mut census, any_depth * CONTENT_NODE);
            }
        }
    }
    // serde_json unescapes into one scratch buffer it keeps for the whole
    // parse, as long as the longest string.
    charge(&mut census, longest_string + ALLOC_OVERHEAD);
    census
}

/// What a budget reservation answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Reserved.
    Granted,
    /// Held by other requests now: try again later.
    Busy,
    /// More than the whole budget: never.
    OverBudget {
        /// The whole budget, bytes.
        budget: u64,
    },
}

/// Why metering refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeterRefusal {
    /// The budget is held by other requests now.
    Busy,
    /// The request needs more than the whole budget.
    OverBudget {
        /// Bytes it needed when refused.
        needed: usize,
        /// The whole budget.
        budget: u64,
    },
}

/// Charges a request's memory against the budget in steps, reserving a
/// megabyte (or the whole of a larger charge) ahead of use.
pub struct Meter<'a> {
    reserve: &'a mut dyn FnMut(usize) -> Grant,
    reserved: usize,
    used: usize,
}

/// Reservation step.
const STEP: usize = 1 << 20;

impl std::fmt::Debug for Meter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("reserved", &self.reserved)
            .field("used", &self.used)
            .finish()
    }
}

/// A meter that grants everything (benches and callers without a budget).
pub fn unmetered(bytes: usize) -> Grant {
    let _ = bytes;
    Grant::Granted
}

impl<'a> Meter<'a> {
    /// A meter reserving through `reserve`.
    pub fn new(reserve: &'a mut dyn FnMut(usize) -> Grant) -> Meter<'a> {
        Meter {
            reserve,
            reserved: 0,
            used: 0,
        }
    }

    /// Charge `bytes` more.
    pub fn charge(&mut self, bytes: usize) -> Result<(), MeterRefusal> {
        self.used = self.used.saturating_add(bytes);
        if self.used <= self.reserved {
            return Ok(());
        }
        let want = (self.used - self.reserved).max(STEP);
        match (self.reserve)(want) {
            Grant::Granted => {
                self.reserved += want;
                Ok(())
            }
            Grant::Busy => Err(MeterRefusal::Busy),
            Grant::OverBudget { budget } => Err(MeterRefusal::OverBudget {
                needed: self.used,
                budget,
            }),
        }
    }

    /// Bytes charged so far.
    pub fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::otlp::{self, Encoding};
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Counts the bytes this thread has live, and their peak: the oracle
    /// the census must stay above (the allocator's own view, not ours).
    struct Counting;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn note(delta: isize) {
        let _ = LIVE.try_with(|l| {
            let v = l.get() + delta;
            l.set(v);
            let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
        });
    }

    // SAFETY: every call is forwarded to the system allocator unchanged;
    // the counters are plain thread-local cells that never allocate.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size() as isize);
            // SAFETY: forwarded with the caller's layout.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            note(-(layout.size() as isize));
            // SAFETY: forwarded with the caller's pointer and layout.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // Old and new both live while the copy runs.
            note(new_size as isize);
            // SAFETY: forwarded with the caller's pointer, layout and size.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            note(-(layout.size() as isize));
            p
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// Peak bytes `f` had live on this thread above where it started.
    fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        let out = f();
        let peak = PEAK.with(Cell::get) - base;
        (out, peak.max(0) as usize)
    }

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    fn nested(depth: usize) -> AnyValue {
        let mut v = AnyValue {
            value: Some(Value::StringValue("leaf".into())),
        };
        for i in 0..depth {
            v = AnyValue {
                value: Some(if i % 2 == 0 {
                    Value::ArrayValue(ArrayValue {
                        values: vec![v.clone(), v],
                    })
                } else {
                    Value::KvlistValue(KeyValueList {
                        values: vec![KeyValue {
                            key: "k".into(),
                            value: Some(v),
                            ..Default::default()
                        }],
                    })
                }),
            };
        }
        v
    }

    fn request(spans: Vec<Span>, resource: Vec<KeyValue>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: resource,
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    /// Shapes that amplify, and one that looks like real traffic.
    fn shapes() -> Vec<(&'static str, ExportTraceServiceRequest)> {
        let realistic: Vec<Span> = (0..500u64)
            .map(|i| Span {
                trace_id: i.to_be_bytes().repeat(2),
                span_id: i.to_be_bytes().to_vec(),
                name: "POST /checkout".into(),
                kind: 2,
                start_time_unix_nano: 1_700_000_000_000_000_000 + i,
                end_time_unix_nano: 1_700_000_000_050_000_000 + i,
                attributes: vec![
                    kv("http.request.method", Value::StringValue("POST".into())),
                    kv("http.response.status_code", Value::IntValue(200)),
                    kv("url.path", Value::StringValue("/checkout".into())),
                ],
                status: Some(Status::default()),
                ..Default::default()
            })
            .collect();
        let service = vec![
            kv("service.name", Value::StringValue("checkout-api".into())),
            kv("service.version", Value::StringValue("2.4.1".into())),
        ];
        vec![
            (
                "empty spans",
                request(vec![Span::default(); 20_000], vec![]),
            ),
            (
                "empty attributes",
                request(
                    vec![Span {
                        attributes: vec![KeyValue::default(); 20_000],
                        ..Default::default()
                    }],
                    vec![KeyValue::default(); 5_000],
                ),
            ),
            (
                "empty events and links",
                request(
                    vec![Span {
                        events: vec![span::Event::default(); 10_000],
                        links: vec![span::Link::default(); 10_000],
                        ..Default::default()
                    }],
                    vec![],
                ),
            ),
            (
                "empty resource spans",
                ExportTraceServiceRequest {
                    resource_spans: vec![ResourceSpans::default(); 10_000],
                },
            ),
            (
                "nested values",
                request(
                    vec![Span {
                        attributes: vec![KeyValue {
                            key: "deep".into(),
                            value: Some(nested(12)),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    vec![],
                ),
            ),
            (
                "empty array values",
                request(
                    vec![Span {
                        attributes: vec![kv(
                            "a",
                            Value::ArrayValue(ArrayValue {
                                values: vec![AnyValue::default(); 20_000],
                            }),
                        )],
                        ..Default::default()
                    }],
                    vec![],
                ),
            ),
            (
                "strings",
                request(
                    vec![Span {
                        name: "n".repeat(100_000),
                        trace_id: vec![7; 1000],
                        attributes: vec![kv("s", Value::StringValue("x".repeat(200_000)))],
                        ..Default::default()
                    }],
                    vec![],
                ),
            ),
            ("realistic", request(realistic, service)),
        ]
    }

    #[test]
    fn the_census_bounds_the_heap_decoding_takes_and_counts_every_span() {
        for (name, req) in shapes() {
            let spans: usize = req
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            for encoding in [Encoding::Protobuf, Encoding::Json] {
                let body = match encoding {
                    Encoding::Protobuf => req.encode_to_vec(),
                    Encoding::Json => serde_json::to_vec(&req).unwrap(),
                };
                let census = match encoding {
                    Encoding::Protobuf => protobuf(&body).unwrap(),
                    Encoding::Json => json(&body),
                };
                let (decoded, peak) = peak_of(|| otlp::decode(&body, encoding));
                let decoded = decoded.unwrap_or_else(|e| panic!("{name} {encoding:?}: {e}"));
                assert_eq!(decoded, req, "{name} {encoding:?} round trip");
                assert_eq!(census.spans, spans, "{name} {encoding:?} spans");
                assert!(
                    census.decoded_bytes >= peak,
                    "{name} {encoding:?}: census {} < peak heap {peak} ({} body bytes)",
                    census.decoded_bytes,
                    body.len()
                );
                eprintln!(
                    "{name:>22} {encoding:?}: {} B body, peak heap {peak} B, census {} B ({:.1}x)",
                    body.len(),
                    census.decoded_bytes,
                    census.decoded_bytes as f64 / peak.max(1) as f64
                );
                if name == "realistic" {
                    // Not absurdly pessimistic for real traffic.
                    let within = match encoding {
                        Encoding::Protobuf => 4,
                        Encoding::Json => 10,
                    };
                    assert!(
                        census.decoded_bytes < within * peak,
                        "{encoding:?}: census {} vs peak {peak}",
                        census.decoded_bytes
                    );
                }
            }
        }
    }

    #[test]
    fn aggregation_charges_at_least_what_it_allocates() {
        let long = |c: &str| c.repeat(256);
        let mut resource = vec![
            kv("service.name", Value::StringValue(long("s"))),
            kv("service.version", Value::StringValue(long("v"))),
            kv("deployment.environment.name", Value::StringValue(long("e"))),
            kv("obs.config.digest", Value::StringValue(long("c"))),
        ];
        for i in 0..60 {
            resource.push(kv(
                &format!("obs.feature_flags.{i:02}{}", "f".repeat(254)),
                Value::StringValue(long("x")),
            ));
        }
        // Every span its own minute (a new row each), half of them CLIENT
        // calls to a long-named database, every request failed (samples).
        let spans: Vec<Span> = (0..3_000u64)
            .map(|i| Span {
                trace_id: vec![1; 16],
                span_id: (i + 1).to_be_bytes().to_vec(),
                parent_span_id: if i % 2 == 1 {
                    i.to_be_bytes().to_vec()
                } else {
                    vec![]
                },
                name: "n".repeat(1024),
                kind: if i % 2 == 1 { 3 } else { 2 },
                start_time_unix_nano: 1_700_000_000_000_000_000 + i * 60_000_000_000,
                end_time_unix_nano: 1_700_000_000_000_000_000 + i * 60_000_000_000 + 1_000,
                attributes: vec![
                    kv("db.system", Value::StringValue(long("d"))),
                    kv("server.address", Value::StringValue(long("a"))),
                    kv("code.filepath", Value::StringValue("p".repeat(1024))),
                ],
                status: Some(Status {
                    code: 2,
                    message: "m".repeat(300),
                }),
                ..Default::default()
            })
            .collect();
        let req = request(spans, resource);
        otlp::check(&req).unwrap();
        let mut grant = unmetered;
        let mut meter = Meter::new(&mut grant);
        let (batch, peak) = peak_of(|| otlp::aggregate_within(&req, &mut meter).unwrap());
        assert_eq!(batch.spans, 3_000);
        assert_eq!(batch.failed.len(), 1_000);
        assert!(
            meter.used() >= peak,
            "charged {} < peak heap {peak}",
            meter.used()
        );
        eprintln!(
            "aggregation: peak heap {peak} B, charged {} B",
            meter.used()
        );
    }

    #[test]
    fn json_spans_are_counted_through_escaped_keys_and_only_where_spans_are() {
        let body = br#"{"resourceSpans":[{"scopeSpans":[{"sp\u0061ns":[{},{}],"spans":[{}]}],
            "other":{"spans":[{},{},{}]}}], "spans":[{}]}"#;
        assert_eq!(json(body).spans, 3);
        assert!(key_is(br"\u0073pans", "spans"));
        assert!(!key_is(br"\u0073pan", "spans"));
        assert!(!key_is(br"\u00e9", "spans"));
    }

    #[test]
    fn malformed_protobuf_is_refused_by_the_census() {
        let req = request(vec![Span::default(); 3], vec![]);
        let mut body = req.encode_to_vec();
        body.pop();
        assert!(protobuf(&body).is_err());
        // A message field sent as a varint.
        assert!(protobuf(&[0x08, 0x01]).is_err());
        // Unknown fields cost nothing and are skipped, groups included.
        let census = protobuf(&[0x78, 0x05, 0xf3, 0x01, 0x08, 0x01, 0xf4, 0x01]).unwrap();
        assert_eq!(census.spans, 0);
        // Nesting past the decoder's recursion limit: both refuse.
        let mut v = AnyValue::default();
        for _ in 0..120 {
            v = AnyValue {
                value: Some(Value::ArrayValue(ArrayValue { values: vec![v] })),
            };
        }
        let deep = request(
            vec![Span {
                attributes: vec![KeyValue {
                    key: "d".into(),
                    value: Some(v),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            vec![],
        )
        .encode_to_vec();
        assert!(protobuf(&deep).is_err());
        assert!(otlp::decode(&deep, Encoding::Protobuf).is_err());
    }

    #[test]
    fn the_meter_reserves_in_steps_and_says_busy_or_over_budget() {
        let mut asked = Vec::new();
        let mut free = 3 << 20;
        let mut grant = |n: usize| {
            asked.push(n);
            if n > 8 << 20 {
                Grant::OverBudget { budget: 8 << 20 }
            } else if n <= free {
                free -= n;
                Grant::Granted
            } else {
                Grant::Busy
            }
        };
        let mut meter = Meter::new(&mut grant);
        meter.charge(10).unwrap();
        meter.charge(1 << 20).unwrap();
        meter.charge(1 << 19).unwrap();
        assert_eq!(meter.charge(2 << 20), Err(MeterRefusal::Busy));
        assert_eq!(
            meter.charge(9 << 20),
            Err(MeterRefusal::OverBudget {
                needed: 10 + (1 << 20) + (1 << 19) + (2 << 20) + (9 << 20),
                budget: 8 << 20
            })
        );
        assert_eq!(asked[0], 1 << 20, "a small charge reserves a whole step");
    }
}
