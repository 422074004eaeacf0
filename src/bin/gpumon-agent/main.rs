//! `gpumon-agent`: samples every visible GPU and sends the snapshots to the configured sinks.
//!
//! ```text
//! cargo install --path .          # installs gpumon-agent
//! gpumon-agent --prometheus-listen 0.0.0.0:9400
//! gpumon-agent --once --stdout-format json
//! ```
//! Run with `--help` for every flag. The command line is the library's (`gpumon::cli`, src/cli/),
//! which the example agent (`cargo run --example agent`) and the Python package's console scripts
//! run too; the example always has the mock backend, this binary only when built with the `mock`
//! feature.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(gpumon::cli::main(std::env::args_os(), gpumon::assembly::backend::MOCK))
}
