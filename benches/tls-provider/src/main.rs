//! ring against aws-lc-rs as rustls's crypto provider, for what a TLS-terminating proxy does:
//! full handshakes and record encryption/decryption. Both ends of each connection run in this
//! thread, in memory: a rustls `ClientConnection` and `ServerConnection` pass their TLS bytes
//! through `Vec`s, so the figures are rustls plus the provider's crypto, with no sockets and no
//! system calls besides the clocks.
//!
//! Each measurement runs `--rounds` times per provider, the providers alternating (ring, aws,
//! aws, ring, ring, …, so neither always runs first), and the table gives each provider's median
//! run. Wall time is noisy on shared cores; the handshake rows also give the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), which time spent descheduled does not inflate.
//!
//! Certificates come from the `openssl` command-line tool, run once at start into a temporary
//! directory: a CA and a leaf per key type, the RSA leaf key in PKCS#1 form (what cert-manager
//! writes for RSA), the ECDSA one in SEC 1 form.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{
    CipherSuite, ClientConfig, ClientConnection, Connection, NamedGroup, ProtocolVersion,
    RootCertStore, ServerConfig, ServerConnection, SupportedProtocolVersion,
};

const SERVER_NAME: &str = "backend.example";

fn main() {
    let opts = Options::parse();
    let providers = providers(&opts.providers);
    if providers.is_empty() {
        eprintln!("no provider selected (built with: {})", built_providers());
        std::process::exit(2);
    }
    let dir = CertDir::new();
    let rsa = KeyPair::generate(&dir.0, KeyType::Rsa2048);
    let ecdsa = KeyPair::generate(&dir.0, KeyType::EcdsaP256);

    eprintln!(
        "rustls 0.23.46, providers: {}; {} s per run, {} runs per provider; {}",
        providers
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", "),
        opts.seconds,
        opts.rounds,
        cpu_model()
    );

    let handshakes = [
        Handshake {
            name: "TLS 1.3, RSA-2048, X25519",
            keys: &rsa,
            version: &rustls::version::TLS13,
            group: NamedGroup::X25519,
            suite: None,
        },
        Handshake {
            name: "TLS 1.3, ECDSA P-256, X25519",
            keys: &ecdsa,
            version: &rustls::version::TLS13,
            group: NamedGroup::X25519,
            suite: None,
        },
        Handshake {
            name: "TLS 1.2, ECDHE-RSA-AES128-GCM-SHA256 (RSA-2048, X25519)",
            keys: &rsa,
            version: &rustls::version::TLS12,
            group: NamedGroup::X25519,
            suite: Some(CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
        },
        // Only aws-lc-rs has ML-KEM; with aws-lc-rs, rustls offers this group first by default,
        // and current browsers do too, so this is what an aws-lc-rs front would mostly run.
        Handshake {
            name: "TLS 1.3, ECDSA P-256, X25519MLKEM768",
            keys: &ecdsa,
            version: &rustls::version::TLS13,
            group: NamedGroup::X25519MLKEM768,
            suite: None,
        },
    ];
    let bulks = [
        (CipherSuite::TLS13_AES_128_GCM_SHA256, 1 << 20),
        (CipherSuite::TLS13_AES_128_GCM_SHA256, 1 << 10),
        (CipherSuite::TLS13_AES_256_GCM_SHA384, 1 << 20),
        (CipherSuite::TLS13_AES_256_GCM_SHA384, 1 << 10),
        (CipherSuite::TLS13_CHACHA20_POLY1305_SHA256, 1 << 20),
        (CipherSuite::TLS13_CHACHA20_POLY1305_SHA256, 1 << 10),
    ];

    let run_time = Duration::from_secs_f64(opts.seconds);
    let mut handshake_table = Vec::new();
    for h in &handshakes {
        if !opts.selects(h.name) {
            continue;
        }
        let mut per_provider = Vec::new();
        for (name, runs) in alternate(&providers, opts.rounds, |p| {
            let setup = h.configs(&p.provider)?;
            let run = setup.run(run_time);
            eprintln!("  {:<58} {:<9} {}", h.name, p.name, run.line());
            Some(run)
        }) {
            per_provider.push((name, runs));
        }
        handshake_table.push((h.name, per_provider));
    }

    let mut bulk_table = Vec::new();
    for &(suite, size) in &bulks {
        let label = format!("{}, {} writes", suite_name(suite), size_name(size));
        if !opts.selects(&label) {
            continue;
        }
        let mut per_provider = Vec::new();
        for (name, runs) in alternate(&providers, opts.rounds, |p| {
            let run = bulk(&p.provider, &ecdsa, suite, size, run_time)?;
            eprintln!("  {:<58} {:<9} {}", label, p.name, run.line());
            Some(run)
        }) {
            per_provider.push((name, runs));
        }
        bulk_table.push((label, per_provider));
    }

    print_handshakes(&handshake_table);
    print_bulk(&bulk_table);
}

struct Options {
    seconds: f64,
    rounds: usize,
    providers: Vec<String>,
    only: Vec<String>,
}

impl Options {
    fn parse() -> Self {
        let mut o = Options {
            seconds: 2.0,
            rounds: 5,
            providers: Vec::new(),
            only: Vec::new(),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next().unwrap_or_else(|| {
                    eprintln!("{name} needs a value");
                    std::process::exit(2)
                })
            };
            match arg.as_str() {
                "--seconds" => o.seconds = parse_num(&value("--seconds")),
                "--rounds" => o.rounds = parse_num(&value("--rounds")),
                "--provider" => o.providers.push(value("--provider")),
                "--only" => o.only.push(value("--only").to_lowercase()),
                "-h" | "--help" => {
                    println!(
                        "usage: kactivator-tls-provider [--seconds S] [--rounds N] \
                         [--provider ring|aws-lc-rs]... [--only SUBSTRING]...\n\
                         \n  --seconds S   length of one run (default 2)\
                         \n  --rounds N    runs per provider and measurement, the providers \
                         alternating (default 5)\
                         \n  --provider P  measure only this provider (repeatable; built: {})\
                         \n  --only TEXT   only the measurements whose name contains TEXT \
                         (repeatable, case-insensitive)",
                        built_providers()
                    );
                    std::process::exit(0);
                }
                other => {
                    eprintln!("unknown argument {other:?} (try --help)");
                    std::process::exit(2);
                }
            }
        }
        if o.seconds <= 0.0 || o.rounds == 0 {
            eprintln!("--seconds and --rounds must be positive");
            std::process::exit(2);
        }
        o
    }

    fn selects(&self, name: &str) -> bool {
        let name = name.to_lowercase();
        self.only.is_empty() || self.only.iter().any(|o| name.contains(o.as_str()))
    }
}

fn parse_num<T: std::str::FromStr>(s: &str) -> T {
    s.parse().unwrap_or_else(|_| {
        eprintln!("not a number: {s:?}");
        std::process::exit(2)
    })
}

struct Provider {
    name: &'static str,
    provider: Arc<CryptoProvider>,
}

fn providers(wanted: &[String]) -> Vec<Provider> {
    #[allow(unused_mut)]
    let mut all: Vec<Provider> = Vec::new();
    #[cfg(feature = "ring")]
    all.push(Provider {
        name: "ring",
        provider: Arc::new(rustls::crypto::ring::default_provider()),
    });
    #[cfg(feature = "aws-lc-rs")]
    all.push(Provider {
        name: "aws-lc-rs",
        provider: Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    });
    all.retain(|p| wanted.is_empty() || wanted.iter().any(|w| w == p.name));
    all
}

fn built_providers() -> &'static str {
    match (cfg!(feature = "ring"), cfg!(feature = "aws-lc-rs")) {
        (true, true) => "ring, aws-lc-rs",
        (true, false) => "ring",
        (false, true) => "aws-lc-rs",
        (false, false) => "none",
    }
}

/// Runs `f` `rounds` times per provider, the order alternating between rounds (with two
/// providers: A B, B A, A B, …), and returns each provider's runs. A provider for which `f`
/// returns `None` (it lacks what the measurement needs) is left out.
fn alternate<R>(
    providers: &[Provider],
    rounds: usize,
    mut f: impl FnMut(&Provider) -> Option<R>,
) -> Vec<(&'static str, Vec<R>)> {
    let mut out: Vec<(&'static str, Vec<R>)> =
        providers.iter().map(|p| (p.name, Vec::new())).collect();
    for round in 0..rounds {
        let n = providers.len();
        for k in 0..n {
            let i = if round % 2 == 0 { k } else { n - 1 - k };
            if let Some(r) = f(&providers[i]) {
                out[i].1.push(r);
            }
        }
    }
    out.retain(|(_, runs)| !runs.is_empty());
    out
}

// ---- certificates ----

#[derive(Clone, Copy)]
enum KeyType {
    Rsa2048,
    EcdsaP256,
}

struct KeyPair {
    /// leaf certificate, then nothing: the server sends the leaf alone
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
}

struct CertDir(PathBuf);

impl CertDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("tls-provider-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the certificate directory");
        CertDir(dir)
    }
}

impl Drop for CertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running openssl (needed to make the test certificates): {e}"));
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl KeyPair {
    fn generate(dir: &Path, kind: KeyType) -> Self {
        let p = match kind {
            KeyType::Rsa2048 => "rsa",
            KeyType::EcdsaP256 => "ec",
        };
        let (ca_key, ca, key, csr, leaf, ext) = (
            format!("{p}-ca.key"),
            format!("{p}-ca.pem"),
            format!("{p}.key"),
            format!("{p}.csr"),
            format!("{p}.pem"),
            format!("{p}.ext"),
        );
        let genkey = |out: &str| match kind {
            // -traditional: PKCS#1 ("BEGIN RSA PRIVATE KEY"), as cert-manager writes RSA keys
            KeyType::Rsa2048 => openssl(dir, &["genrsa", "-traditional", "-out", out, "2048"]),
            KeyType::EcdsaP256 => openssl(
                dir,
                &[
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    out,
                ],
            ),
        };
        genkey(&ca_key);
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                &ca_key,
                "-sha256",
                "-days",
                "2",
                "-subj",
                "/CN=tls-provider bench CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-out",
                &ca,
            ],
        );
        genkey(&key);
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &key,
                "-subj",
                &format!("/CN={SERVER_NAME}"),
                "-out",
                &csr,
            ],
        );
        let key_usage = match kind {
            KeyType::Rsa2048 => "digitalSignature,keyEncipherment",
            KeyType::EcdsaP256 => "digitalSignature",
        };
        std::fs::write(
            dir.join(&ext),
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,{key_usage}\n\
                 extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{SERVER_NAME}\n"
            ),
        )
        .expect("writing the extensions file");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-set_serial",
                "2",
                "-sha256",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &leaf,
            ],
        );

        let read = |f: &str| std::fs::read(dir.join(f)).expect("reading a generated PEM file");
        let key_pem = read(&key);
        match kind {
            KeyType::Rsa2048 => assert!(
                key_pem.starts_with(b"-----BEGIN RSA PRIVATE KEY-----"),
                "the RSA key is not PKCS#1"
            ),
            KeyType::EcdsaP256 => assert!(key_pem.starts_with(b"-----BEGIN EC PRIVATE KEY-----")),
        }
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&read(&ca)).expect("CA PEM"))
            .expect("adding the CA");
        KeyPair {
            chain: vec![CertificateDer::from_pem_slice(&read(&leaf)).expect("leaf PEM")],
            key: PrivateKeyDer::from_pem_slice(&key_pem).expect("key PEM"),
            roots: Arc::new(roots),
        }
    }
}

// ---- configuration ----

/// `base` with only the given key exchange group and, if given, only the given cipher suite;
/// `None` if the provider lacks either.
fn narrowed(
    base: &CryptoProvider,
    group: NamedGroup,
    suite: Option<CipherSuite>,
) -> Option<Arc<CryptoProvider>> {
    let mut p = base.clone();
    p.kx_groups = vec![*base.kx_groups.iter().find(|g| g.name() == group)?];
    if let Some(suite) = suite {
        p.cipher_suites = vec![*base.cipher_suites.iter().find(|s| s.suite() == suite)?];
    }
    Some(Arc::new(p))
}

struct Configs {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

/// Full handshakes only: no session tickets or session IDs issued, none stored, none offered.
fn configs(
    provider: &Arc<CryptoProvider>,
    version: &'static SupportedProtocolVersion,
    keys: &KeyPair,
) -> Configs {
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])
        .expect("protocol version")
        .with_no_client_auth()
        .with_single_cert(keys.chain.clone(), keys.key.clone_key())
        .expect("server certificate and key");
    server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    server.send_tls13_tickets = 0;
    let mut client = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])
        .expect("protocol version")
        .with_root_certificates(keys.roots.clone())
        .with_no_client_auth();
    client.resumption = rustls::client::Resumption::disabled();
    Configs {
        client: Arc::new(client),
        server: Arc::new(server),
    }
}

fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).expect("server name")
}

// ---- moving bytes ----

/// Everything `from` has to send, appended to `buf`.
fn take_tls(from: &mut Connection, buf: &mut Vec<u8>) {
    while from.wants_write() {
        from.write_tls(buf).expect("write_tls into a Vec");
    }
}

/// Feeds `bytes` to `to`, processing as it goes, and hands each piece of plaintext that comes
/// out to `sink`.
fn give_tls(to: &mut Connection, mut bytes: &[u8], sink: &mut [u8], received: &mut usize) {
    while !bytes.is_empty() {
        to.read_tls(&mut bytes).expect("read_tls from a slice");
        to.process_new_packets().expect("TLS error");
        loop {
            match to.reader().read(sink) {
                Ok(0) => break,
                Ok(n) => *received += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("reading plaintext: {e}"),
            }
        }
    }
}

/// Thread CPU time. A system call (unlike `Instant::now`), a few hundred ns here.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Wall and CPU time spent in one side's calls.
#[derive(Default)]
struct Side {
    wall: Duration,
    cpu: Duration,
}

impl Side {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (w, c) = (Instant::now(), thread_cpu());
        let out = f();
        self.cpu += thread_cpu() - c;
        self.wall += w.elapsed();
        out
    }
}

// ---- handshakes ----

struct Handshake<'k> {
    name: &'static str,
    keys: &'k KeyPair,
    version: &'static SupportedProtocolVersion,
    group: NamedGroup,
    suite: Option<CipherSuite>,
}

impl Handshake<'_> {
    fn configs(&self, provider: &CryptoProvider) -> Option<HandshakeSetup> {
        let narrowed = narrowed(provider, self.group, self.suite)?;
        Some(HandshakeSetup {
            configs: configs(&narrowed, self.version, self.keys),
            version: self.version.version,
            suite: self.suite,
            group: self.group,
        })
    }
}

struct HandshakeSetup {
    configs: Configs,
    version: ProtocolVersion,
    suite: Option<CipherSuite>,
    group: NamedGroup,
}

struct HandshakeRun {
    count: u64,
    wall: Duration,
    cpu: Duration,
    server: Side,
}

impl HandshakeRun {
    fn per_second(&self) -> f64 {
        self.count as f64 / self.wall.as_secs_f64()
    }
    fn us(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.count as f64
    }
    fn line(&self) -> String {
        format!(
            "{:>8.0} handshakes/s, CPU {:>7.1} us each ({:>7.1} server), server wall {:>7.1} us",
            self.per_second(),
            self.us(self.cpu),
            self.us(self.server.cpu),
            self.us(self.server.wall)
        )
    }
}

impl HandshakeSetup {
    fn run(&self, time: Duration) -> HandshakeRun {
        let mut server_side = Side::default();
        let mut buf = Vec::with_capacity(1 << 14);
        let mut sink = [0u8; 1 << 14];
        let mut count = 0u64;
        let (start, cpu_start) = (Instant::now(), thread_cpu());
        loop {
            self.one(&mut server_side, &mut buf, &mut sink);
            count += 1;
            if count % 8 == 0 && start.elapsed() >= time {
                break;
            }
        }
        HandshakeRun {
            count,
            wall: start.elapsed(),
            cpu: thread_cpu() - cpu_start,
            server: server_side,
        }
    }

    fn one(&self, server_side: &mut Side, buf: &mut Vec<u8>, sink: &mut [u8]) {
        let mut client = Connection::Client(
            ClientConnection::new(self.configs.client.clone(), server_name()).expect("client"),
        );
        let mut server = server_side.time(|| {
            Connection::Server(ServerConnection::new(self.configs.server.clone()).expect("server"))
        });
        let mut received = 0;
        for _ in 0..16 {
            buf.clear();
            take_tls(&mut client, buf);
            let client_sent = !buf.is_empty();
            let server_sent = server_side.time(|| {
                give_tls(&mut server, buf, sink, &mut received);
                buf.clear();
                take_tls(&mut server, buf);
                !buf.is_empty()
            });
            give_tls(&mut client, buf, sink, &mut received);
            if !client_sent && !server_sent && !client.is_handshaking() && !server.is_handshaking()
            {
                let Connection::Server(s) = &server else {
                    unreachable!()
                };
                debug_assert_eq!(s.protocol_version(), Some(self.version));
                debug_assert_eq!(
                    s.negotiated_key_exchange_group().map(|g| g.name()),
                    Some(self.group)
                );
                if let Some(suite) = self.suite {
                    debug_assert_eq!(s.negotiated_cipher_suite().map(|s| s.suite()), Some(suite));
                }
                return;
            }
        }
        panic!("handshake did not finish in 16 exchanges");
    }
}

// ---- records ----

struct BulkRun {
    bytes: u64,
    encrypt: Duration,
    decrypt: Duration,
    wall: Duration,
}

impl BulkRun {
    fn mb_s(&self, d: Duration) -> f64 {
        self.bytes as f64 / d.as_secs_f64() / 1e6
    }
    fn line(&self) -> String {
        format!(
            "{:>8.0} MB/s encrypt, {:>8.0} MB/s decrypt, {:>8.0} MB/s both",
            self.mb_s(self.encrypt),
            self.mb_s(self.decrypt),
            self.mb_s(self.wall)
        )
    }
}

/// One connection (ECDSA, X25519, the one cipher suite); the server writes `size` bytes at a
/// time through `writer()` and `write_tls`, the client takes them in with `read_tls`,
/// `process_new_packets` and `reader()`. rustls's default 64 KiB limit on pending TLS bytes
/// applies, so a 1 MiB write goes out in 64 KiB slices, as it would to a socket.
fn bulk(
    provider: &CryptoProvider,
    keys: &KeyPair,
    suite: CipherSuite,
    size: usize,
    time: Duration,
) -> Option<BulkRun> {
    let narrowed = narrowed(provider, NamedGroup::X25519, Some(suite))?;
    let setup = HandshakeSetup {
        configs: configs(&narrowed, &rustls::version::TLS13, keys),
        version: ProtocolVersion::TLSv1_3,
        suite: Some(suite),
        group: NamedGroup::X25519,
    };
    let mut client = Connection::Client(
        ClientConnection::new(setup.configs.client.clone(), server_name()).expect("client"),
    );
    let mut server =
        Connection::Server(ServerConnection::new(setup.configs.server.clone()).expect("server"));
    let mut buf = Vec::with_capacity(1 << 17);
    let mut sink = vec![0u8; 1 << 16];
    let mut received = 0usize;
    while client.is_handshaking() || server.is_handshaking() {
        buf.clear();
        take_tls(&mut client, &mut buf);
        give_tls(&mut server, &buf, &mut sink, &mut received);
        buf.clear();
        take_tls(&mut server, &mut buf);
        give_tls(&mut client, &buf, &mut sink, &mut received);
    }
    let Connection::Server(s) = &server else {
        unreachable!()
    };
    assert_eq!(s.negotiated_cipher_suite().map(|s| s.suite()), Some(suite));

    let payload = vec![0x5au8; size];
    let (mut encrypt, mut decrypt) = (Duration::ZERO, Duration::ZERO);
    let mut sent = 0u64;
    let start = Instant::now();
    while start.elapsed() < time {
        let mut rest = &payload[..];
        while !rest.is_empty() {
            let t = Instant::now();
            let n = server.writer().write(rest).expect("writer");
            buf.clear();
            take_tls(&mut server, &mut buf);
            let t2 = Instant::now();
            encrypt += t2 - t;
            give_tls(&mut client, &buf, &mut sink, &mut received);
            decrypt += t2.elapsed();
            rest = &rest[n..];
        }
        sent += size as u64;
    }
    let wall = start.elapsed();
    assert_eq!(received as u64, sent, "the client got what the server sent");
    Some(BulkRun {
        bytes: sent,
        encrypt,
        decrypt,
        wall,
    })
}

// ---- output ----

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

type Table<L, R> = Vec<(L, Vec<(&'static str, Vec<R>)>)>;

fn print_handshakes(table: &Table<&str, HandshakeRun>) {
    if table.is_empty() {
        return;
    }
    println!();
    println!("Full handshakes (no resumption), both ends in one thread; medians of the runs.");
    println!(
        "CPU = thread CPU time per handshake; server = time inside the ServerConnection's calls."
    );
    println!();
    println!("| handshake | provider | handshakes/s (both ends) | CPU µs, both ends | CPU µs, server | server handshakes/s per core (by CPU) |");
    println!("|---|---|--:|--:|--:|--:|");
    for (name, providers) in table {
        for (provider, runs) in providers {
            let f = |g: &dyn Fn(&HandshakeRun) -> f64| median(runs.iter().map(g).collect());
            let server_cpu = f(&|r| r.us(r.server.cpu));
            println!(
                "| {name} | {provider} | {:.0} | {:.1} | {:.1} | {:.0} |",
                f(&|r| r.per_second()),
                f(&|r| r.us(r.cpu)),
                server_cpu,
                1e6 / server_cpu,
            );
        }
    }
}

fn print_bulk(table: &Table<String, BulkRun>) {
    if table.is_empty() {
        return;
    }
    println!();
    println!("Records: the server encrypts, the client decrypts; MB/s of plaintext (10^6 bytes), medians.");
    println!();
    println!("| cipher suite, write size | provider | encrypt MB/s | decrypt MB/s | both, MB/s |");
    println!("|---|---|--:|--:|--:|");
    for (name, providers) in table {
        for (provider, runs) in providers {
            let f = |d: &dyn Fn(&BulkRun) -> Duration| {
                median(runs.iter().map(|r| r.mb_s(d(r))).collect())
            };
            println!(
                "| {name} | {provider} | {:.0} | {:.0} | {:.0} |",
                f(&|r| r.encrypt),
                f(&|r| r.decrypt),
                f(&|r| r.wall),
            );
        }
    }
}

fn suite_name(s: CipherSuite) -> &'static str {
    match s {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => "TLS_AES_128_GCM_SHA256",
        CipherSuite::TLS13_AES_256_GCM_SHA384 => "TLS_AES_256_GCM_SHA384",
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => "TLS_CHACHA20_POLY1305_SHA256",
        _ => "other",
    }
}

fn size_name(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

fn cpu_model() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {cpus} CPUs")
}
