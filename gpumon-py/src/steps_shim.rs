//! TEMPORARY stand-in for `gpumon_core::steps` until the `steps` branch is merged.
#![allow(missing_docs, dead_code)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, Default)]
pub struct StepConfig;
#[derive(Debug)]
pub enum StepError {
    NotIncreasing { last: u64, got: u64 },
    InvalidJob(String),
}
impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
#[derive(Debug)]
pub struct StepTracker;
impl gpumon_core::Processor for StepTracker {
    fn name(&self) -> &str {
        "steps"
    }
    fn process(&mut self, _: &mut gpumon_core::Snapshot) {}
}
impl StepTracker {
    pub fn new(_: StepConfig) -> Result<(StepTracker, StepRegistry), StepError> {
        Ok((StepTracker, StepRegistry))
    }
}
#[derive(Clone, Debug)]
pub struct StepRegistry;
impl StepRegistry {
    pub fn run(&self, job: &str, rank: Option<u32>) -> Result<TrainingRun, StepError> {
        Ok(TrainingRun { job: job.into(), rank, last: Arc::new(AtomicU64::new(u64::MAX)) })
    }
}
#[derive(Clone, Debug)]
pub struct TrainingRun {
    job: String,
    rank: Option<u32>,
    last: Arc<AtomicU64>,
}
impl TrainingRun {
    pub fn step(&self, n: u64) -> Result<(), StepError> {
        let last = self.last.load(Ordering::Relaxed);
        if last != u64::MAX && n <= last {
            return Err(StepError::NotIncreasing { last, got: n });
        }
        self.last.store(n, Ordering::Relaxed);
        Ok(())
    }
    pub fn job(&self) -> &str {
        &self.job
    }
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }
}
