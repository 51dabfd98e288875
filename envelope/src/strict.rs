//! Strict JSON parsing for sealed evidence.
//!
//! `serde_json` alone is too lenient for a sealing library: it keeps the last of
//! two duplicate keys (so two readers of the same bytes can disagree about what
//! was sealed), parses floats that RFC 8785 would re-render differently, and
//! accepts integers a JavaScript consumer cannot represent exactly. This module
//! drives `serde_json`'s tokenizer with a seed of our own that rejects each of
//! those with a typed error and its JSON path, and bounds nesting depth. The
//! happy path builds an ordinary `serde_json::Value`; paths are only assembled
//! while an error unwinds, so valid input pays nothing for them.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::EnvelopeError;

/// Largest magnitude an integer may have: 2^53 - 1, the last integer an IEEE
/// double (the number type of RFC 8785) represents exactly along with all its
/// neighbours.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Deepest nesting of arrays/objects accepted. Envelopes need about 6.
pub const MAX_DEPTH: usize = 32;

/// Parse bytes as strict JSON: UTF-8, no duplicate keys, integers only within
/// ±(2^53-1), nesting at most [`MAX_DEPTH`], nothing after the value.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, EnvelopeError> {
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(EnvelopeError::NotUtf8 {
            offset: e.valid_up_to(),
        });
    }
    let failure = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let seed = StrictSeed {
        depth: 0,
        failure: &failure,
    };
    let parsed = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(v) => Ok(v),
        Err(e) => Err(failure
            .into_inner()
            .map(|mut typed| {
                typed.prefix_path("$");
                typed
            })
            .unwrap_or_else(|| EnvelopeError::Json {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            })),
    }
}

thread_local! {
    /// The typed failure of the last strict `facts` parse on this thread, for
    /// [`take_facts_failure`]: serde's error type cannot carry it.
    static FACTS_FAILURE: RefCell<Option<EnvelopeError>> = const { RefCell::new(None) };
}

/// Deserialize a surface's `facts` object under the strict rules, from any
/// deserializer (used when the typed model is parsed straight from bytes).
pub(crate) fn deserialize_facts<'de, D: de::Deserializer<'de>>(
    d: D,
) -> Result<Map<String, Value>, D::Error> {
    let failure = RefCell::new(None);
    let seed = StrictSeed {
        depth: 3, // $ -> surfaces -> [i] -> facts
        failure: &failure,
    };
    match seed.deserialize(d) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(de::Error::custom("facts must be a JSON object")),
        Err(e) => {
            if let Some(typed) = failure.into_inner() {
                FACTS_FAILURE.with(|f| *f.borrow_mut() = Some(typed));
            }
            Err(e)
        }
    }
}

/// The typed failure raised inside a `facts` object by the last parse on this
/// thread, if any (its path is relative to the facts object).
pub(crate) fn take_facts_failure() -> Option<EnvelopeError> {
    FACTS_FAILURE.with(|f| f.borrow_mut().take())
}

/// Deserialize an optional member that, when present, must not be `null`:
/// absent and null would otherwise read the same and re-seal differently.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: de::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

struct StrictSeed<'a> {
    depth: usize,
    failure: &'a RefCell<Option<EnvelopeError>>,
}

impl StrictSeed<'_> {
    fn fail<E: de::Error>(&self, err: EnvelopeError) -> E {
        *self.failure.borrow_mut() = Some(err);
        E::custom("strict json rule")
    }

    /// Prefix the path of a typed failure raised below us with one more step.
    fn prefix(&self, step: &str) {
        if let Some(err) = self.failure.borrow_mut().as_mut() {
            err.prefix_path(step);
        }
    }

    fn child(&self) -> StrictSeed<'_> {
        StrictSeed {
            depth: self.depth + 1,
            failure: self.failure,
        }
    }
}

impl<'de> DeserializeSeed<'de> for StrictSeed<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        if v > MAX_SAFE_INTEGER {
            return Err(self.fail(EnvelopeError::NumberOutOfRange {
                path: String::new(),
                value: v.to_string(),
            }));
        }
        Ok(Value::from(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        if v.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(self.fail(EnvelopeError::NumberOutOfRange {
                path: String::new(),
                value: v.to_string(),
            }));
        }
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        // serde_json hands integers beyond u64/i64 to us as floats too; both
        // are outside what the envelope may carry, but name them apart.
        let err = if v.fract() == 0.0 && v.abs() > MAX_SAFE_INTEGER as f64 {
            EnvelopeError::NumberOutOfRange {
                path: String::new(),
                value: v.to_string(),
            }
        } else {
            EnvelopeError::Float {
                path: String::new(),
                value: v.to_string(),
            }
        };
        Err(self.fail(err))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(self.fail(EnvelopeError::TooDeep { limit: MAX_DEPTH }));
        }
        let mut items = Vec::new();
        loop {
            match seq.next_element_seed(self.child()) {
                Ok(Some(v)) => items.push(v),
                Ok(None) => break,
                Err(e) => {
                    self.prefix(&format!("[{}]", items.len()));
                    return Err(e);
                }
            }
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(self.fail(EnvelopeError::TooDeep { limit: MAX_DEPTH }));
        }
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(self.fail(EnvelopeError::DuplicateKey {
                    path: String::new(),
                    key,
                }));
            }
            match map.next_value_seed(self.child()) {
                Ok(v) => {
                    out.insert(key, v);
                }
                Err(e) => {
                    self.prefix(&format!(".{key}"));
                    return Err(e);
                }
            }
        }
        Ok(Value::Object(out))
    }
}
