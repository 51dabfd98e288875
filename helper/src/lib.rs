//! The isolated, killable helper process that performs risky reads for pstack, and its framing protocol.
