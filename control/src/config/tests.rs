use super::*;

const EXAMPLE: &str = r#"
[listen]
http = "127.0.0.1:18012"
admin = "127.0.0.1:19090"

[features]
"queueproxy.pod-authority" = "Enabled"

[[revisions]]
namespace = "default"
name = "hello-00001"
service = "hello"
container_concurrency = 2
timeout_seconds = 30
idle_timeout_seconds = 5
pods = ["127.0.0.1:8081", "[::1]:8082"]
"#;

#[test]
fn a_full_file_parses_with_defaults_filled_in() {
    let config = Config::parse(EXAMPLE).unwrap();
    assert_eq!(config.listen.http, "127.0.0.1:18012".parse().unwrap());
    assert_eq!(config.features["queueproxy.pod-authority"], "Enabled");
    let revision = &config.revisions[0];
    assert_eq!(revision.pods.len(), 2);
    assert_eq!(
        revision.lb_policy(),
        LbPolicy::FirstAvailable,
        "CC 2 defaults to first-available"
    );
    assert_eq!(revision.timeouts().total, Duration::from_secs(30));
    assert_eq!(revision.timeouts().idle, Some(Duration::from_secs(5)));
    assert_eq!(revision.timeouts().response_start, None);
    assert_eq!(config.proxy.drain_grace_seconds, 45);
}

#[test]
fn a_revisions_priority_table_turns_the_policy_on_and_bad_values_name_their_key() {
    let revision = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\n";
    let parse = |priority: &str| Config::parse(&format!("{revision}{priority}"));
    let off = parse("").unwrap();
    assert_eq!(off.revisions[0].priority_policy(), None, "off by default");
    let on = parse("[revisions.priority]\n").unwrap();
    assert_eq!(
        on.revisions[0].priority_policy(),
        Some(PriorityPolicy::default()),
        "the table alone: the defaults"
    );
    let set = parse(
        "[revisions.priority]\nbands = 5\npriority_header = \"X-Prio\"\ntenant_header = \"X-Org\"\n",
    )
    .unwrap();
    assert_eq!(
        set.revisions[0].priority_policy(),
        Some(PriorityPolicy {
            bands: 5,
            default_band: 2,
            priority_header: "X-Prio".into(),
            tenant_header: "X-Org".into(),
            ..PriorityPolicy::default()
        })
    );
    let trust = parse(
        "[revisions.priority]\npriority_header_trusted = true\n[revisions.priority.tenant_bands]\npremium = 2\n\"big co\" = 0\n",
    )
    .unwrap();
    assert_eq!(
        trust.revisions[0].priority_policy(),
        Some(PriorityPolicy {
            trusted: true,
            tenant_bands: vec![("big co".into(), 0), ("premium".into(), 2)],
            ..PriorityPolicy::default()
        })
    );
    let disabled = parse("[revisions.priority]\nenabled = false\nbands = 2\n").unwrap();
    assert_eq!(disabled.revisions[0].priority_policy(), None);
    // (the table's body, the line the error points at, words the message must have)
    let refused: &[(&str, usize, &str)] = &[
        ("bands = 0\n", 5, "priority.bands"),
        ("bands = 17\n", 5, "priority.bands"),
        ("bands = 300\n", 5, "300"),
        ("bands = 2\ndefault_band = 2\n", 6, "priority.default_band"),
        ("default_band = 2\nbands = 2\n", 5, "priority.default_band"),
        (
            "priority_header = \"K Priority\"\n",
            5,
            "priority.priority_header",
        ),
        ("tenant_header = \"\"\n", 5, "priority.tenant_header"),
        ("enabled = false\nbands = 0\n", 6, "priority.bands"),
        ("band = 2\n", 5, "band"),
    ];
    for &(body, line, words) in refused {
        let error = parse(&format!("[revisions.priority]\n{body}")).unwrap_err();
        assert!(error.message.contains(words), "{body:?}: {error}");
        assert_eq!(
            error.position.map(|(at, _)| at),
            Some(line),
            "{body:?}: {error}"
        );
    }
}

#[test]
fn an_empty_file_is_a_valid_config_with_defaults() {
    let config = Config::parse("").unwrap();
    assert_eq!(config.listen.http, "[::]:8012".parse().unwrap());
    assert!(config.revisions.is_empty());
}

#[test]
fn syntax_errors_name_line_and_column() {
    let error = Config::parse("[listen]\nhttp = \"127.0.0.1:80\"\nadmin = \n").unwrap_err();
    assert_eq!(error.position.map(|(line, _)| line), Some(3), "{error}");
}

#[test]
fn the_data_ports_clash_where_the_file_sets_one_of_them() {
    // `http` set to `http2`'s default: the file only names `http`.
    let error = Config::parse("[listen]\nhttp = \"0.0.0.0:8013\"\n").unwrap_err();
    assert_eq!(error.position, Some((2, 8)), "{error}");
    let error = Config::parse("[listen]\nhttp = \"[::]:8013\"\n").unwrap_err();
    assert_eq!(error.position, Some((2, 8)), "{error}");
    // Explicit addresses of their own may share a port.
    Config::parse("[listen]\nhttp = \"127.0.0.1:1\"\nhttp2 = \"127.0.0.2:1\"\n").unwrap();
    let error =
        Config::parse("[listen]\nhttp = \"127.0.0.1:1\"\nhttp2 = \"127.0.0.1:1\"\n").unwrap_err();
    assert_eq!(error.position, Some((3, 9)), "{error}");
}

#[test]
fn a_file_that_is_not_utf8_is_refused_at_the_first_bad_byte() {
    let path =
        std::env::temp_dir().join(format!("kactivator-not-utf8-{}.toml", std::process::id()));
    std::fs::write(&path, b"[listen]\nhttp = \"\xff\"\n").unwrap();
    let error = Config::load(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(error.position, Some((2, 9)), "{error}");
    assert_eq!(
        error.source.as_deref(),
        Some(path.display().to_string().as_str())
    );
}

#[test]
fn bad_addresses_and_unknown_keys_are_rejected_where_they_are() {
    let error = Config::parse(
        "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\npods = [\"not-an-address\"]\n",
    )
    .unwrap_err();
    assert_eq!(error.position.map(|(line, _)| line), Some(4), "{error}");
    let error =
        Config::parse("[[revisions]]\nnamespace = \"a\"\nname = \"b\"\ncontainer_concurency = 1\n")
            .unwrap_err();
    assert!(error.message.contains("container_concurency"), "{error}");
    assert_eq!(error.position.map(|(line, _)| line), Some(4), "{error}");
}

#[test]
fn duplicate_revisions_and_bad_names_are_rejected() {
    let twice = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\n[[revisions]]\nnamespace = \"a\"\nname = \"b\"\n";
    assert!(Config::parse(twice)
        .unwrap_err()
        .message
        .contains("declared twice"));
    let slash = "[[revisions]]\nnamespace = \"a/b\"\nname = \"c\"\n";
    assert!(Config::parse(slash)
        .unwrap_err()
        .message
        .contains("without '/'"));
}

#[test]
fn unknown_protocols_and_policies_are_rejected() {
    let bad = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nprotocol = \"h3\"\n";
    let (position, message) = error_at(bad);
    assert_eq!(position, Some((4, 12)), "{message}");
    assert!(
        message.contains("\"h3\"") && message.contains("\"http1\"") && message.contains("h2c"),
        "an unknown protocol names the known ones: {message}"
    );
    let bad =
        "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nload_balancing_policy = \"random\"\n";
    assert!(Config::parse(bad).is_err());
}

/// Line and column the error for `text` points at, and its message.
fn error_at(text: &str) -> (Option<(usize, usize)>, String) {
    let error = Config::parse(text).expect_err("the file is invalid");
    (error.position, error.message)
}

#[test]
fn a_zero_timeout_is_found_on_its_own_line_not_in_longer_keys_ending_the_same() {
    let text = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nidle_timeout_seconds = 5\n\
                response_start_timeout_seconds = 5\ntimeout_seconds = 0\n";
    let (position, message) = error_at(text);
    assert_eq!(position, Some((6, 19)), "{message}");
    assert!(message.contains("timeout_seconds"), "{message}");
}

#[test]
fn a_zero_timeout_in_the_second_revision_is_found_in_the_second_revision() {
    let text = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\ntimeout_seconds = 30\n\n\
                [[revisions]]\nnamespace = \"a\"\nname = \"c\"\ntimeout_seconds = 0\n";
    let (position, message) = error_at(text);
    assert_eq!(position, Some((9, 19)), "{message}");
    assert!(message.contains("a/c"), "{message}");
}

#[test]
fn a_duplicate_revision_is_found_at_its_second_name_not_where_the_text_first_appears() {
    let text = "# \"hello\" is declared twice below\n\
                [[revisions]]\nnamespace = \"hello\"\nname = \"hello\"\n\n\
                [[revisions]]\nnamespace = \"hello\"\nname = \"hello\"\n";
    let (position, message) = error_at(text);
    assert_eq!(position, Some((8, 8)), "{message}");
    assert!(message.contains("declared twice"), "{message}");
}

#[test]
fn an_invalid_namespace_is_found_in_its_revision_not_in_an_earlier_table() {
    let text = "[features]\n\"queueproxy.pod-authority\" = \"team/x\"\n\n\
                [[revisions]]\nnamespace = \"team/x\"\nname = \"b\"\n";
    let (position, message) = error_at(text);
    assert_eq!(position, Some((5, 13)), "{message}");
    assert!(message.contains("namespace"), "{message}");
}

#[test]
fn h2c_revisions_load_and_http2_settings_are_checked() {
    let text = "[[revisions]]\nnamespace = \"default\"\nname = \"web\"\nprotocol = \"http1\"\n\n\
                [[revisions]]\nnamespace = \"default\"\nname = \"hello\"\nprotocol = \"h2c\"\n";
    let config = Config::parse(text).expect("h2c is a protocol like http1");
    assert_eq!(config.revisions[1].protocol, ProtocolName::H2c);

    let window = "[proxy]\nh2_stream_window_bytes = 1000\n";
    let (position, message) = error_at(window);
    assert_eq!(position, Some((2, 26)), "{message}");
    assert_eq!(
        message,
        "proxy.h2_stream_window_bytes must be between 65535 and 2147483647"
    );
    let frame = "[proxy]\nh2_max_frame_bytes = 16777216\n";
    assert!(error_at(frame).1.contains("h2_max_frame_bytes"));
    let streams = "[proxy]\nh2_max_concurrent_streams = 0\n";
    assert!(error_at(streams).1.contains("at least 1"));
    let same = "[listen]\nhttp = \"127.0.0.1:8012\"\nhttp2 = \"127.0.0.1:8012\"\n";
    let (position, message) = error_at(same);
    assert_eq!(position, Some((3, 9)), "{message}");
    assert!(message.contains("must differ"), "{message}");
}

#[test]
fn every_validation_error_points_at_the_value_it_is_about() {
    // (file, line and column of the offending value, a fragment of the message). Each file
    // mentions the key (or value) earlier too, where a text search would have found it.
    let cases: &[(&str, (usize, usize), &str)] = &[
        (
            "# qp_freshness_seconds = 90 would be wrong\n[control]\n\
             qp_staleness_seconds = 80\nqp_freshness_seconds = 90\n",
            (4, 24),
            "control.qp_freshness_seconds",
        ),
        (
            "# qp_staleness_seconds below the default freshness\n[control]\n\
             qp_staleness_seconds = 10\n",
            (3, 24),
            "control.qp_staleness_seconds",
        ),
        (
            "# watch_interval_ms = 0 is refused\n[control]\nwatch_interval_ms = 0\n",
            (3, 21),
            "control.watch_interval_ms",
        ),
        (
            "# state_queue_capacity = 0\n[control]\nstate_queue_capacity = 0\n",
            (3, 24),
            "control.state_queue_capacity",
        ),
        (
            "[control]\n# stale_sweep_seconds\nstale_sweep_seconds = 0\n",
            (3, 23),
            "control.stale_sweep_seconds",
        ),
        (
            "# probe_interval_ms\n[health]\nprobe_interval_ms = 0\n",
            (3, 21),
            "health.probe_interval_ms",
        ),
        (
            "# probe_timeout_ms\n[health]\nprobe_timeout_ms = 0\n",
            (3, 20),
            "health.probe_timeout_ms",
        ),
        (
            "[[revisions]]\nnamespace = \"a\"\nname = \"has space\"\n",
            (3, 8),
            "name",
        ),
        (
            "[[revisions]]\nnamespace = \"\"\nname = \"b\"\n",
            (2, 13),
            "namespace",
        ),
        (
            "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nservice = \"b\"\n\
             [[revisions]]\nname = \"b\"\nnamespace = \"a\"\n",
            (6, 8),
            "declared twice",
        ),
        (
            "revisions = [\n  { namespace = \"a\", name = \"b\", timeout_seconds = 0 },\n]\n",
            (2, 52),
            "timeout_seconds",
        ),
    ];
    for (text, expected, fragment) in cases {
        let (position, message) = error_at(text);
        assert_eq!(position, Some(*expected), "{message}\n{text}");
        assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
    }
}

#[test]
fn defaults_come_from_their_constants_and_agree_with_the_consumers_defaults() {
    use crate::pod_state::{Windows, DEFAULT_QP_FRESHNESS, DEFAULT_QP_STALENESS};
    use crate::state::{
        Limits, DEFAULT_H2C_SERVING_PORT, DEFAULT_MAX_TRACKERS_PER_REVISION, DEFAULT_SERVING_PORT,
    };
    use kactivator_shards::request::identity::{detect_cluster_domain, DEFAULT_CLUSTER_DOMAIN};
    use kactivator_shards::routing::{DEFAULT_QUEUE_DEPTH, DEFAULT_TIMEOUT};
    use kactivator_shards::shard::ShardSettings;
    use kactivator_shards::upstream::pool::{
        PoolConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_IDLE_PER_POD,
    };

    let config = Config::parse("").unwrap();
    assert_eq!(
        config,
        Config::default(),
        "an empty file is the default config"
    );

    assert_eq!(config.listen.http, DEFAULT_HTTP);
    assert_eq!(config.listen.admin, DEFAULT_ADMIN);

    // [proxy], and what the shards fall back to without a file.
    let proxy = &config.proxy;
    let pool = PoolConfig::default();
    assert_eq!(proxy.cluster_domain, None, "detected at start");
    assert_eq!(detect_cluster_domain(None, None), DEFAULT_CLUSTER_DOMAIN);
    assert_eq!(
        ShardSettings::default().cluster_domain,
        DEFAULT_CLUSTER_DOMAIN
    );
    let connect_timeout = Duration::from_millis(proxy.connect_timeout_ms);
    assert_eq!(connect_timeout, DEFAULT_CONNECT_TIMEOUT);
    assert_eq!(pool.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
    let idle_timeout = Duration::from_secs(proxy.upstream_idle_timeout_seconds);
    assert_eq!(idle_timeout, DEFAULT_IDLE_TIMEOUT);
    assert_eq!(pool.idle_timeout, DEFAULT_IDLE_TIMEOUT);
    assert_eq!(proxy.max_idle_per_pod, DEFAULT_MAX_IDLE_PER_POD);
    assert_eq!(pool.max_idle_per_pod, DEFAULT_MAX_IDLE_PER_POD);
    assert_eq!(proxy.drain_grace_seconds, DEFAULT_DRAIN_GRACE_SECONDS);
    assert_eq!(proxy.max_queued_requests, DEFAULT_MAX_QUEUED_REQUESTS);
    assert_eq!(
        proxy.max_connections_per_shard,
        DEFAULT_MAX_CONNECTIONS_PER_SHARD
    );
    assert_eq!(
        ShardSettings::default().max_connections,
        DEFAULT_MAX_CONNECTIONS_PER_SHARD
    );
    assert_eq!(
        proxy.max_pending_heads_per_shard,
        DEFAULT_MAX_PENDING_HEADS_PER_SHARD
    );
    assert_eq!(
        ShardSettings::default().max_pending_heads,
        DEFAULT_MAX_PENDING_HEADS_PER_SHARD
    );
    assert_eq!(proxy.h2(), ShardSettings::default().h2);
    assert_eq!(config.listen.http2, DEFAULT_HTTP2);

    // [control], and the state worker's own defaults.
    let control = &config.control;
    let limits = Limits::default();
    assert_eq!(control.watch_interval_ms, DEFAULT_WATCH_INTERVAL_MS);
    assert_eq!(control.state_queue_capacity, DEFAULT_QUEUE_CAPACITY);
    assert_eq!(
        control.max_trackers_per_revision,
        DEFAULT_MAX_TRACKERS_PER_REVISION
    );
    assert_eq!(
        limits.max_trackers_per_revision,
        DEFAULT_MAX_TRACKERS_PER_REVISION
    );
    let windows = Windows {
        qp_freshness: Duration::from_secs(control.qp_freshness_seconds),
        qp_staleness: Duration::from_secs(control.qp_staleness_seconds),
    };
    assert_eq!(windows.qp_freshness, DEFAULT_QP_FRESHNESS);
    assert_eq!(windows.qp_staleness, DEFAULT_QP_STALENESS);
    assert_eq!(windows, Windows::default());
    assert_eq!(limits.windows, Windows::default());
    assert_eq!(control.stale_sweep_seconds, DEFAULT_STALE_SWEEP_SECONDS);

    assert_eq!(config.health.probe_interval_ms, DEFAULT_PROBE_INTERVAL_MS);
    assert_eq!(config.health.probe_timeout_ms, DEFAULT_PROBE_TIMEOUT_MS);
    assert_eq!(
        config.health.settled_probe_interval_ms,
        DEFAULT_SETTLED_PROBE_INTERVAL_MS
    );
    assert_eq!(
        config.health.probe_budget_per_second,
        DEFAULT_PROBE_BUDGET_PER_SECOND
    );

    // A revision that sets only what it must, parsed and built in code.
    let parsed = Config::parse("[[revisions]]\nnamespace = \"a\"\nname = \"b\"\n").unwrap();
    let revision = &parsed.revisions[0];
    assert_eq!(*revision, RevisionConfig::new("a", "b"));
    assert_eq!(
        Duration::from_secs(revision.timeout_seconds),
        DEFAULT_TIMEOUT
    );
    assert_eq!(revision.timeouts(), Timeouts::default());
    assert_eq!(revision.queue_depth, DEFAULT_QUEUE_DEPTH);
    assert_eq!(revision.serving_port(), DEFAULT_SERVING_PORT);
    let h2c = RevisionConfig {
        protocol: ProtocolName::H2c,
        ..RevisionConfig::new("a", "b")
    };
    assert_eq!(h2c.serving_port(), DEFAULT_H2C_SERVING_PORT);
}

#[test]
fn the_readme_example_states_the_defaults() {
    use kactivator_shards::request::identity::DEFAULT_CLUSTER_DOMAIN;

    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("## Configuration file").expect("the section")..];
    let start = section.find("```toml\n").expect("the example") + "```toml\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    // The defaults it shows commented out, to be read as well.
    let example = example
        .replace("# cluster_domain =", "cluster_domain =")
        .replace("# serving_port =", "serving_port =")
        .replace("# max_queued_requests =", "max_queued_requests =")
        .replace(
            "# max_connections_per_shard =",
            "max_connections_per_shard =",
        )
        .replace(
            "# max_pending_heads_per_shard =",
            "max_pending_heads_per_shard =",
        );
    let config = Config::parse(&example).unwrap_or_else(|error| panic!("{error}"));

    assert_eq!(config.listen, Listen::default());
    assert_eq!(
        config.proxy,
        ProxySettings {
            cluster_domain: Some(DEFAULT_CLUSTER_DOMAIN.into()),
            // It sets them (to their defaults), so the memory budget keeps them.
            explicit_caps: ExplicitCaps {
                max_connections_per_shard: true,
                max_pending_heads_per_shard: true,
                max_queued_requests: true,
            },
            ..ProxySettings::default()
        }
    );
    assert_eq!(config.control, ControlSettings::default());
    assert_eq!(config.health, HealthSettings::default());
    let revision = &config.revisions[0];
    let defaults = RevisionConfig::new(&revision.namespace, &revision.name);
    assert_eq!(
        *revision,
        RevisionConfig {
            service: revision.service.clone(),
            configuration: revision.configuration.clone(),
            serving_port: Some(defaults.serving_port()),
            pods: revision.pods.clone(),
            ..defaults
        }
    );

    // The command-line table's defaults for the settings the file also has.
    let row = |flag: &str| {
        readme
            .lines()
            .find(|line| line.starts_with(&format!("| `{flag}")))
            .unwrap_or_else(|| panic!("no README row for {flag}"))
    };
    assert!(row("--http").contains(&format!("`{DEFAULT_HTTP}`")));
    assert!(row("--admin").contains(&format!("`{DEFAULT_ADMIN}`")));
    assert!(row("--drain-grace-seconds").contains(&format!("| {DEFAULT_DRAIN_GRACE_SECONDS} |")));
    let cluster_domain = readme
        .lines()
        .find(|line| line.contains("`CLUSTER_DOMAIN`"))
        .expect("the CLUSTER_DOMAIN row");
    assert!(cluster_domain.contains(&format!("`{DEFAULT_CLUSTER_DOMAIN}`")));
}

#[test]
fn the_autoscaler_url_must_be_a_plain_websocket_address() {
    let with = |url: &str| Config::parse(&format!("[autoscaler]\nurl = \"{url}\"\n"));
    let config = with("ws://autoscaler.knative-serving.svc.cluster.local:8080").unwrap();
    assert_eq!(
        config.autoscaler.url.as_deref(),
        Some("ws://autoscaler.knative-serving.svc.cluster.local:8080")
    );
    for bad in [
        "http://autoscaler:8080",
        "wss://autoscaler:8080",
        "ws://",
        "not a url",
    ] {
        let error = with(bad).unwrap_err();
        assert!(
            error.message.starts_with("autoscaler.url:"),
            "{bad}: {error}"
        );
        assert_eq!(
            error.position.map(|(line, _)| line),
            Some(2),
            "{bad}: {error}"
        );
    }
    assert_eq!(Config::parse("").unwrap().autoscaler.url, None);
}

#[test]
fn load_errors_carry_the_file_name() {
    let error = Config::load(Path::new("/nonexistent/kactivator.toml")).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("/nonexistent/kactivator.toml: cannot read"),
        "{error}"
    );
}

#[test]
fn the_readmes_tls_example_reads_with_the_documented_defaults() {
    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("## Configuration file").expect("the section")..];
    let start = section.find("# https = ").expect("the https line");
    let end = start + section[start..].find("\n\n").expect("the end of [listen]");
    let lines: String = section[start..end]
        .lines()
        .map(|line| format!("{}\n", line.trim_start_matches("# ")))
        .collect();
    let config = Config::parse(&format!("[listen]\n{lines}")).unwrap_or_else(|e| panic!("{e}"));
    let tls = config.listen.tls.expect("[listen.tls]");
    assert_eq!(config.listen.https, Some(reactor::any_address(8112)));
    assert_eq!(tls.reload_seconds, DEFAULT_TLS_RELOAD_SECONDS);
    assert_eq!(tls.alpn, crate::tls::SERVER_ALPN);
    assert!(tls.client_certificate_required);
    let settings = tls.settings();
    assert!(settings.problems.is_empty(), "{:?}", settings.problems);
    assert_eq!(settings.min_version, Some(crate::tls::TlsVersion::Tls13));
    assert!(settings.cipher_suites.is_empty() && settings.curve_preferences.is_empty());
}

#[test]
fn the_tls_port_needs_its_table_a_port_of_its_own_and_settings_in_gos_words() {
    let tls = "[listen.tls]\ncertificates = [{ chain = \"a.crt\", key = \"a.key\" }]\n";
    // `https` alone is for start-up to judge (watching a cluster with system-internal-tls,
    // the certificates come from its Secret).
    assert!(Config::parse("[listen]\nhttps = \"127.0.0.1:8443\"\n").is_ok());
    let refused = [
        (
            "[listen]\nhttps = \"[::]:8012\"\n".to_string(),
            "listen.https must differ from listen.http",
        ),
        (tls.to_string(), "without listen.https"),
        (
            format!("[listen]\nhttps = \"[::]:8012\"\n{tls}"),
            "listen.https must differ from listen.http",
        ),
        (
            "[listen]\nhttps = \"[::]:8443\"\n[listen.tls]\ncertificates = []\n".to_string(),
            "at least one",
        ),
        (
            format!("[listen]\nhttps = \"[::]:8443\"\n{tls}min_version = \"1.1\"\n"),
            "listen.tls.min_version: \"1.1\" is not a TLS version",
        ),
        (
            format!("[listen]\nhttps = \"[::]:8443\"\n{tls}curve_preferences = [\"brainpool\"]\n"),
            "unknown curve",
        ),
        (
            format!("[listen]\nhttps = \"[::]:8443\"\n{tls}reload_seconds = 0\n"),
            "reload_seconds",
        ),
        (
            format!("[listen]\nhttps = \"[::]:8443\"\n{tls}alpn = [\"h3\"]\n"),
            "listen.tls.alpn",
        ),
        (
            format!("[listen]\nhttps = \"[::]:8443\"\n{tls}alpn = []\n"),
            "listen.tls.alpn",
        ),
        (
            format!("[listen]\nhttps = \"[::]:8443\"\n{tls}ciphers = []\n"),
            "unknown field `ciphers`",
        ),
    ];
    for (text, said) in refused {
        let error = Config::parse(&text).expect_err(said).to_string();
        assert!(error.contains(said), "{said}: {error}");
    }
    let config = Config::parse(&format!(
        "[listen]\nhttps = \"[::]:8443\"\n{tls}cipher_suites = [\"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\"]\nmin_version = \"1.2\"\n"
    ))
    .unwrap();
    let settings = config.listen.tls.unwrap().settings();
    assert_eq!(
        settings.cipher_suites,
        ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]
    );
    assert_eq!(settings.min_version, Some(crate::tls::TlsVersion::Tls12));
}

#[test]
fn revision_tls_loads_with_quarantine_on_and_needs_a_ca_that_loads() {
    let dir = std::env::temp_dir().join(format!("kactivator-revision-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let revision = |ca: &std::path::Path| {
        format!(
            "[[revisions]]\nnamespace = \"d\"\nname = \"r\"\n[revisions.tls]\nca = {:?}\nserver_name = \"data-plane.knative.dev\"\nrequire_name = \"kn-user-d\"\n",
            ca.display().to_string()
        )
    };
    // Quarantine on (the default, and said): the prober speaks the revision's TLS.
    let on = "[features]\n\"activator.pod-quarantine\" = \"enabled\"\n";
    let file = dir.join("kactivator.toml");
    for features in ["", on] {
        std::fs::write(&file, format!("{features}{}", revision(&ca_file))).unwrap();
        let config = Config::load(&file).unwrap();
        assert!(config.revisions[0].tls.as_ref().unwrap().loaded.is_some());
    }
    let config = Config::load(&file).unwrap();
    let tls = config.revisions[0].tls.as_ref().unwrap();
    assert_eq!(
        tls.loaded.as_ref().map(|pod| &*pod.ca_pem),
        Some(ca.pem().as_bytes())
    );
    let spec = crate::sources::file::revision_spec(&config.revisions[0]).unwrap();
    assert_eq!(
        spec.tls.as_ref().map(|tls| tls.require_name.as_deref()),
        Some(Some("kn-user-d"))
    );

    // A CA file that does not read or parse refuses the file, naming the revision.
    std::fs::write(&file, format!("{on}{}", revision(&dir.join("missing.pem")))).unwrap();
    let error = Config::load(&file).unwrap_err().to_string();
    assert!(
        error.contains("revision d/r: tls.ca") && error.contains("cannot read"),
        "{error}"
    );
    std::fs::write(
        dir.join("bad.pem"),
        "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(&file, format!("{on}{}", revision(&dir.join("bad.pem")))).unwrap();
    assert!(Config::load(&file).is_err());
    // Parsed without loading, a TLS revision has no CA bytes and is not applied (never plain).
    let parsed = Config::parse(&format!("{on}{}", revision(&ca_file))).unwrap();
    assert!(crate::sources::file::revision_spec(&parsed.revisions[0]).is_none());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_tracing_table_reads_with_config_observabilitys_meanings_and_a_default_rate_of_one() {
    assert_eq!(
        Config::parse("").unwrap().tracing_config(),
        TracingConfig::OFF
    );
    let with = |table: &str| Config::parse(&format!("[tracing]\n{table}"));
    let grpc = with("protocol = \"grpc\"\nendpoint = \"http://otel-collector:4317\"\n").unwrap();
    assert_eq!(
        grpc.tracing_config(),
        TracingConfig {
            protocol: TraceProtocol::Grpc,
            endpoint: "http://otel-collector:4317".into(),
            sampling_rate: DEFAULT_SAMPLING_RATE,
        }
    );
    assert_eq!(DEFAULT_SAMPLING_RATE, 1.0);
    for (table, protocol, endpoint, rate) in [
        (
            "protocol = \"http/protobuf\"\nendpoint = \"http://otel:4318/v1/traces\"\nsampling_rate = 0.25\n",
            TraceProtocol::HttpProtobuf,
            "http://otel:4318/v1/traces",
            0.25,
        ),
        (
            "protocol = \"grpc\"\nendpoint = \"http://otel:4317\"\nsampling_rate = 0\n",
            TraceProtocol::Grpc,
            "http://otel:4317",
            0.0,
        ),
        (
            "protocol = \"zipkin\"\nendpoint = \"http://zipkin:9411/api/v2/spans\"\nsampling_rate = 1\n",
            TraceProtocol::Zipkin,
            "http://zipkin:9411/api/v2/spans",
            1.0,
        ),
        (
            "protocol = \"stdout\"\nsampling_rate = 0.5\n",
            TraceProtocol::Stdout,
            "",
            1.0,
        ),
    ] {
        let config = with(table).unwrap_or_else(|error| panic!("{table}: {error}"));
        assert_eq!(
            config.tracing_config(),
            TracingConfig {
                protocol,
                endpoint: endpoint.into(),
                sampling_rate: rate,
            },
            "{table}"
        );
    }
    let none = with("protocol = \"none\"\nsampling_rate = 0.5\n").unwrap();
    assert_eq!(none.tracing_config(), TracingConfig::OFF);
}

#[test]
fn a_bad_tracing_value_is_refused_at_its_position() {
    let table: &[(&str, (usize, usize), &str)] = &[
        (
            "protocol = \"otlp\"\n",
            (2, 12),
            "unknown tracing protocol \"otlp\"",
        ),
        ("protocol = \"Grpc\"\n", (2, 12), "unknown tracing protocol"),
        (
            "protocol = \"grpc\"\nendpoint = \"http://otel:4317\"\nsample_rate = 0.5\n",
            (4, 1),
            "unknown field `sample_rate`",
        ),
        (
            "endpoint = \"http://otel:4317\"\n",
            (1, 1),
            "missing field `protocol`",
        ),
        (
            "protocol = \"grpc\"\nendpoint = \"http://otel:4317\"\nsampling_rate = 1.5\n",
            (4, 17),
            "tracing.sampling_rate: 1.5 is not a number from 0 to 1",
        ),
        (
            "protocol = \"grpc\"\nendpoint = \"http://otel:4317\"\nsampling_rate = -0.1\n",
            (4, 17),
            "tracing.sampling_rate",
        ),
        (
            "protocol = \"grpc\"\nendpoint = \"http://otel:4317\"\nsampling_rate = nan\n",
            (4, 17),
            "tracing.sampling_rate: NaN",
        ),
        (
            "protocol = \"grpc\"\nendpoint = \"http://otel:4317\"\nsampling_rate = \"0.5\"\n",
            (4, 17),
            "invalid type",
        ),
        // No endpoint to point at: the table.
        (
            "protocol = \"grpc\"\n",
            (1, 1),
            "tracing.endpoint: tracing protocol \"grpc\" needs an endpoint",
        ),
        (
            "protocol = \"zipkin\"\nendpoint = \"zipkin:9411\"\n",
            (3, 12),
            "tracing.endpoint: tracing endpoint \"zipkin:9411\" has no scheme",
        ),
        (
            "protocol = \"grpc\"\nendpoint = \"https://otel:4317\"\n",
            (3, 12),
            "TLS to trace collectors is not built",
        ),
        (
            "protocol = \"http/protobuf\"\nendpoint = \"collector\"\n",
            (3, 12),
            "tracing.endpoint: tracing endpoint \"collector\": no host",
        ),
        (
            "protocol = \"none\"\nendpoint = \"http://otel:4317\"\n",
            (3, 12),
            "tracing.endpoint: must be empty with protocol \"none\"",
        ),
        (
            "protocol = \"stdout\"\nendpoint = \"http://otel:4317\"\n",
            (3, 12),
            "must be empty",
        ),
    ];
    for (text, at, said) in table {
        let (position, message) = error_at(&format!("[tracing]\n{text}"));
        assert!(message.contains(said), "{text}: {message}");
        assert_eq!(position, Some(*at), "{text}: {message}");
    }
}

#[test]
fn the_readmes_tracing_example_reads_with_the_documented_default() {
    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("## Configuration file").expect("the section")..];
    let start = section.find("# [tracing]").expect("the [tracing] example");
    let end = start + section[start..].find("\n\n").expect("the end of [tracing]");
    let lines: String = section[start..end]
        .lines()
        .map(|line| format!("{}\n", line.trim_start_matches("# ")))
        .collect();
    let config = Config::parse(&lines).unwrap_or_else(|error| panic!("{lines}: {error}"));
    let tracing = config.tracing.as_ref().expect("[tracing]");
    assert_eq!(tracing.sampling_rate, DEFAULT_SAMPLING_RATE);
    assert!(config.tracing_config().enabled());
}

#[test]
fn a_role_configured_otherwise_hands_its_tracing_over_as_the_table_that_means_it() {
    assert_eq!(TracingSettings::of(&TracingConfig::OFF), None);
    for config in [
        trace::opentelemetry(TraceProtocol::Grpc, "http://otel:4317", 0.5),
        trace::opentelemetry(TraceProtocol::HttpProtobuf, "http://otel:4318", 0.0),
        trace::opentelemetry(TraceProtocol::Stdout, "", 0.0),
        trace::opencensus(true, "http://zipkin:9411/api/v2/spans", false, 0.1),
    ] {
        let table = TracingSettings::of(&config).expect("on");
        assert_eq!(table.config(), Ok(config.clone()));
        let preset = Config {
            tracing: Some(table),
            ..Config::default()
        };
        assert_eq!(preset.tracing_config(), config);
    }
}
