//! `tessera bench sandbox --tier microvm`: the two isolation tiers side by side in one
//! run, through the one tier-neutral handle ([`AnySandbox`]) every caller uses: tier
//! start, boot (spec to ready) and boot to the first command's answer, the exec round
//! trip, a pause to disk (snapshot) and a resume from it (restore, then a file read
//! back), and the host memory a sandbox costs while idle. For the micro-VM tier, a bare
//! QEMU boot of the same kernel (no initramfs: the kernel starts, finds no root and
//! powers off) is measured in the same run, and the ratio of a sandbox's boot to it.
//! Egress: 32 MiB from a host service through one tunnel of the sandbox's proxy (the
//! micro-VM's relayed over its control channel), read by the same Python reader.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_sandbox::tier::{AnySandbox, NamespaceTier, PauseOptions, Tier, TierKind};
use tessera_sandbox::vm::qemu::{self, Accel};
use tessera_sandbox::vm::{MicroVmConfig, MicroVmTier};
use tessera_sandbox::{ExecRequest, SandboxSpec};

/// One tier's figures (milliseconds unless named otherwise).
#[derive(Debug, Serialize)]
pub struct TierFigures {
    pub tier: TierKind,
    /// How guests run (`kvm`/`tcg`) for the micro-VM tier.
    pub accel: Option<String>,
    pub detail: String,
    pub samples: usize,
    pub tier_start_ms: f64,
    /// Spec to a sandbox that answers (a micro-VM: QEMU start to the agent's Ready).
    pub boot_p50_ms: f64,
    /// Spec to the first command's answer (`true`).
    pub boot_to_first_command_p50_ms: f64,
    pub boot_to_first_command_min_ms: f64,
    /// `true` in a running sandbox.
    pub exec_p50_ms: f64,
    pub exec_min_ms: f64,
    /// Pause to disk: drain, snapshot written, sandbox freed.
    pub snapshot_p50_ms: f64,
    /// Resume from the snapshot until a file written before the pause reads back.
    pub restore_p50_ms: f64,
    /// Host memory charged to one idle sandbox (its cgroup), KiB.
    pub idle_memory_kib: Option<f64>,
    /// Resident memory of its host process (init / QEMU), KiB.
    pub idle_host_rss_kib: Option<f64>,
    pub snapshot_bytes: u64,
    /// MB/s through the egress proxy (`None` without `python3` in the template).
    pub egress_mb_per_s: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct TierReport {
    pub namespace: TierFigures,
    pub microvm: TierFigures,
    /// QEMU with the same kernel and accelerator, no initramfs, to power-off.
    pub bare_qemu_boot_p50_ms: f64,
    /// `microvm.boot_p50_ms / bare_qemu_boot_p50_ms`.
    pub boot_over_bare_qemu: f64,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    super::percentile(v, 0.5).unwrap_or(f64::NAN)
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::min)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn dir_bytes(d: &Path) -> u64 {
    std::fs::read_dir(d)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Measures one tier with `n` sandboxes.
fn measure(
    tier: Arc<dyn Tier>,
    tier_start_ms: f64,
    n: usize,
    scratch: &Path,
) -> Result<TierFigures, String> {
    let spec = SandboxSpec::default();
    let truth = ExecRequest::argv(["true"]).timeout(Duration::from_secs(60));
    let info = tier.info();
    let (mut boot, mut first, mut exec, mut snap, mut restore) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut mem, mut rss) = (vec![], vec![]);
    let mut snapshot_bytes = 0;
    for i in 0..n {
        eprintln!("  {} sandbox {}/{n}", info.kind, i + 1);
        let t = Instant::now();
        let sb = AnySandbox::spawn(tier.clone(), &spec).map_err(err)?;
        boot.push(ms(t));
        let out = sb.exec(&truth).map_err(err)?;
        first.push(ms(t));
        if !out.status.success() {
            return Err(format!(
                "`true` failed in a {} sandbox: {:?}",
                info.kind, out.status
            ));
        }
        for _ in 0..10 {
            let t = Instant::now();
            sb.exec(&truth).map_err(err)?;
            exec.push(ms(t));
        }
        let st = sb.stats();
        mem.extend(st.memory_bytes.map(|b| b as f64 / 1024.0));
        rss.extend(st.host_rss_bytes.map(|b| b as f64 / 1024.0));
        sb.write_file("/workspace/kept", b"before the pause")
            .map_err(err)?;
        let dir = scratch.join(format!("{}-{i}", info.kind));
        let t = Instant::now();
        sb.pause_to_disk(&dir, &PauseOptions::default())
            .map_err(err)?;
        snap.push(ms(t));
        snapshot_bytes = dir_bytes(&dir);
        let t = Instant::now();
        sb.resume().map_err(err)?;
        let back = sb.read_file("/workspace/kept").map_err(err)?;
        restore.push(ms(t));
        if back != b"before the pause" {
            return Err(format!(
                "a {} sandbox lost a file across pause and resume",
                info.kind
            ));
        }
        sb.destroy().map_err(err)?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!("  {} egress", info.kind);
    let egress_mb_per_s = egress(&tier)?;
    let avg = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    Ok(TierFigures {
        tier: info.kind,
        accel: info.accel.clone(),
        detail: info.detail.clone(),
        samples: n,
        tier_start_ms,
        boot_p50_ms: p50(&mut boot),
        boot_to_first_command_min_ms: min(&first),
        boot_to_first_command_p50_ms: p50(&mut first),
        exec_min_ms: min(&exec),
        exec_p50_ms: p50(&mut exec),
        snapshot_p50_ms: p50(&mut snap),
        restore_p50_ms: p50(&mut restore),
        idle_memory_kib: avg(&mem),
        idle_host_rss_kib: avg(&rss),
        snapshot_bytes,
        egress_mb_per_s,
    })
}

/// Bytes sent through the egress tunnel.
const EGRESS_BYTES: usize = 32 << 20;

/// MB/s of one tunnel through `tier`'s egress proxy from a host service on loopback;
/// `None` when the template has no `python3` to read it.
fn egress(tier: &Arc<dyn Tier>) -> Result<Option<f64>, String> {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let port = listener.local_addr().map_err(err)?.port();
    std::thread::spawn(move || {
        if let Ok((c, _)) = listener.accept() {
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..EGRESS_BYTES >> 20 {
                if (&c).write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    });
    let spec = SandboxSpec {
        network: tessera_sandbox::Network::Proxy(tessera_sandbox::EgressPolicy {
            allow_domains: vec!["localhost".into()],
            allow_private: true,
        }),
        ..SandboxSpec::default()
    };
    let sb = AnySandbox::spawn(tier.clone(), &spec).map_err(err)?;
    let script = format!(
        "import socket, time\n\
         s = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'CONNECT localhost:{port} HTTP/1.1\\r\\n\\r\\n')\n\
         h = b''\n\
         while b'\\r\\n\\r\\n' not in h: h += s.recv(1)\n\
         t = time.time(); n = 0\n\
         while n < {EGRESS_BYTES}:\n\
         \x20   d = s.recv(1 << 16)\n\
         \x20   if not d: break\n\
         \x20   n += len(d)\n\
         print(n, time.time() - t)\n"
    );
    let out = sb
        .exec(&ExecRequest::argv(["python3", "-c", &script]).timeout(Duration::from_secs(600)))
        .map_err(err)?;
    let _ = sb.destroy();
    if out.status.code() == 127 {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut it = text.split_whitespace();
    match (
        it.next().and_then(|n| n.parse::<f64>().ok()),
        it.next().and_then(|s| s.parse::<f64>().ok()),
    ) {
        (Some(n), Some(secs)) if n as usize == EGRESS_BYTES && secs > 0.0 => {
            Ok(Some(n / secs / 1e6))
        }
        _ => Err(format!(
            "the egress reader in a {} sandbox said {text:?} {:?}",
            tier.kind(),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// QEMU booting the kernel alone, with the machine, CPU and timing options the tier's
/// own VMs use: no initramfs, no root disk; the kernel panics at mounting root and,
/// with `panic=-1` and `-no-reboot`, QEMU exits.
fn bare_boot(bin: &Path, vmlinuz: &Path, accel: Accel) -> Result<f64, String> {
    let append = format!(
        "console=ttyS0 quiet panic=-1 8250.nr_uarts=1{}",
        qemu::timing_append(accel, qemu::host_tsc_khz())
    );
    let t = Instant::now();
    let mut child = std::process::Command::new(bin)
        .args(["-M", qemu::MACHINE])
        .args(qemu::accel_args(accel))
        .args([
            "-m",
            "256",
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-no-reboot",
            "-serial",
            "null",
            "-kernel",
        ])
        .arg(vmlinuz)
        .arg("-append")
        .arg(&append)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().map_err(err)?.is_some() {
            return Ok(ms(t));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("a bare QEMU boot did not power off within 120 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Both tiers, `n` sandboxes each, and `n` bare QEMU boots.
pub fn bench(kernel: &Path, n: usize) -> Result<TierReport, String> {
    let scratch = tempfile_dir()?;
    let t = Instant::now();
    let rt = crate::cmd::sandbox::sandbox_runtime(true)?;
    let ns: Arc<dyn Tier> = Arc::new(NamespaceTier::new(rt));
    let ns_start = ms(t);
    eprintln!("namespace tier");
    let namespace = measure(ns, ns_start, n, scratch.path())?;

    let cache = crate::cmd::up::default_data_dir().join("vm");
    let mut cfg = MicroVmConfig::new(kernel, cache);
    cfg.init = crate::cmd::sandbox::init_program()
        .filter(|i| i.args.is_empty())
        .or(cfg.init);
    let t = Instant::now();
    let vm = MicroVmTier::new(cfg).map_err(|e| format!("the micro-VM tier: {e}"))?;
    let vm_start = ms(t);
    let accel = vm.accel();
    eprintln!("micro-VM tier ({})", accel.as_str());
    let microvm = measure(vm.clone(), vm_start, n, scratch.path())?;

    let qemu = tessera_sandbox::vm::find_qemu().ok_or("qemu-system-x86_64 is not installed")?;
    let vmlinuz = tessera_sandbox::vm::image::KernelTemplate::open(kernel)
        .map_err(err)?
        .vmlinuz();
    let mut bare = Vec::with_capacity(n);
    for i in 0..n {
        eprintln!("  bare QEMU boot {}/{n}", i + 1);
        bare.push(bare_boot(&qemu, &vmlinuz, accel)?);
    }
    let bare = p50(&mut bare);
    Ok(TierReport {
        boot_over_bare_qemu: microvm.boot_p50_ms / bare,
        namespace,
        microvm,
        bare_qemu_boot_p50_ms: bare,
    })
}

fn tempfile_dir() -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix("tessera-bench-tiers-")
        .tempdir()
        .map_err(|e| format!("a scratch folder: {e}"))
}

pub fn print_table(r: &TierReport) {
    println!(
        "isolation tiers side by side: {} sandboxes each; micro-VM under {}",
        r.namespace.samples,
        r.microvm.accel.as_deref().unwrap_or("?")
    );
    println!("namespace: {}", r.namespace.detail);
    println!("microvm:   {}", r.microvm.detail);
    println!("{:<30} {:>12} {:>12}", "metric", "namespace", "microvm");
    let row = |k: &str, a: f64, b: f64| println!("{k:<30} {a:>12.2} {b:>12.2}");
    let (a, b) = (&r.namespace, &r.microvm);
    row("tier_start_ms", a.tier_start_ms, b.tier_start_ms);
    row("boot_p50_ms", a.boot_p50_ms, b.boot_p50_ms);
    row(
        "boot_to_first_command_p50_ms",
        a.boot_to_first_command_p50_ms,
        b.boot_to_first_command_p50_ms,
    );
    row(
        "boot_to_first_command_min_ms",
        a.boot_to_first_command_min_ms,
        b.boot_to_first_command_min_ms,
    );
    row("exec_p50_ms", a.exec_p50_ms, b.exec_p50_ms);
    row("exec_min_ms", a.exec_min_ms, b.exec_min_ms);
    row("snapshot_p50_ms", a.snapshot_p50_ms, b.snapshot_p50_ms);
    row("restore_p50_ms", a.restore_p50_ms, b.restore_p50_ms);
    let opt = |v: Option<f64>| v.unwrap_or(f64::NAN);
    row(
        "idle_memory_kib",
        opt(a.idle_memory_kib),
        opt(b.idle_memory_kib),
    );
    row(
        "idle_host_rss_kib",
        opt(a.idle_host_rss_kib),
        opt(b.idle_host_rss_kib),
    );
    row(
        "snapshot_kib",
        a.snapshot_bytes as f64 / 1024.0,
        b.snapshot_bytes as f64 / 1024.0,
    );
    row(
        "egress_mb_per_s",
        opt(a.egress_mb_per_s),
        opt(b.egress_mb_per_s),
    );
    println!(
        "bare QEMU boot of the same kernel (p50): {:.1} ms; micro-VM boot / bare boot: {:.2}x",
        r.bare_qemu_boot_p50_ms, r.boot_over_bare_qemu
    );
}
