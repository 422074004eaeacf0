//! [`MockSampler`]: the mock fleet behind the [`Sampler`] seam, one tick per call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use gpumon_core::{SampleError, SampleRequest, Sampler, Snapshot};

use crate::error::ConfigError;
use crate::fleet::{MockFleet, DEFAULT_SEED};
use crate::profile::FleetProfile;
use crate::scenario::{Fault, Scenario};

/// A [`Sampler`] over a [`MockFleet`]. Each [`Sampler::sample`] call takes the current tick and
/// advances it by one, so the n-th call (from 0) samples tick n — unless the sampler is
/// [paced](MockSamplerBuilder::paced) to a real-time interval, where a sample taken between
/// two of the interval's ticks is part of the coming tick (see there).
///
/// Scheduled faults act per tick: [`Fault::Hang`] blocks the calling thread,
/// [`Fault::Unavailable`] fails the call, the others shape the devices' values.
#[derive(Debug)]
pub struct MockSampler {
    fleet: Arc<MockFleet>,
    tick: AtomicU64,
    pace: Option<Pace>,
}

/// A paced sampler's real-time interval, and what its last whole tick read.
#[derive(Debug)]
struct Pace {
    interval: Duration,
    last: Mutex<LastTick>,
}

impl Pace {
    /// Which of the interval's ticks `elapsed` (since the first sample) falls in: `k` from
    /// `k × interval` on. A tenth of an interval (at most 50 ms) early still counts as the
    /// tick: the agent's own schedule started a moment before the first sample was taken.
    fn grid_of(&self, elapsed: Duration) -> u64 {
        let slack = (self.interval / 10).min(Duration::from_millis(50));
        let step = self.interval.as_nanos().max(1);
        u64::try_from((elapsed + slack).as_nanos() / step).unwrap_or(u64::MAX)
    }
}

#[derive(Debug, Default)]
struct LastTick {
    /// When the first sample was taken: the interval's ticks fall on `origin + k × interval`,
    /// as the agent's do (its schedule skips a missed tick rather than shifting).
    origin: Option<Instant>,
    /// `k` of the last tick taken.
    grid: u64,
    /// When the last sample that advanced the tick was taken.
    at: Option<Instant>,
    /// Each GPU's energy counter then, joules (by UUID).
    energy: HashMap<String, f64>,
}

impl MockSampler {
    /// Starts a builder: default fleet `h100x8`, scenario `training`.
    pub fn builder() -> MockSamplerBuilder {
        MockSamplerBuilder::default()
    }

    /// A sampler over an already built fleet, starting at tick 0.
    pub fn new(fleet: impl Into<Arc<MockFleet>>) -> Self {
        Self { fleet: fleet.into(), tick: AtomicU64::new(0), pace: None }
    }

    /// The built-in or file profile `name_or_path` running the `training` scenario.
    ///
    /// ```
    /// let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    /// assert_eq!(sampler.fleet().devices().len(), 8);
    /// ```
    ///
    /// # Errors
    /// As [`FleetProfile::load`].
    pub fn from_profile_name(name_or_path: &str) -> Result<Self, ConfigError> {
        Self::builder().profile(FleetProfile::load(name_or_path)?).build()
    }

    /// The fleet (shared, e.g. with a fake NVML).
    pub fn fleet(&self) -> &Arc<MockFleet> {
        &self.fleet
    }

    /// The tick the next sample will take.
    pub fn tick(&self) -> u64 {
        self.tick.load(Ordering::SeqCst)
    }

    /// Sets the tick the next sample will take.
    pub fn set_tick(&self, tick: u64) {
        self.tick.store(tick, Ordering::SeqCst);
    }
}

impl MockSampler {
    /// Samples the current tick and advances it.
    fn whole_tick(&self, request: &SampleRequest, started: Instant) -> Result<Snapshot, SampleError> {
        let tick = self.tick.fetch_add(1, Ordering::SeqCst);
        match self.fleet.hang_at(tick) {
            Some(Fault::Hang { duration, .. }) => std::thread::sleep(*duration),
            Some(Fault::HangUntilReleased { gate, .. }) => gate.wait(),
            _ => {}
        }
        let snapshot = self.fleet.snapshot(tick, request)?;
        Ok(snapshot.with_duration(started.elapsed()))
    }
}

impl Sampler for MockSampler {
    fn name(&self) -> &str {
        "mock"
    }

    fn sample(&self, request: &SampleRequest) -> Result<Snapshot, SampleError> {
        let started = Instant::now();
        if let Some(pace) = &self.pace {
            let mut last = pace.last.lock().unwrap_or_else(PoisonError::into_inner);
            let early = match (last.origin, last.at) {
                (Some(origin), Some(at)) if pace.grid_of(started.saturating_duration_since(origin)) <= last.grid => {
                    Some(at)
                }
                _ => None,
            };
            if let Some(at) = early {
                // Between two ticks (a flush, the sample at exit, however far into the
                // interval): the coming tick's readings, its energy counter only as far into
                // the interval as the time since the last tick. The tick itself stays to come.
                let mut snapshot = self.fleet.snapshot(self.tick(), request)?;
                let since = started.saturating_duration_since(at);
                let share = (since.as_secs_f64() / pace.interval.as_secs_f64()).min(1.0);
                for d in &mut snapshot.devices {
                    if let (Some(now), Some(&then)) = (d.power.energy_joules, last.energy.get(d.info.uuid.as_str())) {
                        d.power.energy_joules = Some(then + (now - then).max(0.0) * share);
                    }
                }
                return Ok(snapshot.with_duration(started.elapsed()));
            }
            let snapshot = self.whole_tick(request, started)?;
            let origin = *last.origin.get_or_insert(started);
            last.grid = pace.grid_of(started.saturating_duration_since(origin));
            last.at = Some(started);
            for d in &snapshot.devices {
                // Updated in place: a UUID is copied once, not at every tick.
                match (d.power.energy_joules, last.energy.get_mut(d.info.uuid.as_str())) {
                    (Some(e), Some(then)) => *then = e,
                    (Some(e), None) => {
                        last.energy.insert(d.info.uuid.clone(), e);
                    }
                    (None, _) => {
                        last.energy.remove(d.info.uuid.as_str());
                    }
                }
            }
            return Ok(snapshot);
        }
        self.whole_tick(request, started)
    }
}

/// Builds a [`MockSampler`]. Seed precedence: [`seed`](Self::seed), then the scenario's, then
/// the profile's, then [`DEFAULT_SEED`].
#[derive(Debug, Default)]
#[must_use]
pub struct MockSamplerBuilder {
    profile: Option<FleetProfile>,
    scenario: Option<Scenario>,
    seed: Option<u64>,
    faults: Vec<Fault>,
    epoch: Option<SystemTime>,
    start_tick: u64,
    pace: Option<Duration>,
}

impl MockSamplerBuilder {
    /// The fleet (default `h100x8`).
    pub fn profile(mut self, profile: FleetProfile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// The scenario (default `training`).
    pub fn scenario(mut self, scenario: Scenario) -> Self {
        self.scenario = Some(scenario);
        self
    }

    /// The seed for identities and values.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Adds a fault to the scenario's.
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// The instant tick 0 stands for (XID `last_seen`); default: when `build` runs.
    pub fn epoch(mut self, epoch: SystemTime) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// The first tick sampled (default 0).
    pub fn start_tick(mut self, tick: u64) -> Self {
        self.start_tick = tick;
        self
    }

    /// Paces the sampler to an agent sampling every `interval` in real time (the agent and the
    /// Python binding do, on ticks at `origin + k × interval`): a sample taken between two of
    /// those ticks — a flush, the sample at exit, however far into the interval — reads the
    /// coming tick without taking it, its energy counters only as far into the interval as the
    /// time since the last tick. So a run's last, partial interval is not a whole interval of
    /// simulated energy. The first sample sets the origin. Unpaced (the default), every call
    /// is a tick, as tests that step the mock by hand want.
    pub fn paced(mut self, interval: Duration) -> Self {
        self.pace = Some(interval);
        self
    }

    /// Builds the fleet and the sampler.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] if the scenario or a fault names a GPU the fleet lacks.
    pub fn build(self) -> Result<MockSampler, ConfigError> {
        let profile = self.profile.unwrap_or_default();
        let mut scenario = self.scenario.unwrap_or_default();
        scenario.faults.extend(self.faults);
        let seed = self.seed.or(scenario.seed).or(profile.seed).unwrap_or(DEFAULT_SEED);
        let mut fleet = MockFleet::new(&profile, &scenario, seed)?;
        if let Some(epoch) = self.epoch {
            fleet = fleet.with_epoch(epoch);
        }
        let mut sampler = MockSampler::new(fleet);
        sampler.set_tick(self.start_tick);
        sampler.pace = self
            .pace
            .filter(|interval| !interval.is_zero())
            .map(|interval| Pace { interval, last: Mutex::new(LastTick::default()) });
        Ok(sampler)
    }
}
