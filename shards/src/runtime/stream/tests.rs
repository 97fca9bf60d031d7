use std::cell::Cell;
use std::io::{Read, Write};
use std::rc::Rc;

use super::testing::{loopback_pair, reactor, Sealed};
use monoio::net::TcpStream;

use super::ByteStream;

#[test]
fn only_a_stream_whose_bytes_are_the_sockets_sends_raw() {
    reactor().block_on(async {
        let (plain, mut plain_peer) = loopback_pair().await;
        let sent = TcpStream::send_now(plain.socket(), b"hello");
        assert_eq!(sent, 5, "plain TCP takes the non-blocking send");
        let mut got = [0u8; 5];
        plain_peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");

        let (inner, mut sealed_peer) = loopback_pair().await;
        let sealed = Sealed::new(inner, Rc::new(Cell::new(0)));
        assert_eq!(
            Sealed::send_now(sealed.socket(), b"hello"),
            0,
            "a stream that frames its bytes must not have them written raw"
        );
        sealed_peer.set_nonblocking(true).unwrap();
        let mut nothing = [0u8; 1];
        assert_eq!(
            sealed_peer.read(&mut nothing).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock,
            "nothing reached the peer"
        );
    });
}

#[test]
fn an_idle_connection_is_stale_once_its_peer_speaks_or_closes() {
    reactor().block_on(async {
        let (quiet, _quiet_peer) = loopback_pair().await;
        assert!(!quiet.socket().peer_closed_or_spoke());

        let (spoken_to, mut talker) = loopback_pair().await;
        talker.write_all(b"x").unwrap();
        assert!(within_a_second(|| spoken_to
            .socket()
            .peer_closed_or_spoke()));
        assert!(
            spoken_to.socket().peer_closed_or_spoke(),
            "the peek left the byte where it was"
        );

        let (left, closer) = loopback_pair().await;
        drop(closer);
        assert!(within_a_second(|| left.socket().peer_closed_or_spoke()));
    });
}

/// Whether `check` holds within a second (what crosses loopback arrives within microseconds;
/// the bound only keeps a broken check from hanging the test).
fn within_a_second(check: impl Fn() -> bool) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !check() {
        if std::time::Instant::now() > until {
            return false;
        }
        std::thread::yield_now();
    }
    true
}
