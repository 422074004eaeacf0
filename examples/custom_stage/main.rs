//! A stage of your own, exported by every sink: thermal headroom per GPU.
//!
//! ```text
//! cargo run --example custom_stage
//! ```
//!
//! Runs on simulated GPUs (the mock backend's `thermal-throttling` scenario: temperatures climb
//! past 85 °C) and prints to this terminal only: the GPU lines, then a `THERMAL` line when a GPU
//! crosses the limit. Add a Prometheus or InfluxDB sink to the builder and the stage's series
//! (`gpumon_thermal_headroom_celsius`) and events (`gpu_thermal`) go there as well — no sink
//! knows this stage; see `stage.rs`.

mod stage;

use std::time::Duration;

use gpumon::core::Agent;
use gpumon::sinks::stdout::{StdoutFormat, StdoutSink};
use gpumon_mock::{MockSampler, Scenario};

/// Ticks to run: the scenario passes 85 °C within them (one scenario second per tick).
const TICKS: u32 = 45;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sampler = MockSampler::builder().scenario(Scenario::builtin("thermal-throttling")?).build()?;
    eprintln!("gpumon custom_stage: SIMULATED GPUs (mock backend, thermal-throttling scenario), printed to this terminal only");
    let interval = Duration::from_millis(100);
    let handle = Agent::builder(sampler)
        .interval(interval)
        .processor(stage::ThermalHeadroom::new(85.0))
        .sink(StdoutSink::new(StdoutFormat::Human))
        .spawn()?;
    tokio::time::sleep(interval * TICKS).await;
    handle.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}
