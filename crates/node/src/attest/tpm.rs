//! The node's side: its TPM, driven through `tpm2-tools` (the TCG's reference tools,
//! as Keylime's agent long did). A TPM is optional, so the tools are a run-time need of
//! nodes that attest and never a build-time one of the binary (which is why this is
//! not `tss-esapi`: that would make libtss2 a dependency of every `tessera`).
//!
//! The TPM is named by a TCTI string, as tpm2-tools take it: `device:/dev/tpmrm0` on a
//! real machine, `swtpm:host=127.0.0.1,port=2321` for a software TPM ([`Swtpm`]).
//! The keys live at persistent handles [`EK_HANDLE`] and [`AK_HANDLE`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use super::{Evidence, Identity, MEASURE_PCR, Measurement, hex};

/// The persistent handle of the endorsement key (the TCG's default RSA EK handle).
pub const EK_HANDLE: &str = "0x81010001";
/// The persistent handle of Tessera's attestation key.
pub const AK_HANDLE: &str = "0x81010002";

/// A TPM operation failed; the message names the tool and what it said.
#[derive(Debug, thiserror::Error)]
pub enum TpmError {
    #[error(
        "{tool} is not installed: node attestation drives the TPM with tpm2-tools (apt install tpm2-tools)"
    )]
    NoTools { tool: String },
    #[error("{tool} failed ({status}): {stderr}")]
    Tool {
        tool: String,
        status: String,
        stderr: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Output(String),
}

/// One TPM, serialised (tpm2-tools use files in `dir`; a TPM without a resource
/// manager holds few objects at once).
#[derive(Debug)]
pub struct Tpm {
    tcti: String,
    dir: PathBuf,
    lock: Mutex<Vec<Measurement>>,
}

impl Tpm {
    /// The TPM at `tcti`, with its scratch files in `dir` (created).
    pub fn open(tcti: &str, dir: &Path) -> Result<Tpm, TpmError> {
        std::fs::create_dir_all(dir).map_err(|source| TpmError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let t = Tpm {
            tcti: tcti.to_string(),
            dir: dir.to_path_buf(),
            lock: Mutex::new(Vec::new()),
        };
        t.run("tpm2_getcap", &["properties-fixed"])?;
        Ok(t)
    }

    /// The TCTI this TPM was opened with.
    pub fn tcti(&self) -> &str {
        &self.tcti
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn path(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }

    /// Runs one tool against the TPM; stdout on success. Transient objects and
    /// sessions are flushed after it (a TPM without a resource manager runs out of
    /// object slots otherwise).
    fn run(&self, tool: &str, args: &[&str]) -> Result<String, TpmError> {
        let out = self.raw(tool, args);
        if !self.tcti.starts_with("device:/dev/tpmrm") {
            let _ = self.raw("tpm2_flushcontext", &["-t"]);
            let _ = self.raw("tpm2_flushcontext", &["-s"]);
        }
        out
    }

    fn raw(&self, tool: &str, args: &[&str]) -> Result<String, TpmError> {
        let out = Command::new(tool)
            .args(args)
            .env("TPM2TOOLS_TCTI", &self.tcti)
            .current_dir(&self.dir)
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => TpmError::NoTools {
                    tool: tool.to_string(),
                },
                _ => TpmError::Io {
                    what: format!("running {tool}"),
                    source: e,
                },
            })?;
        if !out.status.success() {
            return Err(TpmError::Tool {
                tool: tool.to_string(),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn read(&self, name: &str) -> Result<Vec<u8>, TpmError> {
        std::fs::read(self.file(name)).map_err(|source| TpmError::Io {
            what: format!("reading {}", self.file(name).display()),
            source,
        })
    }

    /// The node's keys, made on first use: the EK (the TCG default RSA template) and
    /// an ECDSA P-256 restricted signing AK under it, both made persistent.
    pub fn identity(&self) -> Result<Identity, TpmError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let ek = self.path("ek.pub");
        if self
            .run("tpm2_readpublic", &["-c", EK_HANDLE, "-o", &ek])
            .is_err()
        {
            self.run("tpm2_createek", &["-c", EK_HANDLE, "-G", "rsa", "-u", &ek])?;
        }
        let ak = self.path("ak.pub");
        if self
            .run("tpm2_readpublic", &["-c", AK_HANDLE, "-o", &ak])
            .is_err()
        {
            let ctx = self.path("ak.ctx");
            self.run(
                "tpm2_createak",
                &[
                    "-C",
                    EK_HANDLE,
                    "-c",
                    &ctx,
                    "-G",
                    "ecc",
                    "-g",
                    "sha256",
                    "-s",
                    "ecdsa",
                    "-u",
                    &ak,
                    "-r",
                    &self.path("ak.priv"),
                ],
            )?;
            self.run("tpm2_evictcontrol", &["-C", "o", "-c", &ctx, AK_HANDLE])?;
        }
        Ok(Identity {
            ek_public: hex(&self.read("ek.pub")?),
            ak_public: hex(&self.read("ak.pub")?),
        })
    }

    /// Answers the verifier's challenge: decrypts `credential` (tpm2-tools' file
    /// format, made by [`super::credential::make_credential`]) with the EK, which the
    /// TPM does only for the AK whose name it was bound to.
    pub fn activate(&self, credential: &[u8]) -> Result<Vec<u8>, TpmError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let cred = self.file("cred.in");
        std::fs::write(&cred, credential).map_err(|source| TpmError::Io {
            what: format!("writing {}", cred.display()),
            source,
        })?;
        let s = self.path("session.ctx");
        let out = self.path("cred.out");
        // One policy session for the EK's PolicySecret(endorsement); not flushed
        // between the three tools.
        let r = (|| {
            self.raw("tpm2_startauthsession", &["--policy-session", "-S", &s])?;
            self.raw("tpm2_policysecret", &["-S", &s, "-c", "e"])?;
            self.raw(
                "tpm2_activatecredential",
                &[
                    "-c",
                    AK_HANDLE,
                    "-C",
                    EK_HANDLE,
                    "-i",
                    &cred.display().to_string(),
                    "-o",
                    &out,
                    "-P",
                    &format!("session:{s}"),
                ],
            )
        })();
        let _ = self.run("tpm2_flushcontext", &[&s]);
        r?;
        let secret = self.read("cred.out");
        let _ = std::fs::remove_file(self.file("cred.out"));
        secret
    }

    /// Starts the measurement log afresh: PCR [`MEASURE_PCR`] reset, then extended with
    /// each measurement in order.
    pub fn measure(&self, log: &[Measurement]) -> Result<(), TpmError> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        g.clear();
        self.run("tpm2_pcrreset", &[&MEASURE_PCR.to_string()])?;
        log.iter().try_for_each(|m| self.extend_log(&mut g, m))
    }

    /// Extends one more measurement onto the log.
    pub fn extend(&self, m: &Measurement) -> Result<(), TpmError> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.extend_log(&mut g, m)
    }

    /// Extends PCR [`MEASURE_PCR`] with `m` and appends it to `log` (held locked).
    fn extend_log(&self, log: &mut Vec<Measurement>, m: &Measurement) -> Result<(), TpmError> {
        let d = m
            .digest
            .strip_prefix("sha256:")
            .ok_or_else(|| TpmError::Output(format!("measurement {} is not sha256", m.name)))?;
        self.run("tpm2_pcrextend", &[&format!("{MEASURE_PCR}:sha256={d}")])?;
        log.push(m.clone());
        Ok(())
    }

    /// A quote over the boot PCRs and [`MEASURE_PCR`] with `nonce`, signed by the AK,
    /// with the PCR values it covers and the measurement log.
    pub fn quote(&self, nonce: &[u8]) -> Result<Evidence, TpmError> {
        let g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let list: Vec<String> = super::quote::quoted_pcrs()
            .iter()
            .map(|i| i.to_string())
            .collect();
        let sel = format!("sha256:{}", list.join(","));
        let stdout = self.run(
            "tpm2_quote",
            &[
                "-c",
                AK_HANDLE,
                "-l",
                &sel,
                "-q",
                &hex(nonce),
                "-m",
                &self.path("quote.msg"),
                "-s",
                &self.path("quote.sig"),
                "-o",
                &self.path("quote.pcrs"),
                "-g",
                "sha256",
            ],
        )?;
        let pcrs = parse_pcr_lines(&stdout);
        if pcrs.len() != list.len() {
            return Err(TpmError::Output(format!(
                "tpm2_quote reported {} PCR values, {} were asked for",
                pcrs.len(),
                list.len()
            )));
        }
        Ok(Evidence {
            quote: hex(&self.read("quote.msg")?),
            signature: hex(&self.read("quote.sig")?),
            pcrs,
            log: g.clone(),
        })
    }
}

/// The `  N : 0xHEX` lines tpm2_quote prints for the PCRs it quoted.
fn parse_pcr_lines(s: &str) -> std::collections::BTreeMap<u32, String> {
    s.lines()
        .filter_map(|l| {
            let (i, v) = l.split_once(':')?;
            let i = i.trim().parse::<u32>().ok()?;
            let v = v.trim().strip_prefix("0x")?;
            (v.len() == 64).then(|| (i, v.to_ascii_lowercase()))
        })
        .collect()
}

/// Stops the swtpm a previous server left serving `state` (one killed with SIGKILL
/// cannot stop its child; the survivor holds the state's lock, and a new swtpm on it
/// would fail "Could not lock access to lockfile"). Only a process whose command line
/// is swtpm's and names this folder is stopped.
fn stop_stale(state: &Path) {
    let Ok(pid) = std::fs::read_to_string(state.join("swtpm.pid")) else {
        return;
    };
    let Ok(pid) = pid.trim().parse::<i32>() else {
        return;
    };
    let ours = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        let c = String::from_utf8_lossy(&c);
        c.starts_with("swtpm") && c.contains(&state.display().to_string())
    });
    if !ours {
        return;
    }
    let p = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
    for _ in 0..200 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A software TPM for tests and benchmarks: `swtpm` manufactured into a temporary
/// state folder, serving on two free local TCP ports; killed on drop.
#[derive(Debug)]
pub struct Swtpm {
    child: std::process::Child,
    port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl Swtpm {
    /// Whether `swtpm`, `swtpm_setup` and tpm2-tools are installed.
    pub fn available() -> bool {
        ["swtpm", "swtpm_setup", "tpm2_quote"]
            .iter()
            .all(|t| which(t).is_some())
    }

    /// Manufactures and starts a fresh software TPM (its state in a temporary folder).
    pub fn start() -> Result<Swtpm, TpmError> {
        let dir = tempfile::tempdir().map_err(|source| TpmError::Io {
            what: "making the swtpm state folder".into(),
            source,
        })?;
        let mut sw = Self::start_in(dir.path())?;
        sw._dir = Some(dir);
        Ok(sw)
    }

    /// Starts a software TPM whose state lives in `state` (manufactured there on
    /// first use), so its keys outlive a restart.
    pub fn start_in(state: &Path) -> Result<Swtpm, TpmError> {
        std::fs::create_dir_all(state).map_err(|source| TpmError::Io {
            what: format!("creating {}", state.display()),
            source,
        })?;
        let manufactured = state.join("tpm2-00.permall").is_file();
        stop_stale(state);
        let state = state.display().to_string();
        if !manufactured {
            Self::manufacture(&state)?;
        }
        Self::serve(&state)
    }

    fn manufacture(state: &str) -> Result<(), TpmError> {
        let setup = Command::new("swtpm_setup")
            .args(["--tpm2", "--tpmstate", state, "--createek", "--overwrite"])
            .output()
            .map_err(|source| TpmError::Io {
                what: "running swtpm_setup".into(),
                source,
            })?;
        if !setup.status.success() {
            return Err(TpmError::Tool {
                tool: "swtpm_setup".into(),
                status: setup.status.to_string(),
                stderr: String::from_utf8_lossy(&setup.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    fn serve(state: &str) -> Result<Swtpm, TpmError> {
        let mut last = None;
        for _ in 0..20 {
            let port = free_port_pair();
            let mut child = Command::new("swtpm")
                .args([
                    "socket",
                    "--tpm2",
                    "--tpmstate",
                    &format!("dir={state}"),
                    "--server",
                    &format!("type=tcp,port={port},bindaddr=127.0.0.1"),
                    "--ctrl",
                    &format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1),
                    "--flags",
                    "not-need-init,startup-clear",
                    "--pid",
                    &format!("file={state}/swtpm.pid"),
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|source| TpmError::Io {
                    what: "starting swtpm".into(),
                    source,
                })?;
            for _ in 0..200 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Ok(Swtpm {
                        child,
                        port,
                        _dir: None,
                    });
                }
                if let Ok(Some(st)) = child.try_wait() {
                    last = Some(st.to_string());
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        Err(TpmError::Output(format!(
            "swtpm did not start listening ({})",
            last.unwrap_or_else(|| "timed out".into())
        )))
    }

    /// The TCTI naming it.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port_pair() -> u16 {
    loop {
        let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", 0)) else {
            continue;
        };
        let Ok(a) = l.local_addr() else { continue };
        let p = a.port();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_pcr_lines_are_read() {
        let s = "pcrs:\n  sha256:\n    0 : 0x00000000000000000000000000000000000000000000000000000000000000AA\n    23: 0x9851312028952521510E8EAAB5BE94E7DC24B5FC292B2E9781173CF11FFA9878\ncalcDigest: d5ac\n";
        let m = super::parse_pcr_lines(s);
        assert_eq!(m.len(), 2);
        assert!(m[&0].ends_with("aa"));
        assert!(m[&23].starts_with("9851"));
    }
}
