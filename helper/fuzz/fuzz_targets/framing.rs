//! Fuzz the agent↔helper framing: arbitrary bytes must never panic the
//! decoder, and whatever decodes must survive encode → decode unchanged.
//! Bounded run: `cd helper/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run framing -- -max_total_time=60 -max_len=65536`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pstack_helper::protocol::{
    MAX_FRAME, NetRequest, NetResponse, Request, Response, decode, encode, read_frame,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((msg, used))) = decode::<Request>(data, 1 << 16) {
        assert!(used <= data.len());
        let again = encode(&msg, MAX_FRAME).expect("a decoded message re-encodes");
        let (back, _): (Request, usize) = decode(&again, MAX_FRAME).expect("re-decodes").expect("complete");
        assert_eq!(back, msg);
    }
    if let Ok(Some((msg, _))) = decode::<Response>(data, 1 << 16) {
        let again = encode(&msg, MAX_FRAME).expect("a decoded message re-encodes");
        let (back, _): (Response, usize) = decode(&again, MAX_FRAME).expect("re-decodes").expect("complete");
        assert_eq!(back, msg);
    }
    if let Ok(Some((msg, _))) = decode::<NetRequest>(data, 1 << 16) {
        let again = encode(&msg, MAX_FRAME).expect("a decoded message re-encodes");
        let (back, _): (NetRequest, usize) = decode(&again, MAX_FRAME).expect("re-decodes").expect("complete");
        assert_eq!(back, msg);
    }
    let _ = decode::<NetResponse>(data, 1 << 16);
    let _ = read_frame::<Request>(&mut std::io::Cursor::new(data), 1 << 16);
});
