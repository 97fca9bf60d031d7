use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;

const VALID: &str = r#"{"pod_name":"hello-00001-deployment-abc","pod_ip":"10.0.0.5","namespace":"default","revision":"hello-00001","event_type":"ready","timestamp":"2025-10-31T12:00:00.123456789Z"}"#;

/// A valid body with `field` replaced by the raw JSON `value` (or removed when `None`).
fn with_field(field: &str, value: Option<&str>) -> Vec<u8> {
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(VALID).unwrap();
    match value {
        Some(value) => {
            object.insert(field.to_owned(), serde_json::from_str(value).unwrap());
        }
        None => {
            object.remove(field);
        }
    }
    serde_json::to_vec(&object).unwrap()
}

fn error_of(body: &[u8]) -> RegistrationError {
    match parse(body) {
        Ok(registration) => panic!("{body:?} was accepted as {registration:?}"),
        Err(error) => error,
    }
}

// === fork §8.1 items 1–3 ===

#[test]
fn a_complete_body_is_accepted_with_every_field() {
    let registration = parse(VALID.as_bytes()).unwrap();
    assert_eq!(
        registration,
        Registration {
            pod_name: "hello-00001-deployment-abc".into(),
            pod_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
            namespace: "default".into(),
            revision: "hello-00001".into(),
            event: QueueProxyEvent::Ready,
            timestamp: Some("2025-10-31T12:00:00.123456789Z".into()),
        }
    );
}

#[test]
fn the_success_body_is_what_the_fork_writes() {
    let value: serde_json::Value = serde_json::from_str(ACCEPTED_BODY).unwrap();
    assert_eq!(value, serde_json::json!({"status": "accepted"}));
    assert!(ACCEPTED_BODY.ends_with("}\n"));
    assert_eq!(ACCEPTED_CONTENT_TYPE, "application/json");
}

#[test]
fn every_event_type_is_accepted() {
    for (name, event) in [
        ("startup", QueueProxyEvent::Startup),
        ("ready", QueueProxyEvent::Ready),
        ("not-ready", QueueProxyEvent::NotReady),
        ("draining", QueueProxyEvent::Draining),
    ] {
        let body = with_field("event_type", Some(&format!("{name:?}")));
        assert_eq!(parse(&body).unwrap().event, event, "{name}");
    }
}

#[test]
fn each_required_field_empty_absent_or_null_is_missing() {
    for field in ["pod_name", "pod_ip", "namespace", "revision", "event_type"] {
        for value in [Some("\"\""), Some("null"), None] {
            let error = error_of(&with_field(field, value));
            assert_eq!(
                error,
                RegistrationError::MissingFields,
                "{field} = {value:?}"
            );
            assert_eq!(error.status(), 400);
            assert_eq!(error.message(), "Missing required fields");
        }
    }
}

#[test]
fn a_missing_or_empty_timestamp_is_fine() {
    assert_eq!(
        parse(&with_field("timestamp", None)).unwrap().timestamp,
        None
    );
    assert_eq!(
        parse(&with_field("timestamp", Some("null")))
            .unwrap()
            .timestamp,
        None
    );
    assert_eq!(
        parse(&with_field("timestamp", Some("\"\"")))
            .unwrap()
            .timestamp
            .as_deref(),
        Some("")
    );
}

#[test]
fn bad_json_and_empty_bodies_are_invalid() {
    for body in [
        &b""[..],
        b"   ",
        b"{",
        b"not json",
        b"{\"pod_name\": }",
        b"[]",
        b"\"a string\"",
        b"42",
        b"{\"pod_name\":\"a\"",
    ] {
        let error = error_of(body);
        assert_eq!(error, RegistrationError::InvalidBody, "{body:?}");
        assert_eq!(error.status(), 400);
        assert_eq!(error.message(), "Invalid request body");
    }
}

#[test]
fn an_array_in_field_order_is_not_an_object() {
    let positional = br#"["p", "10.0.0.1", "n", "r", "ready", "t"]"#;
    assert_eq!(error_of(positional), RegistrationError::InvalidBody);
    assert_eq!(
        error_of(b" \n\t[\"p\", \"10.0.0.1\", \"n\", \"r\", \"ready\", null]"),
        RegistrationError::InvalidBody
    );
}

#[test]
fn null_as_the_whole_body_is_missing_fields_as_in_go() {
    assert_eq!(error_of(b"null"), RegistrationError::MissingFields);
    assert_eq!(error_of(b"{}"), RegistrationError::MissingFields);
}

#[test]
fn an_unknown_event_type_is_refused_with_the_forks_message() {
    for value in [
        "\"bogus\"",
        "\"Ready\"",
        "\"READY\"",
        "\" ready\"",
        "\"notready\"",
    ] {
        let error = error_of(&with_field("event_type", Some(value)));
        assert_eq!(error, RegistrationError::InvalidEventType, "{value}");
        assert_eq!(
            error.message(),
            "Invalid event_type: must be 'startup', 'ready', 'not-ready', or 'draining'"
        );
        assert_eq!(error.status(), 400);
    }
}

#[test]
fn a_pod_ip_that_is_not_a_bare_address_is_refused() {
    for value in [
        "not-an-ip",
        "10.0.0.1:8012",
        "[::1]",
        "[::1]:8012",
        "fe80::1%eth0",
        "10.0.0",
        "10.0.0.256",
        "010.0.0.1",
        " 10.0.0.1",
        "10.0.0.1 ",
        "0.0.0.0",
        "::",
        "255.255.255.255",
        "224.0.0.1",
        "ff02::1",
    ] {
        let error = error_of(&with_field("pod_ip", Some(&format!("{value:?}"))));
        assert_eq!(error, RegistrationError::InvalidPodIp, "{value}");
        assert_eq!(
            error.message(),
            "Invalid pod_ip: must be a valid IP address"
        );
        assert_eq!(error.status(), 400);
    }
}

#[test]
fn ipv6_and_loopback_addresses_are_accepted() {
    for (value, expected) in [
        ("fd00::5", "fd00::5".parse::<IpAddr>().unwrap()),
        ("::1", IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ("127.0.0.2", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
    ] {
        let body = with_field("pod_ip", Some(&format!("{value:?}")));
        assert_eq!(parse(&body).unwrap().pod_ip, expected, "{value}");
    }
}

#[test]
fn an_ipv4_mapped_address_becomes_the_ipv4_address() {
    let body = with_field("pod_ip", Some("\"::ffff:10.0.0.7\""));
    assert_eq!(
        parse(&body).unwrap().pod_ip,
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7))
    );
}

#[test]
fn checks_run_in_the_forks_order() {
    // Every later check would fail too; the first one in the fork's order decides.
    let all_wrong =
        br#"{"pod_name":"","pod_ip":"x","namespace":"n","revision":"r","event_type":"bogus"}"#;
    assert_eq!(error_of(all_wrong), RegistrationError::MissingFields);
    let event_and_ip_wrong =
        br#"{"pod_name":"p","pod_ip":"x","namespace":"n","revision":"r","event_type":"bogus"}"#;
    assert_eq!(
        error_of(event_and_ip_wrong),
        RegistrationError::InvalidEventType
    );
}

#[test]
fn unknown_fields_are_ignored() {
    let body = with_field("extra", Some(r#"{"nested": [1, 2, {"deep": null}]}"#));
    assert_eq!(parse(&body).unwrap(), parse(VALID.as_bytes()).unwrap());
}

#[test]
fn whitespace_around_the_value_is_fine_but_trailing_data_is_not() {
    let padded = format!(" \n{VALID}\n ");
    assert!(parse(padded.as_bytes()).is_ok());
    let trailing = format!("{VALID} {{}}");
    assert_eq!(
        error_of(trailing.as_bytes()),
        RegistrationError::InvalidBody
    );
}

#[test]
fn the_user_agent_must_be_exactly_the_queue_proxys() {
    assert_eq!(check_user_agent(Some(b"knative-queue-proxy")), Ok(()));
    for value in [
        &b"Knative-Queue-Proxy"[..],
        b"knative-queue-proxy/1.0",
        b" knative-queue-proxy",
        b"",
        b"curl/8.0",
    ] {
        let error = check_user_agent(Some(value)).unwrap_err();
        assert_eq!(error.status(), 401, "{value:?}");
        assert_eq!(error.message(), "Invalid User-Agent for pod registration");
    }
    assert_eq!(
        check_user_agent(None),
        Err(RegistrationError::InvalidUserAgent)
    );
}

#[test]
fn error_bodies_end_with_a_newline_like_http_error() {
    assert_eq!(
        RegistrationError::MissingFields.body(),
        "Missing required fields\n"
    );
    assert_eq!(
        RegistrationError::InvalidPodIp.to_string(),
        RegistrationError::InvalidPodIp.message()
    );
}

// === hostile input ===

/// A valid body whose `field` holds the raw JSON `raw` instead; the original value moves
/// to an ignored key. Unlike [`with_field`] this takes text serde_json would not build.
fn with_raw_value(field: &str, raw: &str) -> Vec<u8> {
    let body = VALID.replacen(
        &format!("\"{field}\":"),
        &format!("\"{field}\":{raw},\"ignored_{field}\":"),
        1,
    );
    assert_ne!(body, VALID, "{field} is one of VALID's fields");
    body.into_bytes()
}

/// A valid body with one more, unknown, field holding the raw JSON `raw`.
fn with_raw_unknown(raw: &str) -> Vec<u8> {
    format!("{{\"extra\":{raw},{}", &VALID[1..]).into_bytes()
}

#[test]
fn deep_nesting_neither_overflows_the_stack_nor_slips_through() {
    // About 60 KB of brackets: as deep as fits under the body limit.
    let depth = 30_000;
    let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let objects = format!("{}1{}", "{\"a\":".repeat(depth / 6), "}".repeat(depth / 6));
    // As the whole body, nested arrays are no object; nested objects are an object with
    // an unknown field "a" and none of the required ones.
    for (nested, as_body) in [
        (&arrays, RegistrationError::InvalidBody),
        (&objects, RegistrationError::MissingFields),
    ] {
        assert!(with_raw_unknown(nested).len() <= MAX_BODY);
        assert_eq!(error_of(nested.as_bytes()), as_body);
        assert_eq!(
            error_of(&with_raw_value("pod_name", nested)),
            RegistrationError::InvalidBody
        );
        // serde_json skips an unknown value without recursing, so depth costs no stack;
        // Go accepts the same body.
        assert_eq!(
            parse(&with_raw_unknown(nested)),
            parse(VALID.as_bytes()),
            "{}",
            &nested[..10]
        );
    }
    // Deeper than that is too large before it is parsed.
    let deeper = format!("{}{}", "[".repeat(40_000), "]".repeat(40_000));
    assert_eq!(
        error_of(&with_raw_unknown(&deeper)),
        RegistrationError::BodyTooLarge
    );
}

#[test]
fn bodies_over_the_limit_are_too_large() {
    let huge_name = "a".repeat(1024 * 1024);
    let body = with_field("pod_name", Some(&format!("{huge_name:?}")));
    let error = error_of(&body);
    assert_eq!(error, RegistrationError::BodyTooLarge);
    assert_eq!(error.status(), 400);
    assert_eq!(error.message(), "Request body too large");

    // The limit is on the body, not the field: a long name that fits is fine.
    let long_name = "a".repeat(MAX_BODY - VALID.len() - 1000);
    let body = with_field("pod_name", Some(&format!("{long_name:?}")));
    assert!(body.len() <= MAX_BODY);
    assert_eq!(parse(&body).unwrap().pod_name, long_name);
}

#[test]
fn nul_and_other_control_characters_are_refused() {
    // A raw NUL is not JSON; an escaped one is JSON but never part of a name.
    let raw_nul = VALID.replace("default", "def\0ault");
    assert_eq!(error_of(raw_nul.as_bytes()), RegistrationError::InvalidBody);
    for field in [
        "pod_name",
        "pod_ip",
        "namespace",
        "revision",
        "event_type",
        "timestamp",
    ] {
        for value in [
            r#""a\u0000b""#,
            r#""a\nb""#,
            r#""a\u001bb""#,
            r#""a\u0085b""#,
        ] {
            assert_eq!(
                error_of(&with_field(field, Some(value))),
                RegistrationError::InvalidBody,
                "{field} = {value}"
            );
        }
    }
    let body = [b"\0".as_slice(), VALID.as_bytes()].concat();
    assert_eq!(error_of(&body), RegistrationError::InvalidBody);
}

#[test]
fn non_string_values_are_invalid_bodies() {
    for field in [
        "pod_name",
        "pod_ip",
        "namespace",
        "revision",
        "event_type",
        "timestamp",
    ] {
        for value in ["42", "1e400", "true", "[]", r#"{"a":"b"}"#, r#"["ready"]"#] {
            // 1e400 overflows f64; serde_json reports it instead of guessing.
            assert_eq!(
                error_of(&with_raw_value(field, value)),
                RegistrationError::InvalidBody,
                "{field} = {value}"
            );
        }
    }
}

#[test]
fn duplicate_keys_are_refused() {
    let body = VALID.replacen(
        "\"event_type\":\"ready\"",
        "\"event_type\":\"ready\",\"event_type\":\"draining\"",
        1,
    );
    assert_eq!(error_of(body.as_bytes()), RegistrationError::InvalidBody);
    // The same key in an unknown nested object is not ours to judge.
    let nested = with_field("extra", Some(r#"{"a": 1}"#));
    assert!(parse(&nested).is_ok());
}

#[test]
fn a_slash_in_the_namespace_or_revision_is_refused() {
    for field in ["namespace", "revision"] {
        let body = with_field(field, Some("\"a/b\""));
        assert_eq!(error_of(&body), RegistrationError::InvalidBody, "{field}");
    }
    // Anywhere else it is just a character.
    assert!(parse(&with_field("pod_name", Some("\"a/b\""))).is_ok());
}

#[test]
fn invalid_utf8_is_refused() {
    let mut body = VALID.as_bytes().to_vec();
    let at = VALID.find("default").unwrap();
    body[at] = 0xff;
    assert_eq!(error_of(&body), RegistrationError::InvalidBody);
    let mut overlong = VALID.as_bytes().to_vec();
    overlong.splice(at..at + 1, [0xc0, 0x80]);
    assert_eq!(error_of(&overlong), RegistrationError::InvalidBody);
    // A lone surrogate escape decodes to no valid UTF-8 either.
    let surrogate = VALID.replace("\"default\"", r#""\ud800""#);
    assert_eq!(
        error_of(surrogate.as_bytes()),
        RegistrationError::InvalidBody
    );
}

// === encode ===

#[test]
fn encode_writes_the_queue_proxys_shape() {
    let registration = parse(VALID.as_bytes()).unwrap();
    assert_eq!(String::from_utf8(encode(&registration)).unwrap(), VALID);
    let without_timestamp = Registration {
        timestamp: None,
        ..registration
    };
    let value: serde_json::Value = serde_json::from_slice(&encode(&without_timestamp)).unwrap();
    assert!(value.get("timestamp").is_none());
    assert_eq!(
        parse(&encode(&without_timestamp)).unwrap(),
        without_timestamp
    );
}

#[test]
fn encode_round_trips_ipv6_and_escapes() {
    let registration = Registration {
        pod_name: "quote\" back\\slash é ☃".into(),
        pod_ip: "fd00::1:2".parse().unwrap(),
        namespace: "ns".into(),
        revision: "rev".into(),
        event: QueueProxyEvent::NotReady,
        timestamp: Some("t".into()),
    };
    assert_eq!(parse(&encode(&registration)).unwrap(), registration);
}

// === properties ===

/// Strings a registration may carry: non-empty, no control characters.
fn name() -> impl Strategy<Value = String> {
    "[^\\p{Cc}]{1,40}"
}

/// A namespace or revision name: a name without `/`.
fn revision_part() -> impl Strategy<Value = String> {
    "[^\\p{Cc}/]{1,40}"
}

fn pod_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
    ]
    .prop_map(|ip| ip.to_canonical())
    .prop_filter("an address a pod can have", |ip| {
        parse_pod_ip(&ip.to_string()).is_some()
    })
}

fn event() -> impl Strategy<Value = QueueProxyEvent> {
    prop_oneof![
        Just(QueueProxyEvent::Startup),
        Just(QueueProxyEvent::Ready),
        Just(QueueProxyEvent::NotReady),
        Just(QueueProxyEvent::Draining),
    ]
}

prop_compose! {
    fn registration()(
        pod_name in name(),
        pod_ip in pod_ip(),
        namespace in revision_part(),
        revision in revision_part(),
        event in event(),
        timestamp in proptest::option::of("[^\\p{Cc}]{0,40}"),
    ) -> Registration {
        Registration { pod_name, pod_ip, namespace, revision, event, timestamp }
    }
}

proptest! {
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&body);
    }

    #[test]
    fn parse_never_panics_on_mutated_valid_bodies(
        position in 0..VALID.len(),
        replacement in proptest::collection::vec(any::<u8>(), 0..8),
        cut in 0..8usize,
    ) {
        let mut body = VALID.as_bytes().to_vec();
        let end = (position + cut).min(body.len());
        body.splice(position..end, replacement);
        if let Ok(registration) = parse(&body) {
            // Whatever got through must survive a relay unchanged.
            prop_assert_eq!(parse(&encode(&registration)), Ok(registration));
        }
    }

    #[test]
    fn encode_then_parse_round_trips(registration in registration()) {
        prop_assert_eq!(parse(&encode(&registration)), Ok(registration));
    }
}
