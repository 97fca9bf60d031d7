//! Compiles the autoscaler's stat messages from the repository's `.proto` (the one kactivator
//! is built from), so the test autoscaler decodes frames with its own generated code rather
//! than with kactivator's.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../api/proto/stat.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["../api/proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
