//! The configuration file: any bytes either load into a configuration that validates, or fail
//! with an error that names a line and column inside the file. Never a panic.

use std::time::Duration;

use kactivator_api::RevisionKey;
use kactivator_control::config::Config;
use kactivator_shards::routing::MAX_TIMEOUT_SECONDS;

/// Load arbitrary bytes as a configuration file.
pub fn config(data: &[u8]) {
    let config = match Config::parse_bytes(data) {
        Ok(config) => config,
        Err(error) => {
            // Every error points into the file: line 1 up to one past the last line.
            let (line, column) = error
                .position
                .unwrap_or_else(|| panic!("no position for: {error}"));
            let lines = data.iter().filter(|&&byte| byte == b'\n').count() + 1;
            assert!(
                (1..=lines).contains(&line),
                "line {line} of {lines}: {error}"
            );
            assert!(column >= 1, "{error}");
            let _ = error.to_string();
            return;
        }
    };
    // The same text gives the same configuration.
    assert_eq!(Config::parse_bytes(data).as_ref(), Ok(&config));

    // What validation promises the consumers.
    for revision in &config.revisions {
        // The file source keys each revision (`sources::file`).
        RevisionKey::new(&revision.namespace, &revision.name)
            .expect("a validated revision has a key");
        let timeouts = revision.timeouts();
        let longest = Duration::from_secs(MAX_TIMEOUT_SECONDS);
        assert!(timeouts.total > Duration::ZERO && timeouts.total <= longest);
        assert!(timeouts.response_start.is_none_or(|t| t <= longest));
        assert!(timeouts.idle.is_none_or(|t| t <= longest));
        let _ = (
            revision.lb_policy(),
            revision.protocol(),
            revision.serving_port(),
        );
    }
    let h2 = config.proxy.h2();
    assert!(h2.max_concurrent_streams >= 1 && h2.max_header_list >= 1);
    assert!((65_535..=(1 << 31) - 1).contains(&h2.stream_window));
    assert!((65_535..=(1 << 31) - 1).contains(&h2.connection_window));
    assert!((16_384..=16_777_215).contains(&h2.max_frame));
    assert!(config.control.qp_freshness_seconds <= config.control.qp_staleness_seconds);
    assert!(config.listen.http != config.listen.http2 || config.listen.http.port() == 0);
}
