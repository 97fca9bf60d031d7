//! Free local TCP ports for tests that need to know an address before something binds it.

use std::net::{Ipv4Addr, TcpListener};

/// Returns a port that was free on 127.0.0.1 a moment ago.
///
/// The port is found by binding port 0 and dropping the listener, so another process can
/// grab it before the caller binds it; prefer binding port 0 directly where the API allows.
///
/// # Panics
///
/// Panics when the loopback interface cannot be bound at all, since no test can run then.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("binding 127.0.0.1:0 to find a free port");
    listener
        .local_addr()
        .expect("reading the address of a freshly bound listener")
        .port()
}
