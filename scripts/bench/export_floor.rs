//! The floor of the 1 Hz phase: a program that moves the bytes the agent's sinks move, and
//! nothing else.
//!
//! `export_floor <interval_ms> <seconds> <stdout_bytes> <otlp_url> <otlp_bytes> <influx_url>
//! <influx_bytes> <listen_addr> <scrape_bytes>` wakes on a fixed grid like the agent and per tick
//! writes `stdout_bytes` to stdout, POSTs `otlp_bytes` to the OTLP/HTTP receiver and
//! `influx_bytes` to InfluxDB over kept-alive connections (reading each response), while a second
//! thread answers every `GET` on `listen_addr` with `scrape_bytes` (the Prometheus exposition).
//! The sizes are the agent's own for the fleet measured (bench-peers.sh reads them from the
//! agent), the bodies are filler: InfluxDB refuses it (400), the OTLP receiver happens to take
//! it for an unknown protobuf field (200); either way the sender's cost is the same. No
//! sampling, no encoding: its CPU, measured like the agent's, is what the sinks' I/O alone costs
//! on this machine at that rate — the part no encoder change can remove.
//! Built by bench-peers.sh with plain `rustc -O`; no dependencies.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// `http://host:port/path` → (`host:port`, `/path`).
fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("http:// URL");
    match rest.find('/') {
        Some(i) => (rest[..i].to_owned(), rest[i..].to_owned()),
        None => (rest.to_owned(), "/".to_owned()),
    }
}

/// Reads one HTTP response (status line, headers, `Content-Length` body or chunked body without
/// extensions — what the servers used here send; a body delimited by closing the connection is
/// not supported and panics, as does anything else unexpected: this is a benchmark).
fn read_response(r: &mut BufReader<TcpStream>) {
    let mut line = String::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line).expect("response") == 0 {
            panic!("connection closed");
        }
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            length = v.trim().parse().expect("content-length");
        }
        if l.starts_with("transfer-encoding:") && l.contains("chunked") {
            chunked = true;
        }
    }
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line).expect("chunk size");
            let n = usize::from_str_radix(line.trim(), 16).expect("chunk size");
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).expect("chunk");
            if n == 0 {
                break;
            }
        }
    } else {
        let mut body = vec![0; length];
        r.read_exact(&mut body).expect("body");
    }
}

struct Poster {
    reader: BufReader<TcpStream>,
    head: Vec<u8>,
    body: Vec<u8>,
}

impl Poster {
    fn new(url: &str, bytes: usize, content_type: &str) -> Poster {
        let (addr, path) = split_url(url);
        let stream = TcpStream::connect(&addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: {content_type}\r\ncontent-length: {bytes}\r\n\r\n"
        );
        Poster { reader: BufReader::new(stream), head: head.into_bytes(), body: vec![b'x'; bytes] }
    }

    fn post(&mut self) {
        let s = self.reader.get_mut();
        s.write_all(&self.head).expect("send");
        s.write_all(&self.body).expect("send");
        read_response(&mut self.reader);
    }
}

/// Answers every request on every connection with `bytes` of exposition text.
fn serve(listener: TcpListener, bytes: usize) {
    // Exposition-like lines (the scrape loop waits for a body that mentions a GPU).
    let body: Vec<u8> = b"gpu_filler 1\n".iter().copied().cycle().take(bytes).collect();
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {bytes}\r\n\r\n");
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let (head, body) = (head.clone(), body.clone());
        std::thread::spawn(move || {
            let mut w = conn.try_clone().expect("clone");
            let mut r = BufReader::new(conn);
            let mut line = String::new();
            loop {
                // The request line and headers, up to the empty line.
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line.trim_end().is_empty() {
                        break;
                    }
                }
                if w.write_all(head.as_bytes()).and_then(|()| w.write_all(&body)).is_err() {
                    return;
                }
            }
        });
    }
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: export_floor <interval_ms> <seconds> <stdout_bytes> <otlp_url> <otlp_bytes> \
                 <influx_url> <influx_bytes> <listen_addr> <scrape_bytes>";
    assert_eq!(a.len(), 9, "{usage}");
    let num = |i: usize| -> u64 { a[i].parse().expect(usage) };
    let interval = Duration::from_millis(num(0));
    let ticks = num(1) * 1000 / num(0);
    let line = {
        let mut l = vec![b'{'; num(2) as usize];
        *l.last_mut().expect("stdout_bytes > 0") = b'\n';
        l
    };
    let mut otlp = Poster::new(&a[3], num(4) as usize, "application/x-protobuf");
    let mut influx = Poster::new(&a[5], num(6) as usize, "text/plain; charset=utf-8");
    let listener = TcpListener::bind(&a[7]).expect("bind");
    let scrape = num(8) as usize;
    std::thread::spawn(move || serve(listener, scrape));
    let start = Instant::now();
    for n in 0..ticks {
        let due = start + interval * n as u32;
        if let Some(left) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        std::io::stdout().lock().write_all(&line).expect("stdout");
        otlp.post();
        influx.post();
    }
    eprintln!("samples={ticks}");
}
