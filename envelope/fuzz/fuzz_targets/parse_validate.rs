//! Parse + validate arbitrary bytes: must return a typed result, never panic.
//! When the input is a valid envelope, re-rendering it must verify again
//! (decode, re-encode, compare).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = pstack_envelope::verify(data) {
        let again = pstack_envelope::verify(&env.to_json_pretty()).expect("re-rendered envelope verifies");
        assert_eq!(again, env);
        let _ = pstack_envelope::handoff(&env).render();
        assert!(pstack_envelope::diff(&env, &env).unwrap().is_empty());
    }
});
