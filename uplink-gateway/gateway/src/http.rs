//! The gateway's one HTTP/1.1 request reader and response writer, shared by its two read-only
//! endpoints: `/metrics` ([`crate::metrics`]) and the fleet page ([`crate::page`]).
//!
//! ```text
//! accept ─▶ read_head (≤ MAX_REQUEST_HEAD bytes, up to the blank line) ─▶ Request{method, target}
//!        ─▶ the endpoint's handler ─▶ Response{status, headers, body} ─▶ write, close
//! ```
//!
//! Invariants:
//! - One request per connection, then the connection closes: no keep-alive, no pipelining, no
//!   request body is ever read (both endpoints are read-only).
//! - At most [`MAX_REQUEST_HEAD`] bytes are read per connection, and a connection lives at most
//!   [`CONNECTION_DEADLINE`]: a slow or hostile client holds one task and a small buffer.
//! - A `HEAD` request gets the headers `GET` would get, with no body.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request head read.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// How long one connection may take, from accept to close.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// The request method, as far as a read-only endpoint cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`: `GET` without the body.
    Head,
    /// Anything else (answered `405 Method Not Allowed`).
    Other,
}

/// A request line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Method.
    pub method: Method,
    /// The path, before any `?`.
    pub path: String,
    /// The query string after `?` (empty when none), not decoded.
    pub query: String,
}

impl Request {
    /// Parses the first line of a request head (`GET /path?query HTTP/1.1`); `None` when it is
    /// not a request line.
    pub fn parse(head: &[u8]) -> Option<Self> {
        let line = head.split(|&b| b == b'\r' || b == b'\n').next()?;
        let line = std::str::from_utf8(line).ok()?;
        let mut parts = line.split(' ');
        let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
            return None;
        }
        let method = match method {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            _ => Method::Other,
        };
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Some(Self {
            method,
            path: path.to_owned(),
            query: query.to_owned(),
        })
    }

    /// The decoded value of query parameter `name` (`+` and `%XX` decoded); the first wins.
    pub fn param(&self, name: &str) -> Option<String> {
        self.query
            .split('&')
            .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
            .find(|(key, _)| *key == name)
            .map(|(_, value)| percent_decode(value))
    }
}

/// Decodes `+` and `%XX` of a query value; a malformed escape stays as written.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Encodes `text` for a query value or a path segment: everything but unreserved characters
/// becomes `%XX`.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A response to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status line after the version, e.g. `200 OK`.
    pub status: &'static str,
    /// Headers other than `Content-Length` and `Connection`, which are always written.
    pub headers: Vec<(&'static str, String)>,
    /// Body (left out for `HEAD`).
    pub body: String,
}

impl Response {
    /// A plain-text response.
    pub fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".to_owned())],
            body: body.into(),
        }
    }

    /// `405 Method Not Allowed`, naming the methods a read-only endpoint takes.
    pub fn method_not_allowed() -> Self {
        let mut response = Self::text("405 Method Not Allowed", "read-only: GET or HEAD\n");
        response.headers.push(("Allow", "GET, HEAD".to_owned()));
        response
    }

    /// The bytes on the wire; the body only when `with_body`.
    pub fn to_bytes(&self, with_body: bool) -> Vec<u8> {
        let mut head = format!("HTTP/1.1 {}\r\n", self.status);
        for (name, value) in &self.headers {
            head.push_str(name);
            head.push_str(": ");
            head.push_str(value);
            head.push_str("\r\n");
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = head.into_bytes();
        if with_body {
            bytes.extend_from_slice(self.body.as_bytes());
        }
        bytes
    }
}

/// Why a request head could not be read.
#[derive(Debug)]
pub enum HeadError {
    /// The client closed before the end of the head.
    Closed,
    /// The head is longer than [`MAX_REQUEST_HEAD`].
    TooLarge,
    /// The first line is not a request line.
    Malformed,
    /// Reading failed.
    Io(std::io::Error),
}

/// Reads one request head from `stream` and parses its request line.
pub async fn read_request(stream: &mut TcpStream) -> Result<Request, HeadError> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut chunk).await.map_err(HeadError::Io)?;
        if read == 0 {
            return Err(HeadError::Closed);
        }
        head.extend_from_slice(&chunk[..read]);
        if head.len() > MAX_REQUEST_HEAD {
            return Err(HeadError::TooLarge);
        }
    }
    Request::parse(&head).ok_or(HeadError::Malformed)
}

/// Writes `response` (its body unless the request was `HEAD`) and closes the stream.
pub async fn write_response(
    stream: &mut TcpStream,
    method: Method,
    response: &Response,
) -> std::io::Result<()> {
    stream
        .write_all(&response.to_bytes(method != Method::Head))
        .await?;
    stream.shutdown().await
}

/// Answers one connection: reads its request, lets `handle` answer a GET or HEAD (anything
/// else gets 405), writes the response and closes. Bounded by [`CONNECTION_DEADLINE`].
pub async fn answer<F, Fut>(mut stream: TcpStream, handle: F)
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let _ = tokio::time::timeout(CONNECTION_DEADLINE, async move {
        let (method, response) = match read_request(&mut stream).await {
            Ok(request) if request.method == Method::Other => {
                (Method::Get, Response::method_not_allowed())
            }
            Ok(request) => (request.method, handle(request).await),
            Err(HeadError::TooLarge) => (
                Method::Get,
                Response::text("431 Request Header Fields Too Large", ""),
            ),
            Err(HeadError::Malformed) => (Method::Get, Response::text("400 Bad Request", "")),
            Err(HeadError::Closed | HeadError::Io(_)) => return,
        };
        let _ = write_response(&mut stream, method, &response).await;
    })
    .await;
}

/// Accepts connections on `listener` for ever, answering each in its own task with `handle`.
pub async fn serve<F, Fut>(listener: tokio::net::TcpListener, handle: F)
where
    F: Fn(Request) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(answer(stream, handle));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_line_gives_method_path_and_query() {
        let request = Request::parse(b"GET /machines?sort=site&at=x HTTP/1.1\r\nHost: h\r\n\r\n");
        let request = request.unwrap();
        assert_eq!(request.method, Method::Get);
        assert_eq!(request.path, "/machines");
        assert_eq!(request.param("sort").as_deref(), Some("site"));
        assert_eq!(request.param("at").as_deref(), Some("x"));
        assert_eq!(request.param("none"), None);
        let head = Request::parse(b"HEAD / HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!((head.method, head.query.as_str()), (Method::Head, ""));
        let post = Request::parse(b"POST / HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(post.method, Method::Other);
    }

    #[test]
    fn a_line_that_is_not_a_request_is_refused() {
        for head in [
            &b"GET\r\n\r\n"[..],
            b"GET relative HTTP/1.1\r\n\r\n",
            b"GET / SPDY/3\r\n\r\n",
            b"GET / HTTP/1.1 extra\r\n\r\n",
            b"\xff\xfe / HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(Request::parse(head), None, "{head:?}");
        }
    }

    #[test]
    fn query_values_decode_and_encode_back() {
        assert_eq!(
            percent_decode("2026-01-02T03%3A04%3A05Z"),
            "2026-01-02T03:04:05Z"
        );
        assert_eq!(percent_decode("a+b%2"), "a b%2");
        assert_eq!(percent_decode("%zz%"), "%zz%");
        for text in ["<script>alert(1)</script>", "m-1 ü/\"'&", ""] {
            assert_eq!(percent_decode(&percent_encode(text)), text);
        }
        assert_eq!(percent_encode("a b/<"), "a%20b%2F%3C");
    }

    #[test]
    fn a_head_response_has_the_get_headers_and_no_body() {
        let response = Response::text("200 OK", "hello");
        let get = String::from_utf8(response.to_bytes(true)).unwrap();
        let head = String::from_utf8(response.to_bytes(false)).unwrap();
        assert!(get.ends_with("\r\n\r\nhello"));
        assert_eq!(head, get.strip_suffix("hello").unwrap());
        assert!(head.contains("Content-Length: 5\r\n"));
    }
}
