//! `gpumon-agent`: samples every visible GPU and sends the snapshots to the configured sinks.
//!
//! ```text
//! cargo install --path .          # installs gpumon-agent
//! gpumon-agent --prometheus-listen 0.0.0.0:9400
//! gpumon-agent --once --stdout-format json
//! ```
//! Run with `--help` for every flag. The same code is `cargo run --example agent`
//! (examples/agent/main.rs includes these files); the example always has the mock backend, this
//! binary only when built with the `mock` feature.

mod app;
mod attribution;
mod backend;
mod compare;
mod diagnose;
mod run;
mod sinks;
mod steps;
mod web;

mod mock {
    //! The mock backend, when this build has it (`--features mock`).

    /// The library's mock backend (`None` without the `mock` feature).
    pub const FACTORY: Option<gpumon::assembly::backend::MockFactory> = gpumon::assembly::backend::MOCK;
}

fn main() -> std::process::ExitCode {
    app::main()
}
