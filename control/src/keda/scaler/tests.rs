use super::*;

fn metadata(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_trigger_names_a_route_before_an_http_scaled_object_before_the_fleet() {
    type Row<'a> = (&'a [(&'a str, &'a str)], Result<Subject, SubjectError>);
    let rows: &[Row] = &[
        (
            &[
                ("interceptorRoute", "ir"),
                ("httpScaledObject", "hso"),
                ("interceptorTargetPendingRequests", "200"),
            ],
            Ok(Subject::InterceptorRoute { name: "ir".into() }),
        ),
        (
            &[
                ("httpScaledObject", "hso"),
                ("interceptorTargetPendingRequests", "200"),
                ("scalerAddress", "x:9090"),
            ],
            Ok(Subject::HttpScaledObject { name: "hso".into() }),
        ),
        (
            &[("interceptorTargetPendingRequests", "200")],
            Ok(Subject::Fleet { target: 200 }),
        ),
        (
            &[("interceptorTargetPendingRequests", "-7")],
            Ok(Subject::Fleet { target: -7 }),
        ),
        (
            &[("interceptorTargetPendingRequests", "9223372036854775807")],
            Ok(Subject::Fleet { target: i64::MAX }),
        ),
        (
            &[("interceptorTargetPendingRequests", "9223372036854775808")],
            Err(SubjectError::BadTarget("9223372036854775808".into())),
        ),
        (
            &[("interceptorTargetPendingRequests", " 200")],
            Err(SubjectError::BadTarget(" 200".into())),
        ),
        (
            &[("interceptorTargetPendingRequests", "")],
            Err(SubjectError::BadTarget("".into())),
        ),
        (
            &[("scalerAddress", "x:9090")],
            Err(SubjectError::NoReference),
        ),
        (&[], Err(SubjectError::NoReference)),
    ];
    for (pairs, want) in rows {
        assert_eq!(&Subject::of(&metadata(pairs)), want, "{pairs:?}");
    }
    assert_eq!(
        SubjectError::NoReference.to_string(),
        "unable to get HTTPScaledObject reference"
    );
}

#[test]
fn metric_names_are_the_add_ons_byte_for_byte() {
    assert_eq!(
        http_scaled_object_metric_name("default", "my-app"),
        "http-default_002Fmy-app"
    );
    assert_eq!(
        http_scaled_object_metric_name("ns.x", "a_b"),
        "http-ns.x_002Fa_005Fb"
    );
    // Go's %04X of the matched text: its UTF-8 bytes, at least four digits.
    assert_eq!(
        http_scaled_object_metric_name("é", "€"),
        "http-_C3A9_002F_E282AC"
    );
    assert_eq!(
        http_scaled_object_metric_name("a b", "c"),
        "http-a_0020b_002Fc"
    );
    assert_eq!(concurrency_metric_name("web"), "http_web_concurrency");
    assert_eq!(rate_metric_name("web"), "http_web_rate");
}

#[test]
fn an_http_scaled_object_has_one_integer_target_in_the_add_ons_order() {
    let rows = [
        (Scaling::default(), 100),
        (
            Scaling {
                target_pending_requests: Some(7),
                ..Scaling::default()
            },
            7,
        ),
        (
            Scaling {
                concurrency: Some(3),
                target_pending_requests: Some(7),
                ..Scaling::default()
            },
            3,
        ),
        (
            Scaling {
                rate: Some(50),
                target_pending_requests: Some(7),
                ..Scaling::default()
            },
            50,
        ),
    ];
    for (scaling, target) in rows {
        assert_eq!(
            http_scaled_object_spec("ns", "app", &scaling),
            MetricSpec {
                name: "http-ns_002Fapp".into(),
                target: Target::Integer(target)
            },
            "{scaling:?}"
        );
    }
}

#[test]
fn an_http_scaled_object_reports_concurrency_or_its_rate_rounded_up() {
    let count = RouteCount {
        concurrency: 4,
        rate: 2.01,
    };
    let by_concurrency = http_scaled_object_value("ns", "app", &Scaling::default(), count);
    assert_eq!(by_concurrency.value, Target::Integer(4));
    let by_rate = Scaling {
        rate: Some(10),
        ..Scaling::default()
    };
    assert_eq!(
        http_scaled_object_value("ns", "app", &by_rate, count).value,
        Target::Integer(3)
    );
    assert_eq!(
        http_scaled_object_value("ns", "app", &by_rate, RouteCount::default()).value,
        Target::Integer(0)
    );
}

#[test]
fn an_interceptor_route_reports_the_metric_asked_for_or_all_of_them() {
    let both = Scaling {
        concurrency: Some(10),
        rate: Some(100),
        target_pending_requests: None,
    };
    assert_eq!(
        interceptor_route_specs("web", &both),
        vec![
            MetricSpec {
                name: "http_web_concurrency".into(),
                target: Target::Float(10.0)
            },
            MetricSpec {
                name: "http_web_rate".into(),
                target: Target::Float(100.0)
            },
        ]
    );
    let count = RouteCount {
        concurrency: 2,
        rate: 0.5,
    };
    let names = |asked| {
        interceptor_route_values("web", &both, asked, count)
            .into_iter()
            .map(|v| (v.name, v.value))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(""),
        vec![
            ("http_web_concurrency".to_string(), Target::Float(2.0)),
            ("http_web_rate".to_string(), Target::Float(0.5)),
        ]
    );
    assert_eq!(
        names("http_web_rate"),
        vec![("http_web_rate".to_string(), Target::Float(0.5))]
    );
    assert!(names("http_other_rate").is_empty());
    let rate_only = Scaling {
        rate: Some(1),
        ..Scaling::default()
    };
    assert!(interceptor_route_values("web", &rate_only, "http_web_concurrency", count).is_empty());
}

#[test]
fn a_route_is_active_when_any_value_is_above_zero() {
    let value = |v| MetricValue {
        name: "m".into(),
        value: v,
    };
    assert_eq!(is_active(&[]), Err("no metric values in response"));
    assert_eq!(is_active(&[value(Target::Integer(0))]), Ok(false));
    assert_eq!(
        is_active(&[value(Target::Float(0.0)), value(Target::Float(0.001))]),
        Ok(true)
    );
    assert_eq!(is_active(&[value(Target::Integer(1))]), Ok(true));
    assert_eq!(is_active(&[value(Target::Integer(-3))]), Ok(false));
}
