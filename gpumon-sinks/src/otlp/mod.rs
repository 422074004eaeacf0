//! OTLP sink (placeholder).
