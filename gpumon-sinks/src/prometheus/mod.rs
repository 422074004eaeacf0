//! Prometheus sink (placeholder).
