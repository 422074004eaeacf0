//! gpumon's example agent: the `gpumon-agent` command line (`gpumon::cli`, src/cli/) built as an
//! example, with the mock backend always available (gpumon-mock is a dev-dependency), so that
//! `cargo run --release --example agent` works on a machine without a GPU: with stdout as the
//! only sink, `--backend auto` falls back to simulated GPUs and says so on stderr.
//!
//! ```text
//! cargo run --release --example agent -- --once --stdout-format json
//! cargo run --release --example agent -- --backend mock --mock-profile a100x4 --interval 500ms
//! cargo run --release --example agent -- --config gpumon.toml
//! ```
//! Run with `--help` for every flag. Exit codes: 0 success, 1 runtime failure (sampling or a
//! sink failed in `--once`, shutdown incomplete), 2 bad configuration or flags.

mod mock {
    //! The mock backend: the library's with the `mock` feature, and otherwise the library's one
    //! construction (`gpumon::__mock_sampler!`) over the gpumon-mock dev-dependency.

    use gpumon::assembly::backend::MockFactory;

    #[cfg(not(feature = "mock"))]
    const DEV_DEPENDENCY: MockFactory = gpumon::__mock_sampler!();

    /// The mock backend, always present in the example agent.
    #[cfg(not(feature = "mock"))]
    pub const FACTORY: Option<MockFactory> = Some(DEV_DEPENDENCY);
    /// The mock backend, always present in the example agent.
    #[cfg(feature = "mock")]
    pub const FACTORY: Option<MockFactory> = gpumon::assembly::backend::MOCK;
}

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(gpumon::cli::main(std::env::args_os(), mock::FACTORY))
}
