//! InfluxDB sink (placeholder).
