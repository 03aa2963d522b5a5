//! `tessera bench guard`: command-check latency over the guard's corpus, secret-scan
//! throughput on clean and dirty text (one thread), the same text redacted as a stream
//! of 64 KiB chunks beside it, and the worst case on hostile input.

use std::time::Instant;

use serde::Serialize;
use tessera_guard::{Policy, Scanner, check_command};

/// The command corpus the guard's tests use (dangerous and harmless lines).
const CORPUS: &str = include_str!("../../../guard/tests/corpus/commands.tsv");

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Checks of each corpus command.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Megabytes of text per scan run.
    #[arg(long, default_value_t = 32)]
    pub scan_mb: usize,
}

#[derive(Serialize)]
struct Report {
    commands: usize,
    checks: usize,
    check_p50_us: f64,
    check_p99_us: f64,
    check_max_us: f64,
    adversarial_max_us: f64,
    scan_bytes: usize,
    scan_clean_mb_per_sec: f64,
    scan_dirty_mb_per_sec: f64,
    dirty_findings: usize,
    /// The streaming redactor over the same text in 64 KiB chunks.
    stream_clean_mb_per_sec: f64,
    stream_dirty_mb_per_sec: f64,
    stream_dirty_findings: usize,
}

fn unescape(s: &str) -> String {
    s.replace("\\n", "\n")
        .replace("\\t", "\t")
        .replace("\\\\", "\\")
}

fn clean_text(bytes: usize) -> Vec<u8> {
    const LINES: &[&str] = &[
        "The scheduler places each gang of tasks on nodes that share an NVLink domain, and falls back to PCIe when it must.\n",
        "fn main() { let cfg = Config::load(\"tessera.yaml\")?; println!(\"{}\", cfg.name); }\n",
        "2026-11-30T14:03:22.512Z INFO sched: session 8812 placed 64 tasks in 3.2 ms (queue=research, node=gpu-17)\n",
        "    for (i, task) in tasks.iter().enumerate() { if task.ready() { queue.push(i); } }\n",
        "Agents call tools through the gateway; every call carries an idempotency key and a tenant.\n",
        "{\"epoch\": 12, \"loss\": 0.4312, \"lr\": 0.0003, \"step\": 120000, \"gpu_util\": 97.5}\n",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.\n",
        "import torch; model = torch.nn.Linear(4096, 4096).cuda(); out = model(x)\n",
    ];
    let mut v = Vec::with_capacity(bytes + 256);
    let mut i = 0;
    while v.len() < bytes {
        v.extend_from_slice(LINES[i % LINES.len()].as_bytes());
        i += 7;
    }
    v.truncate(bytes);
    v
}

fn dirty_text(bytes: usize) -> Vec<u8> {
    const SECRETS: &[&str] = &[
        "aws_key=AKIAQWERTYUIOPASDFGH ",
        "mail alice@example.com ",
        "card 4111 1111 1111 1111 ",
        "token ghp_abcdefghijklmnopqrstuvwxyz0123456789 ",
        "phone 13800138000 ",
        "password = \"Xk9mP2vL7qR4tZ8w\" ",
        "DATABASE_URL=postgres://app:S3cretPw@db:5432/app ",
    ];
    let clean = clean_text(bytes);
    let mut v = Vec::with_capacity(bytes + bytes / 8);
    for (k, chunk) in clean.chunks(2048).enumerate() {
        v.extend_from_slice(chunk);
        v.extend_from_slice(SECRETS[k % SECRETS.len()].as_bytes());
    }
    v
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    super::percentile(sorted, p).unwrap_or(0.0)
}

/// Best of five runs of the streaming redactor over `text` in 64 KiB chunks: MB/s and
/// redactions.
fn stream_rate(sc: &Scanner, text: &[u8]) -> (f64, usize) {
    let mut best = f64::MAX;
    let mut n = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let mut r = sc.redactor();
        let mut bytes = 0;
        for c in text.chunks(64 << 10) {
            bytes += r.push(c).len();
        }
        bytes += r.finish().len();
        std::hint::black_box(bytes);
        let dt = t.elapsed().as_secs_f64();
        n = r.findings().len();
        best = best.min(dt);
    }
    (text.len() as f64 / 1e6 / best, n)
}

fn scan_rate(sc: &Scanner, text: &[u8]) -> (f64, usize) {
    let mut best = f64::MAX;
    let mut n = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let ms = sc.scan(text);
        let dt = t.elapsed().as_secs_f64();
        n = ms.len();
        best = best.min(dt);
    }
    (text.len() as f64 / 1e6 / best, n)
}

pub fn run(a: Args) -> i32 {
    let policy = Policy::default();
    let cmds: Vec<String> = CORPUS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.splitn(3, '\t').nth(2).map(unescape))
        .collect();
    if cmds.is_empty() {
        return crate::output::fail(
            crate::output::EXIT_FAILURE,
            "the embedded command corpus is empty",
        );
    }
    eprintln!("checking {} commands x {} ...", cmds.len(), a.reps.max(1));
    // Warm up (first-use allocations, word-parse caches).
    for c in &cmds {
        std::hint::black_box(check_command(&policy, None, c));
    }
    let mut lat = Vec::with_capacity(cmds.len() * a.reps.max(1));
    for _ in 0..a.reps.max(1) {
        for c in &cmds {
            let t = Instant::now();
            std::hint::black_box(check_command(&policy, None, c));
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    lat.sort_by(f64::total_cmp);
    let limit = policy.limits().max_command_bytes;
    let hostile: Vec<String> = vec![
        "$(".repeat(limit / 4) + &")".repeat(limit / 4),
        "a | ".repeat(limit / 5),
        "rm -rf / ; ".repeat(limit / 12),
        "bash -c 'bash -c \"eval echo x\"' ; ".repeat(limit / 40),
        "x".repeat(limit),
        "'".repeat(limit),
        format!("echo {}", "\\`".repeat(limit / 3)),
        "{ ".repeat(limit / 2),
    ];
    let mut adversarial_max: f64 = 0.0;
    for h in &hostile {
        let t = Instant::now();
        std::hint::black_box(check_command(&policy, None, h));
        adversarial_max = adversarial_max.max(t.elapsed().as_secs_f64() * 1e6);
    }
    eprintln!("scanning {} MB ...", a.scan_mb);
    let sc = Scanner::new(&policy);
    let clean = clean_text(a.scan_mb.max(1) << 20);
    let dirty = dirty_text(a.scan_mb.max(1) << 20);
    let (clean_rate, clean_n) = scan_rate(&sc, &clean);
    let (dirty_rate, dirty_n) = scan_rate(&sc, &dirty);
    let (stream_clean, stream_clean_n) = stream_rate(&sc, &clean);
    let (stream_dirty, stream_dirty_n) = stream_rate(&sc, &dirty);
    let r = Report {
        commands: cmds.len(),
        checks: lat.len(),
        check_p50_us: pct(&lat, 0.50),
        check_p99_us: pct(&lat, 0.99),
        check_max_us: lat.last().copied().unwrap_or(0.0),
        adversarial_max_us: adversarial_max,
        scan_bytes: clean.len(),
        scan_clean_mb_per_sec: clean_rate,
        scan_dirty_mb_per_sec: dirty_rate,
        dirty_findings: dirty_n,
        stream_clean_mb_per_sec: stream_clean,
        stream_dirty_mb_per_sec: stream_dirty,
        stream_dirty_findings: stream_dirty_n,
    };
    if clean_n != 0 || stream_clean_n != 0 {
        eprintln!("warning: the clean text produced {clean_n} findings");
    }
    if stream_dirty_n != dirty_n {
        eprintln!(
            "warning: the stream redacted {stream_dirty_n} findings, the whole scan found {dirty_n}"
        );
    }
    if a.json {
        return crate::output::print_json(&r);
    }
    println!("guard benchmark (one thread)");
    println!("  {:<34} {:>12}", "metric", "value");
    println!(
        "  {:<34} {:>12}",
        "commands x reps",
        format!("{} x {}", r.commands, a.reps.max(1))
    );
    println!("  {:<34} {:>12.1}", "check p50 (us)", r.check_p50_us);
    println!("  {:<34} {:>12.1}", "check p99 (us)", r.check_p99_us);
    println!("  {:<34} {:>12.1}", "check max (us)", r.check_max_us);
    println!(
        "  {:<34} {:>12.1}",
        format!("hostile input max, {limit} B (us)"),
        r.adversarial_max_us
    );
    println!(
        "  {:<34} {:>12.0}",
        "scan clean text (MB/s)", r.scan_clean_mb_per_sec
    );
    println!(
        "  {:<34} {:>12.0}",
        "scan dirty text (MB/s)", r.scan_dirty_mb_per_sec
    );
    println!("  {:<34} {:>12}", "dirty-text findings", r.dirty_findings);
    println!(
        "  {:<34} {:>12.0}",
        "stream-redact clean, 64 KiB (MB/s)", r.stream_clean_mb_per_sec
    );
    println!(
        "  {:<34} {:>12.0}",
        "stream-redact dirty, 64 KiB (MB/s)", r.stream_dirty_mb_per_sec
    );
    println!(
        "  {:<34} {:>12}",
        "stream-redacted findings", r.stream_dirty_findings
    );
    0
}
