//! Compiles `proto/stat.proto` (the autoscaler's stat messages) and `proto/health.proto` (the
//! standard gRPC health check's messages) into Rust with prost. The descriptors come from
//! protox, a protobuf compiler written in Rust, so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/stat.proto", "proto/health.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
