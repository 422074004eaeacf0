//! The page's files, embedded in the binary (no CDN: the page works offline), gzip-compressed
//! once on first request.

use std::io::Write as _;
use std::sync::OnceLock;

use bytes::Bytes;

/// One embedded file.
pub(crate) struct Asset {
    pub(crate) path: &'static str,
    pub(crate) content_type: &'static str,
    pub(crate) bytes: &'static [u8],
    gzip: OnceLock<Bytes>,
}

impl Asset {
    const fn new(path: &'static str, content_type: &'static str, bytes: &'static [u8]) -> Self {
        Self { path, content_type, bytes, gzip: OnceLock::new() }
    }

    /// The file, gzip-compressed (best compression; computed once).
    pub(crate) fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| {
                let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                // Writing to a Vec cannot fail.
                let _ = enc.write_all(self.bytes);
                Bytes::from(enc.finish().unwrap_or_default())
            })
            .clone()
    }
}

pub(crate) static ASSETS: [Asset; 7] = [
    Asset::new("/", "text/html; charset=utf-8", include_bytes!("assets/index.html")),
    Asset::new("/app.js", "text/javascript; charset=utf-8", include_bytes!("assets/app.js")),
    Asset::new("/steps.js", "text/javascript; charset=utf-8", include_bytes!("assets/steps.js")),
    Asset::new("/app.css", "text/css; charset=utf-8", include_bytes!("assets/app.css")),
    Asset::new("/uPlot.iife.min.js", "text/javascript; charset=utf-8", include_bytes!("assets/uPlot.iife.min.js")),
    Asset::new("/uPlot.min.css", "text/css; charset=utf-8", include_bytes!("assets/uPlot.min.css")),
    Asset::new("/licenses.txt", "text/plain; charset=utf-8", include_bytes!("assets/uPlot.LICENSE")),
];

/// The asset served at `path` (`/index.html` is `/`).
pub(crate) fn find(path: &str) -> Option<&'static Asset> {
    let path = if path == "/index.html" { "/" } else { path };
    ASSETS.iter().find(|a| a.path == path)
}

/// Bytes a browser downloads for the page: every asset, gzip-compressed.
pub fn page_weight_gzip() -> usize {
    ASSETS.iter().filter(|a| a.path != "/licenses.txt").map(|a| a.gzip().len()).sum()
}

/// Bytes of the page's assets uncompressed.
pub fn page_weight() -> usize {
    ASSETS.iter().filter(|a| a.path != "/licenses.txt").map(|a| a.bytes.len()).sum()
}
