//! Gives the cdylib the SONAME `libnvidia-ml.so.1`, so C programs linked against it (through a
//! `libnvidia-ml.so` symlink) load it under NVIDIA's name at run time.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
