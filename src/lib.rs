pub use gpumon_core as core;
