//! `tessera bench trust`: the trust chain's costs on this machine.
//!
//! - **verify**: a template's admission under a `require_signed` policy (the
//!   Sigstore bundle's signature over its manifest), P-256 and Ed25519 side by side.
//! - **attestation**: a round trip against a software TPM (swtpm): the TPM's quote
//!   over a fresh nonce, and the verifier's pure check of it, apart.
//! - **release**: a weights key release as the node runtime does it (the key
//!   service's nonce, an ephemeral key, the TPM's quote over both, the service's
//!   checks and wrapping, the node's unwrap), end to end.
//! - **decrypt**: the sealed format's throughput on one core, beside sealing and a
//!   plain copy of the same bytes (the floor), and, as root, the whole delivery into
//!   a sandbox's memory-backed folder (decrypt, pipe, ramfs), first and best of
//!   three (the first pays for memory the machine hands out for the first time).
//!
//! The TPM parts need `swtpm` and `tpm2-tools`; without them they are left out and
//! the report says so.

use std::time::Instant;

use serde::Serialize;
use serde_json::json;
use tessera_node::attest::{Measurement, Reference, Tpm, tpm::Swtpm};
use tessera_node::weights::{ReleaseRequest, format, wrap};
use tessera_sandbox::trust::{
    Candidate, KeyKind, SigningKey, StoredBundle, Subject, TrustPolicy, generate_key,
};
use tessera_store::{AnyStore, Key, Store};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json, print_text};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Runs of each latency measure (the TPM ones: a fifth of this, at least 5).
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// MiB sealed and opened for the throughput measures.
    #[arg(long, default_value_t = 1024)]
    pub mib: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Stat {
    runs: usize,
    p50_ms: f64,
    p99_ms: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(f64::total_cmp);
    Stat {
        runs: v.len(),
        p50_ms: super::percentile(&v, 0.5).unwrap_or(f64::NAN),
        p99_ms: super::percentile(&v, 0.99).unwrap_or(f64::NAN),
    }
}

fn time<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64() * 1e3)
}

#[derive(Debug, Serialize)]
struct Throughput {
    what: &'static str,
    mib: usize,
    gib_per_second: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    verify_p256: Stat,
    verify_ed25519: Stat,
    #[serde(skip_serializing_if = "Option::is_none")]
    tpm_quote: Option<Stat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quote_verify: Option<Stat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_release: Option<Stat>,
    throughput: Vec<Throughput>,
    notes: Vec<String>,
}

pub fn run(a: Args) -> i32 {
    if a.runs == 0 || a.mib == 0 {
        return fail(EXIT_BAD_INPUT, "--runs and --mib must be at least 1");
    }
    match measure(&a) {
        Ok(r) if a.json => print_json(&r),
        Ok(r) => print_text(&render(&r)),
        Err(e) => fail(EXIT_FAILURE, e),
    }
}

fn verify_runs(kind: KeyKind, runs: usize) -> Result<Stat, String> {
    let (private, public) = generate_key(kind).map_err(|e| e.to_string())?;
    let key = SigningKey::from_pem(&private).map_err(|e| e.to_string())?;
    let indented: String = public.lines().map(|l| format!("      {l}\n")).collect();
    let text = format!(
        "signers:\n  release:\n    public_key: |\n{indented}rules:\n  - name: signed\n    require_signed: true\n"
    );
    let policy = TrustPolicy::parse("bench.yaml", &text, std::path::Path::new("."))
        .map_err(|e| e.to_string())?;
    // A manifest of a small template (one line per file).
    let manifest: Vec<u8> = (0..2000)
        .flat_map(|i| format!("f \"usr/lib/file{i}\" 644 {i:064x}\n").into_bytes())
        .collect();
    let digest = Measurement::of("m", &manifest).digest;
    let bundles = [StoredBundle {
        file: "a.sigstore.json".into(),
        bundle: key.sign(&manifest).map_err(|e| e.to_string())?,
    }];
    let who = Subject {
        tenant: "acme",
        runtime_class: "standard",
    };
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        let c = Candidate {
            name: "web",
            digest: &digest,
            manifest: Some(&manifest),
            bundles: &bundles,
        };
        let (r, ms) = time(|| policy.check(&c, &who));
        r.map_err(|e| e.to_string())?;
        v.push(ms);
    }
    Ok(stat(v))
}

fn throughput(mib: usize, root: bool, notes: &mut Vec<String>) -> Result<Vec<Throughput>, String> {
    let n = mib << 20;
    let plain: Vec<u8> = (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    let key = format::DataKey::generate();
    let gib = |ms: f64| (n as f64 / (1u64 << 30) as f64) / (ms / 1e3);
    let mut out = Vec::new();
    // Touched first: the copy measures memory bandwidth, not page faults.
    let mut copy = vec![1u8; n];
    let ((), ms) = time(|| copy.copy_from_slice(&plain));
    std::hint::black_box(&copy);
    drop(copy);
    out.push(Throughput {
        what: "plain copy (the floor)",
        mib,
        gib_per_second: gib(ms),
    });
    let (sealed, ms) = time(|| format::seal(&key, &plain[..], Vec::with_capacity(n + (n >> 10))));
    let (sealed, _) = sealed.map_err(|e| e.to_string())?;
    out.push(Throughput {
        what: "seal (AES-256-GCM, 1 MiB chunks)",
        mib,
        gib_per_second: gib(ms),
    });
    let (r, ms) = time(|| format::check(&key, &sealed[..]));
    if r.map_err(|e| e.to_string())? != n as u64 {
        return Err("decrypted another length".into());
    }
    out.push(Throughput {
        what: "open (decrypt + authenticate)",
        mib,
        gib_per_second: gib(ms),
    });
    if !root {
        notes.push("delivery into a sandbox left out: needs root".into());
        return Ok(out);
    }
    let rt = crate::cmd::sandbox::sandbox_runtime(true)?;
    let spec = tessera_sandbox::SandboxSpec {
        sealed: vec!["/weights/bench".into()],
        limits: tessera_sandbox::Limits {
            memory_bytes: Some((n as u64) * 2 + (256 << 20)),
            ..Default::default()
        },
        ..Default::default()
    };
    // Three deliveries, each into a fresh sandbox: the first pays for memory the
    // machine has not handed out before (on a VM, the hypervisor's first touch).
    let mut runs = Vec::new();
    for _ in 0..3 {
        let sb = rt.spawn(&spec).map_err(|e| e.to_string())?;
        let (r, ms) = time(|| {
            sb.fill_sealed("/weights/bench", "model.bin", n as u64, |pipe| {
                format::open(&key, &sealed[..], |p| std::io::Write::write_all(pipe, p))
                    .map(drop)
                    .map_err(std::io::Error::other)
            })
        });
        r.map_err(|e| e.to_string())?;
        let _ = sb.destroy();
        runs.push(gib(ms));
    }
    out.push(Throughput {
        what: "deliver into a sandbox, first of 3",
        mib,
        gib_per_second: runs[0],
    });
    out.push(Throughput {
        what: "deliver into a sandbox, best of 3",
        mib,
        gib_per_second: runs.iter().copied().fold(0.0, f64::max),
    });
    Ok(out)
}

/// The TPM measures: quote, quote check, key release (a key service over a
/// throw-away store, a job bound to node `bench`).
fn tpm_runs(runs: usize) -> Result<(Stat, Stat, Stat), String> {
    let sw = Swtpm::start().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let tpm = Tpm::open(&sw.tcti(), &dir.path().join("tpm")).map_err(|e| e.to_string())?;
    let id = tpm.identity().map_err(|e| e.to_string())?;
    tpm.measure(&[Measurement::of("tessera-binary", b"bench")])
        .map_err(|e| e.to_string())?;
    let e = tpm.quote(b"approve").map_err(|e| e.to_string())?;
    let reference = Reference::approving(&id.ak_public, &e);
    let (mut quotes, mut checks) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let nonce = format!("nonce-{i}").into_bytes();
        let (e, ms) = time(|| tpm.quote(&nonce));
        let e = e.map_err(|e| e.to_string())?;
        quotes.push(ms);
        let (r, ms) = time(|| tessera_node::attest::verify(&reference, &e, &nonce));
        r.map_err(|e| e.to_string())?;
        checks.push(ms);
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let releases = rt.block_on(async {
        let store: AnyStore = tessera_server::SqliteStore::open(dir.path().join("db"))
            .map_err(|e| e.to_string())?
            .into();
        let svc = tessera_server::weights::KeyService::open(store.clone(), dir.path())?;
        let owner = tessera_server::plane::Caller {
            tenant: "acme".into(),
            subject: "user:bench".into(),
            key_id: "bench".into(),
            role: tessera_server::auth::Role::Admin,
        };
        let frames = vec![Ok::<_, std::convert::Infallible>(axum_bytes(b"weights"))];
        svc.put(
            &owner,
            "llama",
            None,
            Vec::new(),
            futures_util::stream::iter(frames),
        )
        .await
        .map_err(|e| e.to_string())?;
        let put = |k: Key, v: serde_json::Value| {
            let store = store.clone();
            async move { store.create(k, v).await.map_err(|e| e.to_string()) }
        };
        put(
            Key::new("attestation", "", "bench"),
            json!({"node": "bench", "tcti": sw.tcti(), "software_tpm": true, "identity": id,
                   "registered": true, "reference": reference, "attested": true,
                   "reason": "bench", "checked_ms": 0}),
        )
        .await?;
        put(
            Key::new("node", "", "bench"),
            json!({"name": "bench", "allocatable": {"cpu_milli": 1000, "memory": 1u64 << 30}}),
        )
        .await?;
        put(
            Key::new("job", "acme", "j"),
            json!({"spec": {"name": "j", "queue": "q", "tasks": [{"name": "t0", "command": ["true"], "weights": ["llama"]}]},
                   "status": {"phase": "running", "tasks": {"t0": {"node": "bench", "gpus": []}}},
                   "created_at": 0}),
        )
        .await?;
        let mut v = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            let nonce = svc.nonce();
            let me = wrap::Recipient::generate();
            let b = wrap::binding(&nonce, me.public());
            let evidence = tpm.quote(&b).map_err(|e| e.to_string())?;
            let req = ReleaseRequest {
                node: "bench".into(),
                task: tessera_node::TaskKey::new("acme", "j", "t0", 0),
                weights: "llama".into(),
                nonce: tessera_node::attest::hex(&nonce),
                recipient: tessera_node::attest::hex(me.public()),
                evidence,
                view: Vec::new(),
            };
            let rel = svc.release(&req).await?;
            me.open(&rel.envelope, &tessera_node::weights::context(&b, "llama"))
                .map_err(|e| e.to_string())?;
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok::<_, String>(v)
    })?;
    Ok((stat(quotes), stat(checks), stat(releases)))
}

fn axum_bytes(b: &[u8]) -> tessera_server::weights::Bytes {
    b.to_vec().into()
}

fn measure(a: &Args) -> Result<Report, String> {
    let mut notes = Vec::new();
    let verify_p256 = verify_runs(KeyKind::P256, a.runs)?;
    let verify_ed25519 = verify_runs(KeyKind::Ed25519, a.runs)?;
    let root = crate::cmd::sandbox::nix_is_root();
    let throughput = throughput(a.mib, root, &mut notes)?;
    let (tpm_quote, quote_verify, key_release) = if Swtpm::available() {
        let (q, c, r) = tpm_runs((a.runs / 5).max(5))?;
        notes.push(
            "TPM figures are swtpm's (a software TPM over TCP, each tool a process): a hardware TPM is slower per quote".into(),
        );
        (Some(q), Some(c), Some(r))
    } else {
        notes.push("TPM parts left out: swtpm or tpm2-tools is not installed".into());
        (None, None, None)
    };
    Ok(Report {
        verify_p256,
        verify_ed25519,
        tpm_quote,
        quote_verify,
        key_release,
        throughput,
        notes,
    })
}

fn render(r: &Report) -> String {
    let mut s = String::from(
        "measure                                        runs      p50 ms      p99 ms\n",
    );
    let mut row = |name: &str, st: &Stat| {
        s.push_str(&format!(
            "{name:<46} {:>5} {:>11.3} {:>11.3}\n",
            st.runs, st.p50_ms, st.p99_ms
        ));
    };
    row("template verify (P-256 bundle)", &r.verify_p256);
    row("template verify (Ed25519 bundle)", &r.verify_ed25519);
    if let Some(q) = &r.tpm_quote {
        row("attestation: TPM quote (swtpm)", q);
    }
    if let Some(q) = &r.quote_verify {
        row("attestation: quote verify", q);
    }
    if let Some(q) = &r.key_release {
        row("key release (nonce, quote, checks, unwrap)", q);
    }
    s.push_str("\nthroughput (one core)                              MiB       GiB/s\n");
    for t in &r.throughput {
        s.push_str(&format!(
            "{:<46} {:>9} {:>11.2}\n",
            t.what, t.mib, t.gib_per_second
        ));
    }
    for n in &r.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    s
}
