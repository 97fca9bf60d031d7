//! The checks behind kactivator's fuzz targets, shared by libFuzzer and the replay fallback:
//! what a stranger can send the activator, each checked for more than "no panic".
//!
//! * [`registration`] — a queue-proxy's `POST /api/v1/pod-registration` body.
//! * [`config`] — the configuration file's bytes.
//! * [`kubernetes`] — a stream of watch events (Revisions, Endpoints, EndpointSlices, Services,
//!   `config-features`) through the Kubernetes source's model and the state worker.
//! * [`keda_http`] — HTTPScaledObjects, Services and EndpointSlices through the KEDA HTTP
//!   add-on role's model, then requests routed by the rules it declares.
//! * [`h2_front`] — HTTP/2 frames into a live client connection on a shard.
//! * [`request_log`] — a request log template, and a client's request rendered with it.
//! * [`tls_material`] — a certificate chain, a key, a server name and TLS settings.
//! * [`trace_context`] — `traceparent`, `tracestate` and B3 headers, and what goes to the pod.

// Unsafe code only where `h2_front` ignores SIGPIPE, as Rust's own start-up does.
#![deny(unsafe_code)]

mod config;
mod h2_front;
mod keda_http;
mod kubernetes;
mod registration;
mod request_log;
mod tls_material;
mod trace_context;

use std::path::Path;
use std::process::ExitCode;

pub use config::config;
pub use h2_front::h2_front;
pub use keda_http::keda_http;
pub use kubernetes::kubernetes;
pub use registration::registration;
pub use request_log::request_log;
pub use tls_material::tls_material;
pub use trace_context::trace_context;

/// Entry point of the targets when not built by cargo-fuzz: run `check` over every file named
/// on the command line, and every file inside every directory named there.
pub fn replay_main(check: fn(&[u8])) -> ExitCode {
    let mut count = 0usize;
    for argument in std::env::args_os().skip(1) {
        match replay(Path::new(&argument), check) {
            Ok(files) => count += files,
            Err(error) => {
                eprintln!("{}: {error}", Path::new(&argument).display());
                return ExitCode::FAILURE;
            }
        }
    }
    if count == 0 {
        eprintln!("usage: TARGET FILE_OR_DIRECTORY... (no inputs were found)");
        return ExitCode::FAILURE;
    }
    println!("replayed {count} inputs");
    ExitCode::SUCCESS
}

fn replay(path: &Path, check: fn(&[u8])) -> std::io::Result<usize> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)?
            .map(|entry| entry.map(|entry| entry.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        let mut count = 0;
        for entry in entries {
            count += replay(&entry, check)?;
        }
        Ok(count)
    } else {
        check(&std::fs::read(path)?);
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed corpus passes every check.
    #[test]
    fn seeds() {
        let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        type Check = fn(&[u8]);
        let targets: [(&str, Check); 8] = [
            ("registration", registration),
            ("request_log", request_log),
            ("config", config),
            ("kubernetes", kubernetes),
            ("keda_http", keda_http),
            ("h2_front", h2_front),
            ("tls_material", tls_material),
            ("trace_context", trace_context),
        ];
        for (name, check) in targets {
            let count = replay(&seeds.join(name), check).unwrap();
            assert!(count > 0, "no seeds for {name}");
        }
    }
}
