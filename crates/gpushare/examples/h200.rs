//! The H200 run of Tessera's GPU sharing (docs/gpushare.md, "On a real GPU"):
//! the node side (regions, the compute monitor on real NVML) for two tasks on
//! one GPU with 40 % / 60 % memory caps and compute shares, against an
//! unshared run in the same go. Starts no MPS daemon and changes no device
//! setting.
//!
//! ```text
//! h200 --task PATH --interposer PATH [--cudart PATH] [--out DIR]
//!      [--seconds 20] [--iters 200000] [--nvml LIB] [--libdir DIR]
//! ```
//! `--nvml` and `--libdir` point at the fake driver for a dry run without a GPU.
//! Writes `h200.json` into `--out` and prints it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tessera_gpushare::monitor::DeviceMonitor;
use tessera_gpushare::monotonic_ns;
use tessera_gpushare::nvml::{NvmlSampler, busy_by_task};
use tessera_gpushare::region::{ComputePolicy, DeviceConfig, Region, RegionConfig};
use tessera_gpushare::share::ControllerConfig;

const TICK_NS: u64 = 50_000_000;

struct Opts {
    task: PathBuf,
    interposer: PathBuf,
    cudart: Option<PathBuf>,
    out: PathBuf,
    seconds: f64,
    iters: u32,
    nvml: Option<PathBuf>,
    libdir: Option<PathBuf>,
}

fn opts() -> Result<Opts, String> {
    let mut a: BTreeMap<String, String> = BTreeMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        a.insert(k.trim_start_matches("--").to_string(), v);
    }
    let path = |k: &str| a.get(k).map(PathBuf::from);
    let num = |k: &str, d: f64| -> Result<f64, String> {
        a.get(k)
            .map_or(Ok(d), |s| s.parse().map_err(|e| format!("--{k} {s}: {e}")))
    };
    Ok(Opts {
        task: path("task").ok_or("--task is required")?,
        interposer: path("interposer").ok_or("--interposer is required")?,
        cudart: path("cudart"),
        out: path("out").unwrap_or_else(|| ".".into()),
        seconds: num("seconds", 20.0)?,
        iters: num("iters", 200_000.0)? as u32,
        nvml: path("nvml"),
        libdir: path("libdir"),
    })
}

fn command(o: &Opts, region: Option<&Path>, seconds: f64) -> Command {
    let mut c = Command::new(&o.task);
    c.args([seconds.to_string(), o.iters.to_string(), "1024".into()])
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped());
    if let Some(r) = region {
        c.env("LD_PRELOAD", &o.interposer)
            .env("TESSERA_GPUSHARE_REGION", r);
    }
    if let Some(rt) = &o.cudart {
        c.env("TASK_CUDART", rt);
    }
    if let Some(d) = &o.libdir {
        c.env("LD_LIBRARY_PATH", d);
    }
    c
}

fn parse(name: &str, stdout: &[u8]) -> Result<Value, String> {
    let s = String::from_utf8_lossy(stdout);
    serde_json::from_str(s.trim()).map_err(|e| format!("{name}: bad output {s:?}: {e}"))
}

fn region(dir: &Path, task: &str, limit: u64, milli: u32) -> Result<(PathBuf, Region), String> {
    let p = dir.join(format!("{task}.region"));
    let r = Region::create(
        &p,
        &RegionConfig {
            task: task.into(),
            devices: vec![DeviceConfig {
                memory_limit: limit,
                compute_milli: milli,
            }],
            memory_wait: Duration::ZERO,
            policy: ComputePolicy::WorkConserving,
        },
    )
    .map_err(|e| e.to_string())?;
    Ok((p, r))
}

/// What a monitored run saw: per tick each task's device time (NVML) and
/// whether every task was computing (and none had exited) in that tick.
struct Run {
    ticks: Vec<(BTreeMap<String, u64>, bool)>,
    outs: Vec<Value>,
}

/// Starts the tasks (`name`, region path) and runs the node's compute monitor
/// until they have all exited.
fn monitored(
    o: &Opts,
    sampler: &mut NvmlSampler,
    tasks: &[(&str, &Path, &Region)],
    seconds: f64,
) -> Result<Run, String> {
    let mut mon = DeviceMonitor::new(ControllerConfig {
        tick_ns: TICK_NS,
        ..ControllerConfig::default()
    });
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let mut children: Vec<(String, Child)> = Vec::new();
    let mut pids = BTreeMap::new();
    for &(name, path, r) in tasks {
        mon.attach(name, r.clone(), 0);
        let mut child = command(o, Some(path), seconds)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", o.task.display()))?;
        let err = BufReader::new(child.stderr.take().expect("piped"));
        let (tx, n) = (tx.clone(), name.to_string());
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                if line.trim() == "phase compute" {
                    let _ = tx.send(n.clone());
                } else {
                    eprintln!("[{n}] {line}");
                }
            }
        });
        pids.insert(child.id(), name.to_string());
        children.push((name.to_string(), child));
    }
    let mut computing = BTreeSet::new();
    let mut any_exited = false;
    let mut ticks = Vec::new();
    let mut next = monotonic_ns();
    loop {
        next += TICK_NS;
        let now = monotonic_ns();
        if next > now {
            std::thread::sleep(Duration::from_nanos(next - now));
        }
        while let Ok(n) = rx.try_recv() {
            computing.insert(n);
        }
        let by_pid = sampler.busy_by_pid(0).map_err(|e| e.to_string())?;
        let busy = busy_by_task(&by_pid, |p| pids.get(&p).cloned());
        mon.tick(monotonic_ns(), &busy);
        ticks.push((busy, computing.len() == children.len() && !any_exited));
        let mut running = 0;
        for (_, c) in &mut children {
            match c.try_wait().map_err(|e| e.to_string())? {
                None => running += 1,
                Some(_) => any_exited = true,
            }
        }
        if running == 0 {
            break;
        }
    }
    let mut outs = Vec::new();
    for (name, c) in children {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        outs.push(parse(&name, &out.stdout)?);
    }
    Ok(Run { ticks, outs })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("h200: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let o = opts()?;
    std::fs::create_dir_all(&o.out).map_err(|e| e.to_string())?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut sampler = match &o.nvml {
        Some(p) => NvmlSampler::open_library(p),
        None => NvmlSampler::open(),
    }
    .map_err(|e| e.to_string())?;

    // 1. Unshared: the task alone, no interposer.
    let out = command(&o, None, o.seconds / 2.0)
        .output()
        .map_err(|e| format!("{}: {e}", o.task.display()))?;
    let alone = parse("unshared", &out.stdout)?;
    let total = alone["info_total"]
        .as_u64()
        .ok_or("the unshared run reported no info_total")?;

    // 2. Interposed, whole device, sliced but alone: the launch fast path.
    let (wp, wr) = region(work.path(), "whole", total, 999)?;
    let whole = monitored(&o, &mut sampler, &[("whole", &wp, &wr)], o.seconds / 2.0)?;

    // 3. Shared: 40 % / 60 % caps and shares, both at once.
    let caps = [(total as f64 * 0.4) as u64, (total as f64 * 0.6) as u64];
    let (ap, ar) = region(work.path(), "a40", caps[0], 400)?;
    let (bp, br) = region(work.path(), "b60", caps[1], 600)?;
    let pair = monitored(
        &o,
        &mut sampler,
        &[("a40", &ap, &ar), ("b60", &bp, &br)],
        o.seconds,
    )?;
    let both: Vec<&BTreeMap<String, u64>> = pair
        .ticks
        .iter()
        .filter(|(_, all)| *all)
        .map(|(t, _)| t)
        .collect();
    let sum = |k: &str| {
        both.iter()
            .map(|t| t.get(k).copied().unwrap_or(0))
            .sum::<u64>() as f64
    };
    let (ba, bb) = (sum("a40"), sum("b60"));
    let window_s = both.len() as f64 * TICK_NS as f64 / 1e9;
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let w = &whole.outs[0];
    let report = json!({
        "enforcement": "tessera token bucket (work-conserving) over NVML per-process utilisation; no MPS started, no device setting changed",
        "device_memory_bytes": total,
        "unshared": alone,
        "whole_device_interposed": w,
        "shared": {
            "caps_bytes": caps,
            "tasks": pair.outs,
            // Held: something was granted, no more than the cap, and the allocation that
            // stopped was refused as out of memory (2 in both APIs), not for another reason.
            "caps_held": pair.outs.iter().zip(caps).all(|(t, c)| {
                t["granted_bytes"].as_u64().is_some_and(|g| g > 0 && g <= c) && t["alloc_stop_rc"].as_i64() == Some(2)
            }),
            "nvml_share_pct": [100.0 * ba / (ba + bb).max(1.0), 100.0 * bb / (ba + bb).max(1.0)],
            "device_busy_pct": 100.0 * (ba + bb) / (window_s * 1e9).max(1.0),
            "overlap_seconds": window_s,
            "usage": [ar.usage(), br.usage()],
        },
        "launch_overhead_p50_us": f(w, "launch_us_p50") - f(&alone, "launch_us_p50"),
        "launch_overhead_p99_us": f(w, "launch_us_p99") - f(&alone, "launch_us_p99"),
        "throughput_cost_pct": 100.0 * (1.0 - pair.outs.iter().map(|t| f(t, "kernels_per_s")).sum::<f64>() / f(&alone, "kernels_per_s").max(1e-9)),
    });
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(o.out.join("h200.json"), &text).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}
