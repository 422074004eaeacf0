//! A test kubelet (feature `test-kubelet`): a real pod-resources v1 gRPC server on a Unix
//! socket, serving whatever pods a test gives it, and able to be slow, fail, stop and come back.
//! Tests of the kubelet client, the attribution processor and the agent use it in place of a
//! node's kubelet. It lives here, among the test doubles, and not in `gpumon-core`: the core
//! only generates the API's server half (feature `kubelet-server`) that it implements.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use gpumon_mock::kubelet::{container, devices, pod, TestKubelet};
//! use gpumon_core::attribution::kubelet::{list_allocations, KubeletConfig};
//!
//! let dir = std::env::temp_dir().join(format!("gpumon-doc-kubelet-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let kubelet = TestKubelet::start(dir.join("kubelet.sock"))?;
//! kubelet.set_pods([pod("team-a", "train-0", [container("trainer", [devices("nvidia.com/gpu", ["GPU-1"])])])]);
//!
//! let allocations = list_allocations(&KubeletConfig::new(kubelet.socket())).await?;
//! assert_eq!(allocations.owners("GPU-1")[0].pod.as_deref(), Some("train-0"));
//! # drop(kubelet); std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

use gpumon_core::attribution::kubelet::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpumon_core::attribution::kubelet::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};

/// A pod-resources server on a Unix socket. Dropping it stops the server and removes the
/// socket file.
#[derive(Debug)]
pub struct TestKubelet {
    socket: PathBuf,
    state: Arc<State>,
    server: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct State {
    pods: Mutex<Vec<PodResources>>,
    delay: Mutex<Duration>,
    failure: Mutex<Option<(tonic::Code, String)>>,
    calls: AtomicU64,
}

/// Locks `mutex`, ignoring poisoning: a panicking test thread leaves the state as it was.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl TestKubelet {
    /// Listens on `socket` (replacing a stale socket file there) with no pods, inside the
    /// current tokio runtime.
    ///
    /// # Errors
    /// When the socket cannot be bound (no such directory, path too long for a Unix socket).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(socket: impl Into<PathBuf>) -> io::Result<Self> {
        let mut kubelet = Self { socket: socket.into(), state: Arc::default(), server: None };
        kubelet.serve()?;
        Ok(kubelet)
    }

    /// The socket path, for [`KubeletConfig::new`](gpumon_core::attribution::kubelet::KubeletConfig::new).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Replaces what `List` returns.
    pub fn set_pods(&self, pods: impl IntoIterator<Item = PodResources>) {
        *lock(&self.state.pods) = pods.into_iter().collect();
    }

    /// Makes every call wait `delay` before answering (a slow kubelet).
    pub fn set_delay(&self, delay: Duration) {
        *lock(&self.state.delay) = delay;
    }

    /// Makes every call fail with status `code` and `message` (`None`: answer again).
    pub fn set_failure(&self, failure: Option<(tonic::Code, &str)>) {
        *lock(&self.state.failure) = failure.map(|(code, message)| (code, message.to_owned()));
    }

    /// Calls received so far, answered or not.
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::Relaxed)
    }

    /// Stops serving, like a kubelet that died: the socket file stays, so clients get
    /// "connection refused". Returns once the listener is closed.
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            // An aborted task lets go of the listener only when it is next polled.
            let _ = server.await;
        }
    }

    /// Serves again on the same socket with the same pods, like a restarted kubelet (stopping
    /// first if still serving).
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.stop().await;
        self.serve()
    }

    fn serve(&mut self) -> io::Result<()> {
        match std::fs::remove_file(&self.socket) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&self.socket)?;
        let incoming = futures_util::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, listener))
        });
        let service = PodResourcesListerServer::new(Service { state: Arc::clone(&self.state) });
        self.server = Some(tokio::spawn(async move {
            let served = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "test kubelet stopped");
            }
        }));
        Ok(())
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct Service {
    state: Arc<State>,
}

impl Service {
    /// What every call does first: count, wait, fail if told to.
    async fn answer(&self) -> Result<(), Status> {
        self.state.calls.fetch_add(1, Ordering::Relaxed);
        let delay = *lock(&self.state.delay);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match lock(&self.state.failure).clone() {
            Some((code, message)) => Err(Status::new(code, message)),
            None => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.answer().await?;
        Ok(Response::new(ListPodResourcesResponse { pod_resources: lock(&self.state.pods).clone() }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.answer().await?;
        // What is allocated is all this kubelet knows to be allocatable.
        let devices =
            lock(&self.state.pods).iter().flat_map(|p| &p.containers).flat_map(|c| c.devices.iter().cloned()).collect();
        Ok(Response::new(AllocatableResourcesResponse { devices, ..AllocatableResourcesResponse::default() }))
    }

    async fn get(&self, request: Request<GetPodResourcesRequest>) -> Result<Response<GetPodResourcesResponse>, Status> {
        self.answer().await?;
        let wanted = request.into_inner();
        let pod = lock(&self.state.pods)
            .iter()
            .find(|p| p.name == wanted.pod_name && p.namespace == wanted.pod_namespace)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("pod {}/{} not found", wanted.pod_namespace, wanted.pod_name)))?;
        Ok(Response::new(GetPodResourcesResponse { pod_resources: Some(pod) }))
    }
}

/// A pod with its containers.
pub fn pod(namespace: &str, name: &str, containers: impl IntoIterator<Item = ContainerResources>) -> PodResources {
    PodResources {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        containers: containers.into_iter().collect(),
    }
}

/// A container with its devices.
pub fn container(name: &str, devices: impl IntoIterator<Item = ContainerDevices>) -> ContainerResources {
    ContainerResources {
        name: name.to_owned(),
        devices: devices.into_iter().collect(),
        ..ContainerResources::default()
    }
}

/// The devices of one extended resource, as a device plugin allocated them.
pub fn devices<'a>(resource_name: &str, ids: impl IntoIterator<Item = &'a str>) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource_name.to_owned(),
        device_ids: ids.into_iter().map(str::to_owned).collect(),
        topology: None,
    }
}
