//! Raw HTTP/1.1 over a TCP connection, shared by the web view's unit tests and the tenancy tests
//! (`#[path]`-included, not a test crate): no client library, so a test sees exactly what the
//! server sends.
#![allow(dead_code)] // each includer uses its own subset

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response read to the end: the status, the head (status line and headers) and the body.
pub struct Reply<B = Vec<u8>> {
    pub status: u16,
    pub head: String,
    pub body: B,
}

impl<B> Reply<B> {
    /// The first `name` header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers(name).into_iter().next()
    }

    /// Every `name` header's value, in order.
    pub fn headers(&self, name: &str) -> Vec<&str> {
        self.head
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim())
            })
            .collect()
    }
}

impl Reply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The reply with its body as UTF-8 text (panics when it is not).
    pub fn into_text(self) -> Reply<String> {
        Reply { status: self.status, head: self.head, body: String::from_utf8(self.body).unwrap() }
    }
}

/// One HTTP/1.1 request with `Connection: close` and `headers` (whole lines), read to the end.
pub async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[impl AsRef<str>]) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h.as_ref());
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await.unwrap().unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete head");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Reply { status, head, body: raw[split + 4..].to_vec() }
}

/// Reads a live stream until `want` has been seen (or panics after 10 s).
pub async fn read_until(s: &mut TcpStream, seen: &mut String, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 16384];
    while !seen.contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {want} in {seen}"))
            .unwrap();
        assert!(n > 0, "stream ended before {want}: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}
