//! Compiles the kubelet pod-resources API (feature `kubelet`) from `proto/` with protox (pure
//! Rust, no `protoc`) and tonic-prost-build. Without the feature this does nothing.

fn main() {
    // Without this line cargo would rerun the script whenever any file of the crate changes.
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "kubelet")]
    if let Err(e) = kubelet::compile() {
        // A build script reports failure by exiting non-zero; the message is what cargo shows.
        eprintln!("error: compiling proto/podresources/v1/api.proto: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "kubelet")]
mod kubelet {
    const PROTO: &str = "proto/podresources/v1/api.proto";

    pub(crate) fn compile() -> Result<(), Box<dyn std::error::Error>> {
        println!("cargo:rerun-if-changed={PROTO}");
        let descriptors = protox::compile([PROTO], ["proto"])?;
        tonic_prost_build::configure()
            .build_client(true)
            // The server is gpumon-mock's test kubelet's; its module only compiles with `kubelet-server`
            // (tonic's server half).
            .build_server(true)
            .server_mod_attribute("v1", r#"#[cfg(feature = "kubelet-server")]"#)
            // Our own connector dials the Unix socket; no `connect(url)` helper over TCP.
            .build_transport(false)
            .compile_fds(descriptors)?;
        Ok(())
    }
}
