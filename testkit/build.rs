//! Compiles the testkit's protobuf code without protoc (protox):
//!
//! * the autoscaler's stat messages from the repository's `.proto` (the one kactivator is
//!   built from), so the test autoscaler decodes frames with its own generated code rather
//!   than with kactivator's;
//! * the gRPC Echo service of `proto/echo.proto`, client and server, for the gRPC backend;
//! * KEDA's external scaler (`api/proto/externalscaler.proto`), client only: the tests' KEDA.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stat_proto = "../api/proto/stat.proto";
    println!("cargo:rerun-if-changed={stat_proto}");
    let descriptors = protox::compile([stat_proto], ["../api/proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;

    let echo_proto = "proto/echo.proto";
    println!("cargo:rerun-if-changed={echo_proto}");
    let descriptors = protox::compile([echo_proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        // `bytes` fields as `Bytes`, so large payloads are shared instead of copied.
        .bytes(".")
        .compile_fds(descriptors)?;

    // KEDA's external-scaler contract, client side: the tests play KEDA against the KEDA HTTP
    // add-on role with code generated from KEDA's own file.
    // With the standard gRPC health check's client, which KEDA's chart probes the scaler with.
    let scaler_protos = [
        "../api/proto/externalscaler.proto",
        "../api/proto/health.proto",
    ];
    for proto in scaler_protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(scaler_protos, ["../api/proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
