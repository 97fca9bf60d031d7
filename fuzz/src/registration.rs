//! A registration body: whatever `parse` accepts is a registration the control thread can key,
//! and relaying it to a peer (`encode`) gives that peer exactly the same registration.

use std::net::IpAddr;

use kactivator_api::registration::{encode, parse, RegistrationError, MAX_BODY};
use kactivator_api::RevisionKey;

/// Parse arbitrary bytes as a registration body.
pub fn registration(data: &[u8]) {
    let registration = match parse(data) {
        Ok(registration) => registration,
        Err(error) => {
            assert_eq!(error.status(), 400, "{error:?}");
            assert!(error.body().ends_with('\n'));
            if data.len() > MAX_BODY {
                assert_eq!(error, RegistrationError::BodyTooLarge);
            }
            return;
        }
    };
    assert!(data.len() <= MAX_BODY);
    // What the control thread does with it next must work (`sources::registrations`).
    RevisionKey::new(&registration.namespace, &registration.revision)
        .expect("a parsed registration names a revision key");
    for text in [
        &registration.pod_name,
        &registration.namespace,
        &registration.revision,
    ] {
        assert!(!text.is_empty() && !text.chars().any(char::is_control));
    }
    let ip = registration.pod_ip;
    assert!(!ip.is_unspecified() && !ip.is_multicast());
    assert_eq!(ip, ip.to_canonical(), "a mapped address is kept as IPv4");
    if let IpAddr::V4(v4) = ip {
        assert!(!v4.is_broadcast());
    }

    // Relayed to a peer, it is the same registration (and within the peer's MAX_BODY), and
    // encoding is a fixed point.
    let encoded = encode(&registration);
    let again = parse(&encoded).expect("an encoded registration parses");
    assert_eq!(again, registration);
    assert_eq!(encode(&again), encoded);
}
