//! Asks the kubelet once which GPUs (and MIG devices) are allocated to which pods, as the
//! agent's attribution does every 10 s:
//!
//! ```text
//! cargo run -p gpumon-core --features kubelet --example kubelet_allocations -- \
//!     [SOCKET (default /var/lib/kubelet/pod-resources/kubelet.sock)] [EXTRA_RESOURCE_NAME…]
//! ```
//!
//! Run it on a Kubernetes node as root (or inside a pod with the host's
//! `/var/lib/kubelet/pod-resources` mounted).

use gpumon_core::attribution::kubelet::{list_allocations, KubeletConfig, DEFAULT_SOCKET};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let mut config = KubeletConfig::new(args.next().unwrap_or_else(|| DEFAULT_SOCKET.to_owned()));
    for name in args {
        config = config.with_resource_name(name);
    }
    match list_allocations(&config).await {
        Ok(allocations) => {
            let mut rows: Vec<_> = allocations.iter().collect();
            rows.sort_by_key(|(uuid, _)| *uuid);
            println!("{} device(s) allocated to pods", rows.len());
            for (uuid, owners) in rows {
                for owner in owners {
                    let name = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
                    println!("{uuid}\t{}/{}\t{}", name(&owner.namespace), name(&owner.pod), name(&owner.container));
                }
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
