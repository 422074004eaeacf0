//! stdout sink (placeholder).
