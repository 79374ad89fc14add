//! The real S3 server (moto, started by `scripts/services.sh start`) and a fault-injecting
//! HTTP proxy in front of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use object_store::aws::{AmazonS3, AmazonS3Builder};

/// The secret key the tests use; no output may ever contain it.
pub const SECRET: &str = "sluice-test-secret-4f9c2e71d0";
pub const ACCESS_KEY: &str = "sluicetestkey";

/// Endpoint of the S3 server; the suite cannot run without it.
pub fn endpoint() -> String {
    std::env::var("SLUICE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_S3_ENDPOINT is not set: the S3 tests need the real S3 server. Run the suite with \
             scripts/test.sh, or `eval \"$(scripts/services.sh start)\"` first"
        )
    })
}

/// Environment for a `sluice` process talking to `endpoint`.
pub fn env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ]
}

/// A fresh bucket with a unique name.
pub fn bucket(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let ep = endpoint();
    let addr = ep.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PUT /{name} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "cannot create bucket {name}: {answer}"
    );
    name
}

/// An object_store client for `bucket` on the real server (for uploads and checks).
pub fn store(bucket: &str) -> AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(endpoint())
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET)
        .build()
        .unwrap()
}

/// What the proxy does to requests.
#[derive(Debug, Default)]
pub struct Faults {
    /// Data reads (ranged GETs starting before `data_limit`) to break by dropping the
    /// connection without an answer, like a server that died mid-request.
    pub drop_data_reads: AtomicU64,
    /// Every request is answered 503 while set.
    pub down: AtomicBool,
    /// Every request is answered as S3 answers for a bucket that does not exist (404
    /// `NoSuchBucket`, the body moto sends) while set: a store back from an outage without
    /// its data.
    pub no_bucket: AtomicBool,
    /// Writes (PUT/POST) after this many are held without an answer until the client goes
    /// away: a store that accepted the connection and never answers.
    pub stall_writes_after: std::sync::Mutex<Option<u64>>,
    /// Writes seen, and writes held.
    pub writes: AtomicU64,
    pub stalled: AtomicU64,
    /// Ranges starting below this byte offset count as data reads (footers are at the end).
    pub data_limit: AtomicU64,
    /// Requests seen, by kind.
    pub lists: AtomicU64,
    pub data_reads: AtomicU64,
    pub requests: AtomicU64,
    pub broken: AtomicU64,
    /// Kinds of requests in arrival order: L list, R ranged GET, H HEAD, G other GET, P PUT/POST.
    pub log: std::sync::Mutex<String>,
    /// Requests signed with this access key id are refused as S3 refuses unknown keys.
    pub reject_key: std::sync::Mutex<Option<String>>,
}

/// An HTTP/1.1 proxy in front of the S3 server that forwards each request on its own
/// upstream connection and can break requests on demand.
pub struct Proxy {
    pub endpoint: String,
    pub faults: Arc<Faults>,
}

impl Proxy {
    pub fn start() -> Proxy {
        let upstream = endpoint().trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let faults = Arc::new(Faults::default());
        let f = faults.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (f, upstream) = (f.clone(), upstream.clone());
                std::thread::spawn(move || serve(conn, &upstream, &f));
            }
        });
        Proxy { endpoint, faults }
    }
}

fn read_head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(head)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn serve(mut conn: TcpStream, upstream: &str, f: &Faults) {
    loop {
        let Some(head) = read_head(&mut conn) else {
            return;
        };
        let head = String::from_utf8_lossy(&head).to_string();
        let len: usize = header(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if conn.read_exact(&mut body).is_err() {
            return;
        }
        f.requests.fetch_add(1, Ordering::SeqCst);
        let request_line = head.lines().next().unwrap_or("").to_string();
        if request_line.contains("list-type=2") {
            f.lists.fetch_add(1, Ordering::SeqCst);
        }
        let kind = if request_line.contains("list-type=2") {
            'L'
        } else if request_line.starts_with("HEAD ") {
            'H'
        } else if request_line.starts_with("GET ") && header(&head, "range").is_some() {
            'R'
        } else if request_line.starts_with("GET ") {
            'G'
        } else {
            'P'
        };
        if let Ok(mut log) = f.log.lock() {
            log.push(kind);
        }
        if kind == 'P' {
            let n = f.writes.fetch_add(1, Ordering::SeqCst);
            if f.stall_writes_after
                .lock()
                .ok()
                .and_then(|k| *k)
                .is_some_and(|k| n >= k)
            {
                f.stalled.fetch_add(1, Ordering::SeqCst);
                // Held until the client closes the connection (or its process ends).
                let _ = conn.read_to_end(&mut Vec::new());
                return;
            }
        }
        let is_data_read = request_line.starts_with("GET ")
            && header(&head, "range")
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|start| start < f.data_limit.load(Ordering::SeqCst));
        if is_data_read {
            f.data_reads.fetch_add(1, Ordering::SeqCst);
            let left = f.drop_data_reads.load(Ordering::SeqCst);
            if left > 0 {
                f.drop_data_reads.fetch_sub(1, Ordering::SeqCst);
                f.broken.fetch_add(1, Ordering::SeqCst);
                let _ = conn.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
        let rejected = f
            .reject_key
            .lock()
            .ok()
            .and_then(|k| k.clone())
            .is_some_and(|k| {
                header(&head, "authorization")
                    .is_some_and(|a| a.contains(&format!("Credential={k}/")))
            });
        if rejected {
            let msg = "<Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>";
            let body = if request_line.starts_with("HEAD ") {
                ""
            } else {
                msg
            };
            let _ = write!(
                conn,
                "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\nContent-Type: application/xml\r\n\r\n{body}",
                msg.len()
            );
            continue;
        }
        if f.no_bucket.load(Ordering::SeqCst) {
            let msg = "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>";
            let body = if request_line.starts_with("HEAD ") {
                ""
            } else {
                msg
            };
            let _ = write!(
                conn,
                "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nContent-Type: application/xml\r\n\r\n{body}",
                body.len()
            );
            continue;
        }
        if f.down.load(Ordering::SeqCst) {
            f.broken.fetch_add(1, Ordering::SeqCst);
            let msg = "<Error><Code>ServiceUnavailable</Code><Message>proxy: server down</Message></Error>";
            let _ = write!(
                conn,
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\nContent-Type: application/xml\r\n\r\n{msg}",
                msg.len()
            );
            continue;
        }
        // Forward on a fresh upstream connection that closes after the answer.
        let Ok(mut up) = TcpStream::connect(upstream) else {
            return;
        };
        let mut forwarded = String::new();
        for line in head.trim_end().lines() {
            if line.to_ascii_lowercase().starts_with("connection:") {
                continue;
            }
            forwarded.push_str(line);
            forwarded.push_str("\r\n");
        }
        forwarded.push_str("Connection: close\r\n\r\n");
        if up.write_all(forwarded.as_bytes()).is_err() || up.write_all(&body).is_err() {
            return;
        }
        let mut answer = Vec::new();
        if up.read_to_end(&mut answer).is_err() {
            return;
        }
        // The upstream said "Connection: close"; tell the client to keep the connection
        // open by removing that header when the answer has a length.
        let text_end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| p + 4)
            .unwrap_or(answer.len());
        let answer_head = String::from_utf8_lossy(&answer[..text_end]).to_string();
        let has_length = header(&answer_head, "content-length").is_some();
        let mut out = String::new();
        for line in answer_head.trim_end().lines() {
            if has_length && line.to_ascii_lowercase().starts_with("connection:") {
                continue;
            }
            out.push_str(line);
            out.push_str("\r\n");
        }
        if !has_length {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        if conn.write_all(out.as_bytes()).is_err() || conn.write_all(&answer[text_end..]).is_err() {
            return;
        }
        if !has_length {
            return;
        }
    }
}
