//! Builders for hostile fixtures: start from the valid example, mutate the JSON,
//! and re-seal (compute the digest of the mutated value) unless the fixture is
//! about the digest itself.

use pstack_envelope::{compute_digest, example::example_unsealed};
use serde_json::{Value, json};

/// The valid example as a JSON value (unsealed).
pub fn base() -> Value {
    serde_json::to_value(example_unsealed()).unwrap()
}

/// Set `digest` to the digest of the value's canonical form.
pub fn reseal(mut v: Value) -> Value {
    let d = compute_digest(&v).unwrap();
    v["digest"] = json!(d);
    v
}

/// Bytes of a resealed value.
pub fn sealed_bytes(v: Value) -> Vec<u8> {
    serde_json::to_vec_pretty(&reseal(v)).unwrap()
}

/// The example made `complete`: its timed-out stack surface turned ok, its
/// unknown answered.
pub fn complete_base() -> Value {
    let mut v = base();
    v["completeness"] = json!("complete");
    v["surfaces"][2]["status"] = json!("ok");
    v["surfaces"][2].as_object_mut().unwrap().remove("cause");
    v["surfaces"][2]["digest"] = json!(pstack_envelope::sha256_digest(b"[<0>] fuse_request_send"));
    v["surfaces"][2]["bytes"] = json!(23);
    v["unknowns"] = json!([]);
    v
}
