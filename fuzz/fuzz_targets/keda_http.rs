//! Fuzz target: `kactivator_fuzz::keda_http` on every input.
//!
//! Under cargo-fuzz (`--cfg fuzzing`) this is a libFuzzer target. Built any other way it is a
//! plain program that runs the same check over the files and directories named on its command
//! line, so CI can replay the seed corpus without cargo-fuzz or a nightly compiler.

#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kactivator_fuzz::keda_http(data));

#[cfg(not(fuzzing))]
fn main() -> std::process::ExitCode {
    kactivator_fuzz::replay_main(kactivator_fuzz::keda_http)
}
