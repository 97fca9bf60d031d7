//! Generates the servers of the two gRPC services the KEDA HTTP add-on role answers on its
//! scaler port (issue 40): KEDA's `externalscaler.ExternalScaler` and the standard
//! `grpc.health.v1.Health`, whose messages are the api crate's. protox compiles the files, so
//! building needs no `protoc`; tonic's code generator writes the service traits, served here
//! behind hyper (no tonic transport).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "../api/proto/externalscaler.proto",
        "../api/proto/health.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["../api/proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .build_transport(false)
        .extern_path(
            ".grpc.health.v1.HealthCheckRequest",
            "::kactivator_api::grpc_health::HealthCheckRequest",
        )
        .extern_path(
            ".grpc.health.v1.HealthCheckResponse",
            "::kactivator_api::grpc_health::HealthCheckResponse",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
