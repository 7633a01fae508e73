//! A drift plot of a [`Report`] as a hand-written SVG: one line per compared
//! stat, rows in execution order on x, drift on a log scale on y, dashed
//! tolerance lines and a marker on the first divergence. Long traces are
//! bucketed (the worst drift of each bucket is drawn) so the file stays small.

use std::fmt::Write as _;

use crate::report::Report;

const W: f64 = 960.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 60.0;
/// Drift is drawn between 1e-8 (exact rows sit on the floor) and 10.
const LOG_MIN: f64 = -8.0;
const LOG_MAX: f64 = 1.0;
const MAX_POINTS: usize = 2000;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn y_of(d: f64) -> f64 {
    let l = if d > 0.0 && d.is_finite() {
        d.log10().clamp(LOG_MIN, LOG_MAX)
    } else if d > 0.0 {
        LOG_MAX
    } else {
        LOG_MIN
    };
    TOP + (LOG_MAX - l) / (LOG_MAX - LOG_MIN) * (H - TOP - BOTTOM)
}

/// Render the drift plot.
pub fn render_svg(report: &Report) -> String {
    let n = report.rows.len();
    let plot_w = W - LEFT - RIGHT;
    let x_of = |i: usize| {
        LEFT + if n > 1 {
            i as f64 / (n - 1) as f64 * plot_w
        } else {
            plot_w / 2.0
        }
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let title = match &report.first_divergence {
        Some(fd) => format!(
            "relative drift per row; first divergence: {} ({})",
            fd.port_module, fd.stat
        ),
        None => "relative drift per row; no divergence".to_string(),
    };
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="13">{}</text>"#,
        esc(&title)
    );
    // Axes and decade grid.
    let bottom = H - BOTTOM;
    for e in (LOG_MIN as i32)..=(LOG_MAX as i32) {
        let y = y_of(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">1e{e}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#333"/><line x1="{LEFT}" y1="{bottom}" x2="{:.1}" y2="{bottom}" stroke="#333"/>"##,
        LEFT + plot_w
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">rows in reference execution order ({n})</text>"#,
        LEFT + plot_w / 2.0,
        H - 20.0
    );
    // Stats, lines, tolerances.
    let stats: Vec<&String> = report.tolerances.keys().collect();
    let bucket = n.div_ceil(MAX_POINTS).max(1);
    for (k, stat) in stats.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let mut pts = String::new();
        let mut i = 0;
        while i < n {
            let end = (i + bucket).min(n);
            let worst = report.rows[i..end]
                .iter()
                .filter_map(|r| r.drift.get(stat))
                .fold(None, |acc: Option<f64>, d| {
                    Some(acc.map_or(d, |a| a.max(d)))
                });
            if let Some(d) = worst {
                let _ = write!(pts, "{:.1},{:.1} ", x_of(i), y_of(d));
            }
            i = end;
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.trim_end()
        );
        if let Some(tol) = report.tolerances.get(*stat) {
            let y = y_of(*tol);
            let _ = writeln!(
                s,
                r#"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-dasharray="5,4"/>"#,
                LEFT + plot_w
            );
        }
        let ly = TOP + 16.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + plot_w + 12.0,
            LEFT + plot_w + 32.0,
            LEFT + plot_w + 36.0,
            ly + 4.0,
            esc(stat)
        );
    }
    if let Some(fi) = report.rows.iter().position(|r| r.diverged) {
        let x = x_of(fi);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{bottom}" stroke="#d62728" stroke-width="1"/><text x="{:.1}" y="{:.1}" fill="#d62728">{}</text>"##,
            x + 3.0,
            bottom - 6.0,
            esc(&report.rows[fi].port_module)
        );
    }
    s.push_str("</svg>\n");
    s
}
