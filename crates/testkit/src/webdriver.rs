//! A tiny W3C WebDriver client for browser tests: Debian's `chromedriver` started on a
//! free port, headless Debian `chromium`, and the few commands a test needs (navigate,
//! find by CSS, click, type, read text, run a script, screenshot). JSON over HTTP/1.1 on
//! a plain `TcpStream` to localhost, one request a connection.
//!
//! A machine without `chromium` or `chromedriver` gets an error that says what to install
//! ([`Chromedriver::start`]); a test should fail with it, not skip.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The browser Debian's `chromium` package installs.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// The W3C name of an element reference in a WebDriver answer.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

pub type Result<T> = std::result::Result<T, String>;

/// A running `chromedriver` on a free loopback port; killed on drop.
#[derive(Debug)]
pub struct Chromedriver {
    child: Child,
    port: u16,
}

impl Chromedriver {
    /// Starts `chromedriver --port=N` and waits until it is ready. Without the browser or
    /// the driver: an error naming the Debian packages.
    pub fn start() -> Result<Chromedriver> {
        if !Path::new(CHROMIUM).is_file() {
            return Err(format!(
                "{CHROMIUM} is missing: browser tests need Debian's chromium and chromium-driver \
                 (scripts/setup-deps.sh installs them; or apt-get install chromium chromium-driver)"
            ));
        }
        let driver = which("chromedriver").ok_or_else(|| {
            "chromedriver is not on PATH: browser tests need Debian's chromium-driver \
             (scripts/setup-deps.sh installs it; or apt-get install chromium-driver)"
                .to_owned()
        })?;
        let port = crate::free_port();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", driver.display()))?;
        let mut d = Chromedriver { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(v) = d.call("GET", "/status", None) {
                if v["ready"] == true {
                    return Ok(d);
                }
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                return Err(format!("chromedriver exited at start: {status}"));
            }
            if Instant::now() > deadline {
                return Err("chromedriver was not ready within 30 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A new headless browser session, its window `width` x `height`.
    pub fn browser(&self, width: u32, height: u32) -> Result<Browser> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         format!("--window-size={width},{height}"), "--lang=en-US"],
            },
        }}});
        let v = self.call("POST", "/session", Some(&caps))?;
        let session = v["sessionId"].as_str().ok_or_else(|| format!("no sessionId in {v}"))?.to_owned();
        Ok(Browser { port: self.port, session })
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        call(self.port, method, path, body)
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An element of the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(String);

/// One browser session; closed on drop.
#[derive(Debug)]
pub struct Browser {
    port: u16,
    session: String,
}

impl Browser {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        call(self.port, method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn navigate(&self, url: &str) -> Result<()> {
        self.call("POST", "/url", Some(&json!({ "url": url }))).map(drop)
    }

    /// The elements `css` selects now (none: empty).
    pub fn find_all(&self, css: &str) -> Result<Vec<Element>> {
        let v = self.call("POST", "/elements", Some(&json!({"using": "css selector", "value": css})))?;
        Ok(v.as_array()
            .map(|a| a.iter().filter_map(|e| e[ELEMENT_KEY].as_str()).map(|id| Element(id.to_owned())).collect())
            .unwrap_or_default())
    }

    /// The first element `css` selects, waiting up to `timeout` for one.
    pub fn find(&self, css: &str, timeout: Duration) -> Result<Element> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.find_all(css)?.into_iter().next() {
                return Ok(e);
            }
            if Instant::now() > deadline {
                return Err(format!("no element {css} within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn click(&self, e: &Element) -> Result<()> {
        self.call("POST", &format!("/element/{}/click", e.0), Some(&json!({}))).map(drop)
    }

    pub fn send_keys(&self, e: &Element, text: &str) -> Result<()> {
        self.call("POST", &format!("/element/{}/value", e.0), Some(&json!({ "text": text }))).map(drop)
    }

    /// The element's rendered text.
    pub fn text(&self, e: &Element) -> Result<String> {
        let v = self.call("GET", &format!("/element/{}/text", e.0), None)?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }

    /// Waits until the text of the first element `css` selects satisfies `want`; the text.
    pub fn wait_text(&self, css: &str, timeout: Duration, want: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        loop {
            if let Some(e) = self.find_all(css)?.into_iter().next() {
                // The element may be replaced between the find and the read.
                if let Ok(t) = self.text(&e) {
                    if want(&t) {
                        return Ok(t);
                    }
                    last = t;
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{css} never had the text wanted within {timeout:?}; last: {last:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns its value.
    pub fn execute(&self, script: &str, args: &[Value]) -> Result<Value> {
        self.call("POST", "/execute/sync", Some(&json!({ "script": script, "args": args })))
    }

    /// A PNG of the viewport, written to `path`.
    pub fn screenshot(&self, path: &Path) -> Result<()> {
        let v = self.call("GET", "/screenshot", None)?;
        let png = base64_decode(v.as_str().ok_or("a screenshot that is not a string")?)?;
        std::fs::write(path, png).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = call(self.port, "DELETE", &format!("/session/{}", self.session), None);
    }
}

/// One WebDriver command: its `value`, or the driver's error and message.
fn call(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("chromedriver: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120))).map_err(|e| e.to_string())?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).map_err(|e| format!("chromedriver: {e}"))?;
    // chromedriver keeps the connection open: read the headers, then Content-Length bytes.
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let split = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = s.read(&mut buf).map_err(|e| format!("chromedriver: {e}"))?;
        if n == 0 {
            return Err("chromedriver: an answer without headers".to_owned());
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let mut payload = raw[split + 4..].to_vec();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim() == "content-length")
        .and_then(|(_, v)| v.trim().parse::<usize>().ok());
    match length {
        Some(length) => {
            while payload.len() < length {
                let n = s.read(&mut buf).map_err(|e| format!("chromedriver: {e}"))?;
                if n == 0 {
                    return Err(format!("chromedriver: the answer ends after {} of {length} bytes", payload.len()));
                }
                payload.extend_from_slice(&buf[..n]);
            }
        }
        None if head.contains("transfer-encoding: chunked") => {
            while !payload.ends_with(b"0\r\n\r\n") {
                let n = s.read(&mut buf).map_err(|e| format!("chromedriver: {e}"))?;
                if n == 0 {
                    break;
                }
                payload.extend_from_slice(&buf[..n]);
            }
            payload = dechunk(&payload)?;
        }
        None => {
            s.read_to_end(&mut payload).map_err(|e| format!("chromedriver: {e}"))?;
        }
    }
    let v: Value = serde_json::from_slice(&payload).map_err(|e| {
        format!("chromedriver answered {method} {path} with no JSON ({e}): {}", String::from_utf8_lossy(&payload))
    })?;
    let value = v.get("value").cloned().unwrap_or(Value::Null);
    if let Some(error) = value.get("error").and_then(Value::as_str) {
        return Err(format!("{method} {path}: {error}: {}", value["message"].as_str().unwrap_or_default()));
    }
    Ok(value)
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = body.windows(2).position(|w| w == b"\r\n").ok_or("a chunk without its size line")?;
        let size = usize::from_str_radix(String::from_utf8_lossy(&body[..line]).trim(), 16)
            .map_err(|e| format!("a bad chunk size: {e}"))?;
        body = &body[line + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(body.get(..size).ok_or("a chunk shorter than its size")?);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let value = |c: u8| -> Result<u32> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("not base64: {:?}", c as char)),
        } as u32)
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for group in clean.chunks(4) {
        let mut n = 0u32;
        for (i, c) in group.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..group.len()]);
    }
    Ok(out)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).map(|p| p.join(name)).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8h").unwrap(), b"hello!");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("iVBORw0KGgo=").unwrap(), b"\x89PNG\r\n\x1a\n");
        assert!(base64_decode("a$b=").is_err());
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(), b"abcde");
    }
}
