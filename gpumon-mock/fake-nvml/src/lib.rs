//! Fake NVML (placeholder).
