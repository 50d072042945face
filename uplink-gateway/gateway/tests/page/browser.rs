//! Headless Chromium driven over the DevTools protocol, for the fleet page's browser tests.
//!
//! Chromium starts with `--remote-debugging-port=0` and writes the port it chose, and the
//! browser's websocket path, to `DevToolsActivePort` in its profile directory; one websocket to
//! the browser carries every command, a page's through its flattened session id. Events that
//! arrive while waiting for a reply are kept: console calls, exceptions and log entries (a
//! Content-Security-Policy violation is a log entry of level "error").
//!
//! Where Chromium is missing, [`Browser::start`] says why; a test SKIPs with that reason, or
//! fails when `EDGEWATCH_REQUIRE_CHROMIUM` is set (CI, whose test command installs it).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// How long one command may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// The Chromium binary: `$EDGEWATCH_CHROMIUM`, else `chromium` or `chromium-browser` on `PATH`.
fn chromium() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("EDGEWATCH_CHROMIUM") {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err("no chromium on PATH (Debian package `chromium`; .ci/test installs it)".to_owned())
}

/// A browser, or `None` after printing why the test is skipped; panics where Chromium is
/// required (`EDGEWATCH_REQUIRE_CHROMIUM`).
pub fn browser_or_skip(test: &str) -> Option<Browser> {
    match Browser::start() {
        Ok(browser) => Some(browser),
        Err(reason) if std::env::var_os("EDGEWATCH_REQUIRE_CHROMIUM").is_some() => {
            panic!("{test}: Chromium is required here: {reason}")
        }
        Err(reason) => {
            // The skip is reported, never silent: the runner shows the test's output.
            #[allow(clippy::print_stdout)]
            {
                println!("SKIP {test}: {reason}");
            }
            None
        }
    }
}

/// What the page said while loading or running: console errors, exceptions, error log entries.
#[derive(Debug, Clone, PartialEq)]
pub struct Complaint {
    pub method: String,
    pub text: String,
}

pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    socket: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    events: Vec<Value>,
}

impl Browser {
    pub fn start() -> Result<Self, String> {
        let binary = chromium()?;
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        let child = Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let mut browser_child = ChildGuard(Some(child));
        let (port, path) = active_port(profile.path(), Duration::from_secs(30))?;
        let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let (socket, _) = tungstenite::client(format!("ws://127.0.0.1:{port}{path}"), stream)
            .map_err(|e| format!("DevTools websocket: {e}"))?;
        let mut browser = Self {
            child: browser_child.0.take().ok_or("no child")?,
            _profile: profile,
            socket,
            session: String::new(),
            next_id: 0,
            events: Vec::new(),
        };
        let target = browser.call_browser("Target.createTarget", json!({"url": "about:blank"}))?;
        let target_id = target["targetId"].as_str().ok_or("no targetId")?.to_owned();
        let attached = browser.call_browser(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        )?;
        browser.session = attached["sessionId"]
            .as_str()
            .ok_or("no sessionId")?
            .to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({}))?;
        }
        Ok(browser)
    }

    fn send(
        &mut self,
        method: &str,
        params: Value,
        session: Option<&str>,
    ) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .map_err(|e| format!("{method}: {e}"))?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        while Instant::now() < deadline {
            let value = self.receive()?;
            if value["id"] == json!(id) {
                if let Some(error) = value.get("error") {
                    return Err(format!("{method}: {error}"));
                }
                return Ok(value["result"].clone());
            }
            if value.get("method").is_some() {
                self.events.push(value);
            }
        }
        Err(format!("{method}: no reply"))
    }

    fn receive(&mut self) -> Result<Value, String> {
        loop {
            match self.socket.read().map_err(|e| e.to_string())? {
                Message::Text(text) => {
                    return serde_json::from_str(text.as_str()).map_err(|e| e.to_string());
                }
                Message::Close(_) => return Err("the browser closed the connection".into()),
                _ => {}
            }
        }
    }

    fn call_browser(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.send(method, params, None)
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let session = self.session.clone();
        self.send(method, params, Some(&session))
    }

    /// Waits for event `method` of the page (one already received counts, and is consumed).
    pub fn wait_event(&mut self, method: &str) -> Result<Value, String> {
        if let Some(at) = self.events.iter().position(|e| e["method"] == method) {
            return Ok(self.events.remove(at));
        }
        let deadline = Instant::now() + REPLY_TIMEOUT;
        while Instant::now() < deadline {
            let value = self.receive()?;
            if value["method"] == method {
                return Ok(value);
            }
            if value.get("method").is_some() {
                self.events.push(value);
            }
        }
        Err(format!("no {method}"))
    }

    /// Sets the viewport (CSS pixels).
    pub fn viewport(&mut self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )
        .unwrap();
    }

    /// Loads `url` and waits for its load event.
    pub fn open(&mut self, url: &str) {
        self.events.retain(|e| e["method"] != "Page.loadEventFired");
        let reply = self.call("Page.navigate", json!({"url": url})).unwrap();
        assert!(reply.get("errorText").is_none(), "{url}: {reply}");
        self.wait_event("Page.loadEventFired").unwrap();
    }

    /// Runs `action` (which navigates, e.g. a click) and waits for the next load event.
    pub fn navigate_by(&mut self, action: &str) {
        self.events.retain(|e| e["method"] != "Page.loadEventFired");
        self.eval(action);
        self.wait_event("Page.loadEventFired").unwrap();
    }

    /// The value of a JavaScript expression in the page (Runtime.evaluate is not subject to the
    /// page's CSP).
    pub fn eval(&mut self, expression: &str) -> Value {
        let reply = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .unwrap();
        assert!(
            reply.get("exceptionDetails").is_none(),
            "{expression}: {reply}"
        );
        reply["result"]["value"].clone()
    }

    /// Console errors, exceptions and error log entries since the last call, after a round
    /// trip that lets pending events arrive.
    pub fn complaints(&mut self) -> Vec<Complaint> {
        self.eval("0");
        let events = std::mem::take(&mut self.events);
        events
            .into_iter()
            .filter_map(|e| {
                let method = e["method"].as_str().unwrap_or_default().to_owned();
                let p = &e["params"];
                let text = match method.as_str() {
                    "Runtime.consoleAPICalled" if p["type"] == "error" || p["type"] == "assert" => {
                        p["args"].to_string()
                    }
                    "Runtime.exceptionThrown" => p["exceptionDetails"].to_string(),
                    "Log.entryAdded" if p["entry"]["level"] == "error" => {
                        p["entry"]["text"].to_string()
                    }
                    _ => return None,
                };
                Some(Complaint { method, text })
            })
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills the browser if start-up fails half-way.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Port and browser websocket path from `DevToolsActivePort`, once Chromium wrote both lines.
fn active_port(profile: &Path, timeout: Duration) -> Result<(u16, String), String> {
    let file = profile.join("DevToolsActivePort");
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next())
                && let Ok(port) = port.trim().parse()
            {
                return Ok((port, path.trim().to_owned()));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "Chromium wrote no {} within {timeout:?}",
        file.display()
    ))
}
