//! Compiles OpenTelemetry's trace and metrics protocols (`proto/opentelemetry/proto/…`, copied from
//! open-telemetry/opentelemetry-proto: proto/README.md) into Rust with prost, as `api/build.rs`
//! compiles the autoscaler's messages. The descriptors come from protox, a protobuf compiler
//! written in Rust, so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/opentelemetry/proto/common/v1/common.proto",
        "proto/opentelemetry/proto/resource/v1/resource.proto",
        "proto/opentelemetry/proto/trace/v1/trace.proto",
        "proto/opentelemetry/proto/collector/trace/v1/trace_service.proto",
        "proto/opentelemetry/proto/metrics/v1/metrics.proto",
        "proto/opentelemetry/proto/collector/metrics/v1/metrics_service.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
