//! Headless Chromium over WebDriver (chromedriver, driven with `fantoccini`), for
//! `tessera bench console` and the console's browser tests
//! (`crates/cli/tests/console.rs`, which include this file).
//!
//! Chromium runs as root here, so it needs `--no-sandbox`; a fresh profile folder
//! and the switches that stop it from reaching the network on its own (updates,
//! sync, QUIC probes) keep each run clean and offline.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

/// Where Chromium and chromedriver are: `TESSERA_CHROMIUM` / `TESSERA_CHROMEDRIVER`,
/// else the first of the usual names on `PATH` (Debian's `chromium` and
/// `chromium-driver` packages).
pub fn tools() -> Result<(PathBuf, PathBuf), String> {
    let find = |env: &str, names: &[&str]| -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        let path = std::env::var_os("PATH")?;
        for dir in std::env::split_paths(&path) {
            for n in names {
                let p = dir.join(n);
                if p.is_file() {
                    return Some(p);
                }
            }
        }
        None
    };
    let chromium = find(
        "TESSERA_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome", "chrome"],
    );
    let driver = find("TESSERA_CHROMEDRIVER", &["chromedriver"])
        .or_else(|| Some(PathBuf::from("/usr/lib/chromium/chromedriver")).filter(|p| p.is_file()));
    match (chromium, driver) {
        (Some(c), Some(d)) => Ok((c, d)),
        (c, d) => Err(format!(
            "headless Chromium is needed ({}{}): on Debian `apt-get install chromium chromium-driver`, \
             or set TESSERA_CHROMIUM and TESSERA_CHROMEDRIVER",
            if c.is_none() { "no chromium" } else { "" },
            if d.is_none() {
                if c.is_none() {
                    ", no chromedriver"
                } else {
                    "no chromedriver"
                }
            } else {
                ""
            }
        )),
    }
}

/// A browser: chromedriver, one session in a fresh profile.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port for chromedriver: {e}"))
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a `width`×`height` window.
    pub async fn start(width: u32, height: u32) -> Result<Browser, String> {
        let (chromium, driver_bin) = tools()?;
        let port = free_port()?;
        let mut driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", driver_bin.display()))?;
        let profile = tempfile::tempdir().map_err(|e| format!("a profile folder: {e}"))?;
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-extensions",
                    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
                    format!("--user-data-dir={}", profile.path().display()),
                    format!("--window-size={width},{height}"),
                ],
            },
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            let mut b =
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
            match b.capabilities(caps.clone()).connect(&url).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => {
                    let _ = driver.kill();
                    return Err(format!(
                        "chromedriver {} did not start a Chromium session: {e}",
                        driver_bin.display()
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        Ok(Browser {
            client,
            driver,
            _profile: profile,
        })
    }

    pub async fn goto(&self, url: &str) -> Result<(), String> {
        self.client
            .goto(url)
            .await
            .map_err(|e| format!("opening {url}: {e}"))
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns its value.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Result<Value, String> {
        self.client
            .execute(script, args)
            .await
            .map_err(|e| format!("script failed: {e}\n{script}"))
    }

    /// Waits until `script` returns something truthy; returns that value.
    pub async fn wait_for(
        &self,
        what: &str,
        script: &str,
        timeout: Duration,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.js(script, vec![]).await?;
            let ok = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if ok {
                return Ok(v);
            }
            if Instant::now() > deadline {
                let page = self
                    .js("return (document.body ? document.body.innerText.slice(0, 2000) : '') + \
                         (window.__console && window.__console.errors.length ? '\\nscript errors: ' + window.__console.errors.join('\\n') : '')", vec![])
                    .await
                    .unwrap_or_default();
                return Err(format!(
                    "timed out after {timeout:?} waiting for {what}; the page says:\n{}",
                    page.as_str().unwrap_or("")
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Sends keys to the focused element.
    pub async fn keys(&self, keys: &str) -> Result<(), String> {
        let el = self
            .client
            .active_element()
            .await
            .map_err(|e| format!("no focused element: {e}"))?;
        el.send_keys(keys)
            .await
            .map_err(|e| format!("sending keys: {e}"))
    }

    /// Takes a screenshot, writes it to `path`, and returns what is in it.
    pub async fn screenshot(&self, path: &Path) -> Result<PngStats, String> {
        let png = self
            .client
            .screenshot()
            .await
            .map_err(|e| format!("screenshot: {e}"))?;
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        std::fs::write(path, &png).map_err(|e| format!("{}: {e}", path.display()))?;
        png_stats(&png).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// What a screenshot holds: its size, how many distinct colours, and the share of
/// pixels that differ from the most common one (the background).
#[derive(Debug, Clone, PartialEq)]
pub struct PngStats {
    pub width: u32,
    pub height: u32,
    pub colours: usize,
    pub not_background: f64,
}

impl PngStats {
    /// Not blank: several colours and a fair amount drawn on the background.
    pub fn has_content(&self) -> bool {
        self.colours >= 8 && self.not_background >= 0.01
    }
}

/// Decodes a PNG and counts its colours.
pub fn png_stats(bytes: &[u8]) -> Result<PngStats, String> {
    let mut dec = png::Decoder::new(std::io::Cursor::new(bytes));
    dec.set_transformations(png::Transformations::normalize_to_color8());
    let mut r = dec.read_info().map_err(|e| format!("not a PNG: {e}"))?;
    let mut buf = vec![0; r.output_buffer_size().ok_or("a PNG too large to decode")?];
    let info = r
        .next_frame(&mut buf)
        .map_err(|e| format!("a bad PNG: {e}"))?;
    let px = match info.color_type {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        png::ColorType::GrayscaleAlpha => 2,
        _ => 1,
    };
    let data = &buf[..info.buffer_size()];
    let mut counts: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
    for p in data.chunks_exact(px) {
        *counts.entry(p).or_default() += 1;
    }
    let total = (data.len() / px).max(1);
    let top = counts.values().copied().max().unwrap_or(0);
    Ok(PngStats {
        width: info.width,
        height: info.height,
        colours: counts.len(),
        not_background: 1.0 - top as f64 / total as f64,
    })
}
