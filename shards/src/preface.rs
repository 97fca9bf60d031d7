//! Whether a connection opens with the HTTP/2 preface (RFC 9113 §3.4): how the hub tells an h2c
//! client (prior knowledge, on any data port, as upstream's `h2c.NewHandler`) from an HTTP/1
//! one, from the bytes the HTTP/1 front reads first. Pure.

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether bytes at the start of a connection are the HTTP/2 preface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preface {
    /// The whole preface is there.
    Yes,
    /// What arrived is the preface's beginning: read on.
    Partial,
    /// Not HTTP/2.
    No,
}

/// Looks for the preface at the start of `bytes`.
pub fn preface(bytes: &[u8]) -> Preface {
    let n = bytes.len().min(PREFACE.len());
    if bytes[..n] != PREFACE[..n] {
        Preface::No
    } else if n == PREFACE.len() {
        Preface::Yes
    } else {
        Preface::Partial
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_is_recognised_whole_in_pieces_and_not_in_http1() {
        assert_eq!(preface(PREFACE), Preface::Yes);
        let mut with_settings = PREFACE.to_vec();
        with_settings.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(preface(&with_settings), Preface::Yes);
        assert_eq!(preface(b"PRI * HTTP/2"), Preface::Partial);
        assert_eq!(preface(b"P"), Preface::Partial);
        assert_eq!(preface(b"POST / HTTP/1.1\r\n"), Preface::No);
        assert_eq!(preface(b"PRI * HTTP/1.1\r\n"), Preface::No);
        assert_eq!(preface(b"GET / HTTP/1.1\r\n\r\n"), Preface::No);
    }
}
