//! An SVG plot of a routing comparison: for each workload, KV-cache hit rate and
//! TTFT p99 per router, as grouped bars.

use std::fmt::Write as _;

use super::RouterResult;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `runs`: (workload name, results). Two panels side by side per workload: hit
/// rate (0..1) and TTFT p99 (ms, scaled to the largest).
pub fn svg(runs: &[(String, Vec<RouterResult>)]) -> String {
    const COLORS: [&str; 6] = [
        "#9e9e9e", "#bcaaa4", "#64b5f6", "#ffb74d", "#43a047", "#7e57c2",
    ];
    let panel_w = 300.0;
    let panel_h = 200.0;
    let top = 50.0;
    let left = 50.0;
    let gap = 60.0;
    let panels = runs.len() * 2;
    let w = left + panels as f64 * (panel_w + gap);
    let routers: Vec<String> = runs
        .first()
        .map(|(_, r)| r.iter().map(|x| x.router.clone()).collect())
        .unwrap_or_default();
    let h = top + panel_h + 90.0 + 18.0 * routers.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{left}\" y=\"22\" font-size=\"15\">tessera sim routing: KV-cache hit rate (higher is better) and TTFT p99 (lower is better)</text>"
    );
    let mut p = 0usize;
    for (name, results) in runs {
        let tmax = results.iter().map(|r| r.ttft_p99_ms).fold(1.0f64, f64::max);
        for (metric, max, fmt) in [("hit rate", 1.0, 0), ("TTFT p99 (ms)", tmax, 1)] {
            let x0 = left + p as f64 * (panel_w + gap);
            p += 1;
            let _ = writeln!(
                s,
                "<text x=\"{x0}\" y=\"{}\" font-weight=\"bold\">{} — {}</text>",
                top - 8.0,
                esc(name),
                metric
            );
            let _ = writeln!(
                s,
                "<line x1=\"{x0}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
                top + panel_h,
                x0 + panel_w,
                top + panel_h
            );
            let bw = panel_w / (results.len().max(1) as f64 * 1.3);
            for (i, r) in results.iter().enumerate() {
                let v = if fmt == 0 { r.hit_rate } else { r.ttft_p99_ms };
                let bh = if max > 0.0 { (v / max) * panel_h } else { 0.0 };
                let x = x0 + i as f64 * bw * 1.3 + bw * 0.15;
                let y = top + panel_h - bh;
                let _ = writeln!(
                    s,
                    "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"{}\"/>",
                    COLORS[i % COLORS.len()]
                );
                let label = if fmt == 0 {
                    format!("{v:.3}")
                } else {
                    format!("{v:.0}")
                };
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{label}</text>",
                    x + bw / 2.0,
                    y - 3.0
                );
            }
        }
    }
    for (i, r) in routers.iter().enumerate() {
        let y = top + panel_h + 30.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            y - 10.0,
            COLORS[i % COLORS.len()],
            left + 18.0,
            y,
            esc(r)
        );
    }
    s += "</svg>\n";
    s
}
