//! Compiles `proto/stat.proto` (the autoscaler's stat messages) into Rust with prost. The
//! descriptors come from protox, a protobuf compiler written in Rust, so building needs no
//! `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/stat.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
