//! The add-on's own routing tables (`pkg/routing/tablememory_test.go` at v0.15.0), row for row,
//! and what its keys do with ports, escapes and segments (`key.go`).

use super::*;

/// A route named `name`, created at `created`, in namespace `ns`.
struct Route {
    name: &'static str,
    namespace: &'static str,
    created: i64,
    rules: Vec<Rule>,
}

fn route(name: &'static str, rules: Vec<Rule>) -> Route {
    Route {
        name,
        namespace: "",
        created: 0,
        rules,
    }
}

fn rule(hosts: &[&str], paths: &[&str], headers: &[(&str, Option<&str>)]) -> Rule {
    Rule {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        headers: headers
            .iter()
            .map(|(name, value)| HeaderMatch {
                name: (*name).into(),
                value: value.map(Into::into),
            })
            .collect(),
    }
}

fn table(routes: &[Route]) -> RuleTable<&'static str> {
    RuleTable::build(routes.iter().map(|r| {
        (
            r.name,
            RouteOrder {
                created: r.created,
                namespace: r.namespace.to_string(),
                name: r.name.to_string(),
            },
            &r.rules[..],
        )
    }))
}

fn lookup(
    table: &RuleTable<&'static str>,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<&'static str> {
    table
        .route(host.as_bytes(), path.as_bytes(), headers)
        .copied()
}

#[test]
fn a_route_is_found_by_its_host_and_others_stay() {
    let t = table(&[
        route("first", vec![rule(&["first.com"], &[], &[])]),
        route("second", vec![rule(&["second.com"], &[], &[])]),
    ]);
    assert_eq!(lookup(&t, "first.com", "", &[]), Some("first"));
    assert_eq!(lookup(&t, "second.com", "/", &[]), Some("second"));
    assert_eq!(lookup(&t, "third.com", "/", &[]), None);
}

#[test]
fn the_older_route_wins_whatever_the_order_it_came_in() {
    let older = || Route {
        name: "older",
        namespace: "",
        created: 100,
        rules: vec![rule(&["example.com"], &[], &[])],
    };
    let newer = || Route {
        name: "newer",
        namespace: "",
        created: 3700,
        rules: vec![rule(&["example.com"], &[], &[])],
    };
    assert_eq!(
        lookup(&table(&[older(), newer()]), "example.com", "", &[]),
        Some("older")
    );
    assert_eq!(
        lookup(&table(&[newer(), older()]), "example.com", "", &[]),
        Some("older")
    );
    let with_header = |name, created| Route {
        name,
        namespace: "",
        created,
        rules: vec![rule(
            &["example.com"],
            &[],
            &[("X-Custom-Header", Some("value"))],
        )],
    };
    let t = table(&[
        with_header("newer-with-headers", 3700),
        with_header("older-with-headers", 100),
    ]);
    assert_eq!(
        lookup(&t, "example.com", "", &[("X-Custom-Header", "value")]),
        Some("older-with-headers")
    );
}

#[test]
fn equal_routes_of_the_same_age_go_by_namespace_then_name_descending() {
    let r = |namespace, name| Route {
        name,
        namespace,
        created: 5,
        rules: vec![rule(&["example.com"], &[], &[])],
    };
    let t = table(&[r("a", "zeta"), r("b", "alpha"), r("b", "beta")]);
    assert_eq!(lookup(&t, "example.com", "/", &[]), Some("beta"));
}

#[test]
fn headers_choose_among_routes_of_one_host_and_prefix() {
    let t = table(&[
        route(
            "foo",
            vec![rule(
                &["example.com"],
                &["/api/"],
                &[("X-Custom-Header", Some("foo"))],
            )],
        ),
        route(
            "different-path",
            vec![rule(
                &["example.com"],
                &["/other/"],
                &[("X-Custom-Header", Some("foo"))],
            )],
        ),
        route(
            "bar",
            vec![rule(
                &["example.com"],
                &["/api/"],
                &[("X-Custom-Header", Some("bar"))],
            )],
        ),
        route("baz", vec![rule(&["example.com"], &["/api/"], &[])]),
        route(
            "header-key-only",
            vec![rule(
                &["example.com"],
                &["/api/"],
                &[("X-Custom-Header", None)],
            )],
        ),
        route(
            "many-headers",
            vec![rule(
                &["example.com"],
                &["/api/"],
                &[
                    ("X-Custom-Header", Some("foo")),
                    ("X-Another-Header", Some("baz")),
                ],
            )],
        ),
        route(
            "many-headers-but-key-only",
            vec![rule(
                &["example.com"],
                &["/api/"],
                &[("X-Custom-Header", None), ("X-Another-Header", Some("baz"))],
            )],
        ),
    ]);
    /// What a row says, the request's headers and path, and the route it should reach.
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, Option<&'a str>);
    let rows: &[Row] = &[
        (
            "matches foo header",
            &[("X-Custom-Header", "foo")],
            "/api/v1/resource",
            Some("foo"),
        ),
        (
            "matches bar header",
            &[("X-Custom-Header", "bar")],
            "/api/v1/resource",
            Some("bar"),
        ),
        (
            "random headers: the route without header requirements",
            &[("X-Other-Header", "value")],
            "/api/v1/resource",
            Some("baz"),
        ),
        ("no header", &[], "/api/v1/resource", Some("baz")),
        (
            "different path",
            &[("X-Custom-Header", "foo")],
            "/other/resource",
            Some("different-path"),
        ),
        (
            "header key only matches any value",
            &[("X-Custom-Header", "any-value")],
            "/api/v1/resource",
            Some("header-key-only"),
        ),
        (
            "no match",
            &[("X-Custom-Header", "non-matching")],
            "/other/resource",
            None,
        ),
        (
            "matches many headers",
            &[("X-Custom-Header", "foo"), ("X-Another-Header", "baz")],
            "/api/v1/resource",
            Some("many-headers"),
        ),
        (
            "header names in any case, a value among several lines",
            &[
                ("x-custom-header", "other"),
                ("X-CUSTOM-HEADER", "foo"),
                ("x-another-header", "baz"),
            ],
            "/api/v1/resource",
            Some("many-headers"),
        ),
    ];
    for (name, headers, path, want) in rows {
        assert_eq!(lookup(&t, "example.com", path, headers), *want, "{name}");
    }
}

#[test]
fn an_empty_value_is_a_value() {
    let t = table(&[route(
        "empty",
        vec![rule(&["example.com"], &[], &[("X-Empty", Some(""))])],
    )]);
    assert_eq!(
        lookup(&t, "example.com", "/", &[("X-Empty", "")]),
        Some("empty")
    );
    assert_eq!(lookup(&t, "example.com", "/", &[("X-Empty", "x")]), None);
    assert_eq!(lookup(&t, "example.com", "/", &[]), None);
}

#[test]
fn paths_match_by_whole_segments_and_the_longest_prefix_wins() {
    let test = route("test", vec![rule(&["example.com"], &[], &[])]);
    let api = || route("api", vec![rule(&["example.com"], &["/api/"], &[])]);
    let root = route("root", vec![rule(&["example.com"], &["/"], &[])]);
    assert_eq!(lookup(&table(&[test]), "other.com", "/", &[]), None);
    let t = table(&[route("test", vec![rule(&["example.com"], &[], &[])])]);
    assert_eq!(lookup(&t, "example.com", "/any/path", &[]), Some("test"));
    let t = table(&[api()]);
    assert_eq!(lookup(&t, "example.com", "/api/v1/users", &[]), Some("api"));
    assert_eq!(lookup(&t, "example.com", "/api", &[]), Some("api"));
    assert_eq!(lookup(&t, "example.com", "/other/path", &[]), None);
    assert_eq!(lookup(&t, "example.com", "/apiv2", &[]), None);
    assert_eq!(lookup(&t, "example.com", "/", &[]), None);
    let t = table(&[root, api()]);
    assert_eq!(lookup(&t, "example.com", "/api/v1", &[]), Some("api"));
    assert_eq!(lookup(&t, "example.com", "/apiv2", &[]), Some("root"));
    assert_eq!(lookup(&t, "example.com", "", &[]), Some("root"));
}

#[test]
fn only_the_longest_prefix_is_tried_then_the_next_host_form() {
    // The add-on's quirk: a header miss at the longest prefix goes on to the wildcards, not to
    // a shorter prefix of the same host.
    let t = table(&[
        route(
            "api-v1",
            vec![rule(
                &["example.com"],
                &["/api"],
                &[("X-Version", Some("v1"))],
            )],
        ),
        route("root", vec![rule(&["example.com"], &["/"], &[])]),
        route("catch-all", vec![rule(&["*"], &[], &[])]),
    ]);
    assert_eq!(
        lookup(&t, "example.com", "/api/x", &[("X-Version", "v1")]),
        Some("api-v1")
    );
    assert_eq!(lookup(&t, "example.com", "/api/x", &[]), Some("catch-all"));
    assert_eq!(lookup(&t, "example.com", "/web", &[]), Some("root"));
}

#[test]
fn wildcards_cover_every_depth_and_the_most_specific_wins() {
    let wildcard = || route("wildcard-example", vec![rule(&["*.example.com"], &[], &[])]);
    let more_specific = || {
        route(
            "wildcard-bar-example",
            vec![rule(&["*.bar.example.com"], &[], &[])],
        )
    };
    let exact = || route("exact-foo", vec![rule(&["foo.example.com"], &[], &[])]);
    let catch_all = || route("catch-all", vec![rule(&["*"], &[], &[])]);
    let t = table(&[wildcard()]);
    assert_eq!(
        lookup(&t, "foo.example.com", "", &[]),
        Some("wildcard-example")
    );
    assert_eq!(
        lookup(&t, "a.b.example.com", "", &[]),
        Some("wildcard-example")
    );
    assert_eq!(
        lookup(&t, "a.b.c.example.com", "", &[]),
        Some("wildcard-example")
    );
    assert_eq!(lookup(&t, "foo.other.com", "", &[]), None);
    assert_eq!(lookup(&t, "example.com", "", &[]), None);
    for stored in [[wildcard(), exact()], [exact(), wildcard()]] {
        assert_eq!(
            lookup(&table(&stored), "foo.example.com", "", &[]),
            Some("exact-foo")
        );
    }
    let t = table(&[wildcard(), more_specific()]);
    assert_eq!(
        lookup(&t, "foo.bar.example.com", "", &[]),
        Some("wildcard-bar-example")
    );
    assert_eq!(
        lookup(&t, "foo.baz.example.com", "", &[]),
        Some("wildcard-example")
    );
    let t = table(&[catch_all(), wildcard()]);
    assert_eq!(
        lookup(&t, "bar.example.com", "", &[]),
        Some("wildcard-example")
    );
    assert_eq!(lookup(&t, "bar.other.com", "", &[]), Some("catch-all"));
}

#[test]
fn a_star_an_empty_host_and_no_hosts_are_all_catch_alls() {
    for (name, hosts) in [
        ("catch-all", &["*"][..]),
        ("empty-host", &[""]),
        ("nil-host", &[]),
    ] {
        let t = table(&[route(name, vec![rule(hosts, &[], &[])])]);
        for host in ["localhost", "foo.example.com", "", "[::1]:80"] {
            assert_eq!(lookup(&t, host, "/x", &[]), Some(name), "{name} {host}");
        }
    }
}

#[test]
fn wildcards_keep_their_paths() {
    let t = table(&[route(
        "wildcard-with-path",
        vec![rule(&["*.example.com"], &["/api/"], &[])],
    )]);
    assert_eq!(
        lookup(&t, "bar.example.com", "/api/v1/users", &[]),
        Some("wildcard-with-path")
    );
    assert_eq!(lookup(&t, "bar.example.com", "/other/", &[]), None);
}

#[test]
fn each_rule_of_a_route_matches_on_its_own() {
    let t = table(&[route(
        "multi-rule",
        vec![
            rule(&["alpha.example.com"], &["/api/"], &[]),
            rule(&["beta.example.com"], &[], &[]),
        ],
    )]);
    assert_eq!(
        lookup(&t, "alpha.example.com", "/api/v1/resource", &[]),
        Some("multi-rule")
    );
    assert_eq!(lookup(&t, "alpha.example.com", "/other/", &[]), None);
    assert_eq!(
        lookup(&t, "beta.example.com", "/anything", &[]),
        Some("multi-rule")
    );
    assert_eq!(
        lookup(&t, "gamma.example.com", "/api/v1/resource", &[]),
        None
    );

    let t = table(&[route(
        "multi-rule-headers",
        vec![
            rule(&["example.com"], &["/api/"], &[("X-Version", Some("v1"))]),
            rule(&["example.com"], &["/web/"], &[("X-Mode", Some("debug"))]),
        ],
    )]);
    let rows: &[(&str, (&str, &str), bool)] = &[
        ("/api/v1/resource", ("X-Version", "v1"), true),
        ("/api/v1/resource", ("X-Version", "v2"), false),
        ("/web/dashboard", ("X-Mode", "debug"), true),
        ("/web/dashboard", ("X-Mode", "prod"), false),
        ("/api/v1/resource", ("X-Mode", "debug"), false),
    ];
    for (path, header, matches) in rows {
        assert_eq!(
            lookup(&t, "example.com", path, &[*header]).is_some(),
            *matches,
            "{path} {header:?}"
        );
    }

    let t = table(&[route(
        "multi-rule-wildcard",
        vec![
            rule(&["exact.example.com"], &[], &[]),
            rule(&["*.wildcard.com"], &[], &[]),
        ],
    )]);
    for (host, matches) in [
        ("exact.example.com", true),
        ("foo.wildcard.com", true),
        ("bar.foo.wildcard.com", true),
        ("other.example.com", false),
    ] {
        assert_eq!(lookup(&t, host, "", &[]).is_some(), matches, "{host}");
    }
}

#[test]
fn ports_are_ignored_on_both_sides_and_hosts_keep_their_case() {
    let t = table(&[
        route("app", vec![rule(&["app.example.com:8080"], &[], &[])]),
        route("v6", vec![rule(&["[::1]:80"], &[], &[])]),
    ]);
    assert_eq!(lookup(&t, "app.example.com", "/", &[]), Some("app"));
    assert_eq!(lookup(&t, "app.example.com:9999", "/", &[]), Some("app"));
    assert_eq!(lookup(&t, "app.example.com:", "/", &[]), Some("app"));
    assert_eq!(lookup(&t, "[::1]:8080", "/", &[]), Some("v6"));
    assert_eq!(lookup(&t, "[::1]", "/", &[]), Some("v6"));
    assert_eq!(lookup(&t, "App.Example.com", "/", &[]), None);
}

#[test]
fn the_path_is_decoded_and_cut_before_the_query_as_go_reads_it() {
    let t = table(&[route(
        "api",
        vec![rule(&["example.com"], &["/api/v1"], &[])],
    )]);
    for (target, matches) in [
        ("/api/v1?x=/y", true),
        ("/api/v1#frag", true),
        ("/api%2Fv1/users", true),
        ("/%61pi/v1", true),
        ("/api?/v1", false),
        ("http://example.com/api/v1/x", true),
        ("HTTPS://other.com/api/v1", true),
        ("http://example.com", false),
        ("//api/v1//", true),
        // The add-on's keys keep inner slashes: `api//v1/` does not start with `api/v1/`.
        ("/api//v1", false),
        ("/api/v1%zz", false),
        ("/api/v1%", false),
    ] {
        assert_eq!(
            lookup(&t, "example.com", target, &[]).is_some(),
            matches,
            "{target}"
        );
    }
    assert_eq!(&*request_path(b"/a%2"), b"/a%2");
    assert_eq!(&*request_path(b"/%e2%82%ac"), "/€".as_bytes());
}

#[test]
fn an_empty_table_routes_nothing() {
    let t = table(&[]);
    assert!(t.is_empty());
    assert_eq!(lookup(&t, "example.com", "/", &[]), None);
}

/// The add-on's `pkg/routing/match_test.go` (its `main`, 0.16), row for row: one rule on its
/// own, as a static route is matched.
#[test]
fn one_rule_matches_a_request_as_the_add_ons_match_routing_rule() {
    /// A rule, the request's host, path and fields, and whether it matches.
    type Row = (
        Rule,
        &'static str,
        &'static str,
        &'static [(&'static str, &'static str)],
        bool,
    );
    let header = Some("header-value");
    let rows: &[Row] = &[
        (rule(&[], &[], &[]), "any.host", "/anything", &[], true),
        (rule(&[], &["/healthz"], &[]), "", "/healthz", &[], true),
        (rule(&[], &["/healthz"], &[]), "", "/other", &[], false),
        (
            rule(&["example.com"], &[], &[]),
            "example.com",
            "/",
            &[],
            true,
        ),
        (
            rule(&["example.com"], &[], &[]),
            "example.org",
            "/",
            &[],
            false,
        ),
        (
            rule(&[], &[], &[("Custom-Header", header)]),
            "",
            "/",
            &[("Custom-Header", "header-value")],
            true,
        ),
        (
            rule(&[], &[], &[("Custom-Header", header)]),
            "",
            "/",
            &[("Custom-Header", "not matching")],
            false,
        ),
        (
            rule(
                &["app.example.com"],
                &["/api"],
                &[("Custom-Header", header)],
            ),
            "app.example.com",
            "/api/v1",
            &[("Custom-Header", "header-value")],
            true,
        ),
        // RequestHost: the port goes.
        (
            rule(&["example.com"], &[], &[]),
            "example.com:8080",
            "/",
            &[],
            true,
        ),
    ];
    for (rule, host, path, headers, want) in rows {
        assert_eq!(
            rule.matches(host.as_bytes(), path.as_bytes(), *headers),
            *want,
            "{rule:?} {host} {path} {headers:?}"
        );
    }

    // MatchAnyHost.
    for (host, hosts, want) in [
        ("a.com", &["a.com"][..], true),
        ("b.com", &["a.com"], false),
        ("x.a.com", &["*.a.com"], true),
        ("a.com", &["*.a.com"], false),
        ("x.y.a.com", &["*.a.com"], true),
        ("anything", &["*"], true),
        ("anything", &[""], true),
        ("a.com", &["a.com", "b.com"], true),
        ("b.com", &["a.com", "b.com"], true),
        ("c.com", &["a.com", "b.com"], false),
    ] {
        let matched = rule(hosts, &[], &[]).matches(host.as_bytes(), b"/", &[][..]);
        assert_eq!(matched, want, "{host} {hosts:?}");
    }

    // MatchAnyPath.
    for (path, paths, want) in [
        ("/healthz", &["/healthz"][..], true),
        ("/api/v1", &["/api"], true),
        ("/healthz", &["/health"], false),
        ("/anything", &["/"], true),
        ("/healthz", &["/healthz/"], true),
        ("/readyz", &["/healthz", "/readyz"], true),
        ("/other", &["/healthz", "/readyz"], false),
        ("/healthz/", &["/healthz"], true),
        ("/anything", &[""], true),
    ] {
        let matched = rule(&[], paths, &[]).matches(b"a", path.as_bytes(), &[][..]);
        assert_eq!(matched, want, "{path} {paths:?}");
    }

    // MatchHeaders: every matcher, a key-only one by presence.
    let both = rule(
        &[],
        &[],
        &[
            ("Required-Header", Some("expected")),
            ("Key-Only-Header", None),
        ],
    );
    for (headers, want) in [
        (
            &[
                ("Required-Header", "expected"),
                ("Key-Only-Header", "any-value"),
            ][..],
            true,
        ),
        (&[("Key-Only-Header", "any-value")], false),
        (&[("Required-Header", "expected")], false),
        (
            &[
                ("Required-Header", "wrong"),
                ("Key-Only-Header", "any-value"),
            ],
            false,
        ),
        (
            &[("Required-Header", "expected"), ("Key-Only-Header", "")],
            true,
        ),
        (&[], false),
        (
            &[
                ("Required-Header", "expected"),
                ("Key-Only-Header", "any-value"),
                ("Extra-Header", "extra"),
            ],
            true,
        ),
    ] {
        assert_eq!(both.matches(b"a", b"/", headers), want, "{headers:?}");
    }
}
