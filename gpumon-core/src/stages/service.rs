//! A stage's background work: what runs beside the agent rather than on the sampling path (the
//! steps socket taking marks from other processes, the kubelet refresher filling the
//! attribution cache), with one start/stop lifecycle for all of them.
//!
//! The stage's [`Processor`](crate::Processor) reads what its service gathered (a registry, a
//! cache) at each tick; the service itself is started once the agent runs and stopped before
//! its last sample, so that what it took in is reported.

use std::any::Any;
use std::fmt::Debug;

/// Background work of a stage, started and stopped with the agent.
///
/// ```
/// use gpumon_core::stages::{Service, ServiceError, Services};
///
/// #[derive(Debug, Default)]
/// struct Ticker { running: bool }
///
/// #[async_trait::async_trait]
/// impl Service for Ticker {
///     fn name(&self) -> &str { "ticker" }
///     fn start(&mut self) -> Result<(), ServiceError> { self.running = true; Ok(()) }
///     async fn stop(&mut self) { self.running = false; }
///     fn is_running(&self) -> bool { self.running }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let mut services = Services::default();
/// services.add(Ticker::default());
/// services.start()?;
/// assert!(services.get::<Ticker>().unwrap().is_running());
/// services.stop().await;
/// assert!(!services.get::<Ticker>().unwrap().is_running());
/// # Ok::<(), ServiceError>(()) }).unwrap();
/// ```
#[async_trait::async_trait]
pub trait Service: Any + Send + Debug {
    /// A short name for logs (`"steps-socket"`).
    fn name(&self) -> &str;

    /// Starts the work on the current tokio runtime; does nothing when already running.
    ///
    /// # Errors
    /// [`ServiceError`] when it cannot start (a socket in use, a client this build lacks).
    fn start(&mut self) -> Result<(), ServiceError>;

    /// Stops the work and releases what it held (a socket file). Does nothing when not running.
    async fn stop(&mut self);

    /// Whether it runs.
    fn is_running(&self) -> bool;

    /// Whether what it took in since the last tick is reported only by one more sample (marks
    /// that arrived on the steps socket): the agent then takes one after stopping it.
    fn reports_at_the_next_tick(&self) -> bool {
        false
    }
}

/// Why a service could not start. Its text is the cause's, which names the setting
/// (`steps.socket: …`, `attribution.kubelet: …`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServiceError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

impl ServiceError {
    /// An error with `cause`.
    pub fn new(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(cause.into())
    }
}

/// The services of an agent's stages, started in the order they were added and stopped in the
/// reverse order.
#[derive(Debug, Default)]
pub struct Services {
    list: Vec<Box<dyn Service>>,
}

impl Services {
    /// Adds `service` (not started).
    pub fn add(&mut self, service: impl Service) {
        self.list.push(Box::new(service));
    }

    /// The service of type `T`, if one was added.
    pub fn get<T: Service>(&self) -> Option<&T> {
        self.list.iter().find_map(|s| (&**s as &dyn Any).downcast_ref::<T>())
    }

    /// Every service's name, in start order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.list.iter().map(|s| s.name())
    }

    /// Whether there is nothing to start.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Starts every service in order. On an error the services already started keep running;
    /// [`Services::stop`] stops them.
    ///
    /// # Errors
    /// The first service that cannot start.
    ///
    /// # Panics
    /// Outside a tokio runtime (services spawn their tasks on it).
    pub fn start(&mut self) -> Result<(), ServiceError> {
        self.list.iter_mut().try_for_each(|s| s.start())
    }

    /// Whether a running service reports what it took in only at the next tick
    /// ([`Service::reports_at_the_next_tick`]): take one last sample after [`Services::stop`].
    pub fn report_at_the_next_tick(&self) -> bool {
        self.list.iter().any(|s| s.is_running() && s.reports_at_the_next_tick())
    }

    /// Stops every service, the last started first.
    pub async fn stop(&mut self) {
        for s in self.list.iter_mut().rev() {
            s.stop().await;
        }
    }
}
