//! pstackd and pstackctl: capture supervision, the Unix-socket API, spooling and shipping.
