//! Per-step training metrics: one JSON line per step in `metrics.jsonl`, a one-line summary
//! on the terminal, and a plot of the run (`metrics.svg`).

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Bins of the pool difficulty histogram (p̂ in [0, 0.1), …, [0.9, 1]).
pub const DIFFICULTY_BINS: usize = 10;

/// What one training step did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepMetrics {
    /// Step number (1-based: the step that just finished).
    pub step: u64,
    /// Policy version after the step.
    pub policy_version: u64,
    /// Mean reward of the scored attempts.
    pub reward_mean: f64,
    /// Share of scored attempts with reward 1.
    pub solve_rate: f64,
    /// Attempts run.
    pub attempts: usize,
    /// Attempts scored (in the loss unless their group was degenerate).
    pub scored: usize,
    /// Attempts cut by agent limits (masked; failures for the curriculum).
    pub limit_masked: usize,
    /// Attempts lost to infrastructure (masked; not counted).
    pub infra_masked: usize,
    /// Groups sampled.
    pub groups: usize,
    /// Groups with non-zero reward variance that went into the loss (with dynamic sampling,
    /// the first `tasks_per_step` of them).
    pub usable_groups: usize,
    /// `usable_groups / groups`.
    pub usable_fraction: f64,
    /// Policy loss (aggregated over the step's mini-batches).
    pub loss: f64,
    /// Global gradient norm before clipping (mean over mini-batches).
    pub grad_norm: f64,
    /// Share of loss tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// Mean |log π_trainer − log π_sampler| on the first pass over the step's tokens: the
    /// numeric gap between the training and sampling code paths.
    pub logprob_gap: f64,
    /// Loss-bearing (sampled) tokens this step.
    pub sampled_tokens: usize,
    /// Sampled tokens per second of rollout wall time.
    pub rollout_tokens_per_s: f64,
    /// Trained tokens (whole sequences) per second of update wall time.
    pub train_tokens_per_s: f64,
    /// Seconds spent in rollouts.
    pub rollout_s: f64,
    /// Seconds spent in forward/backward/optimizer.
    pub train_s: f64,
    /// Tasks in the pool.
    pub pool_size: usize,
    /// Active tasks with p̂ inside the learnability band.
    pub band_mass: usize,
    /// Mean p̂ of the tasks sampled this step.
    pub sampled_p_hat: f64,
    /// Pool difficulty histogram: tasks per p̂ bin.
    pub difficulty_hist: Vec<usize>,
    /// Tasks added to the pool this step.
    pub new_tasks: usize,
}

impl StepMetrics {
    /// The terminal line.
    pub fn summary(&self) -> String {
        format!(
            "step {:>4}  reward {:.3}  solved {:>5.1}%  usable groups {}/{}  masked {}+{}  loss {:+.4}  |g| {:.3}  clip {:.3}  gap {:.4}  {:.0} tok/s  band {}/{}",
            self.step,
            self.reward_mean,
            100.0 * self.solve_rate,
            self.usable_groups,
            self.groups,
            self.limit_masked,
            self.infra_masked,
            self.loss,
            self.grad_norm,
            self.clip_fraction,
            self.logprob_gap,
            self.rollout_tokens_per_s,
            self.band_mass,
            self.pool_size,
        )
    }
}

/// Appends one step to a JSONL log (created if missing).
pub fn append(path: &Path, m: &StepMetrics) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot open metrics log {}: {e}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(m)?).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// Reads a JSONL log; a line that does not parse names its line number.
pub fn read(path: &Path) -> anyhow::Result<Vec<StepMetrics>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read metrics log {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| anyhow::anyhow!("{}:{}: not a metrics record: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Keeps the records of steps before `step` (used when a run resumes from a checkpoint older
/// than the log's tail, so the log never holds the same step twice).
pub fn truncate_after(path: &Path, step: u64) -> anyhow::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let kept: Vec<StepMetrics> = read(path)?.into_iter().filter(|m| m.step <= step).collect();
    let mut text = String::new();
    for m in &kept {
        text.push_str(&serde_json::to_string(m)?);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// One line series of a panel.
struct Series<'a> {
    label: &'a str,
    color: &'a str,
    points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Draws one panel at (x0, y0) of size (w, h); y runs from `ymin` to `ymax`.
fn panel(out: &mut String, title: &str, series: &[Series], (x0, y0, w, h): (f64, f64, f64, f64), yr: (f64, f64)) {
    let xmax = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0f64, f64::max);
    let xmin = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(xmax, f64::min).min(xmax - 1.0);
    let (ymin, ymax) = (yr.0, if yr.1 > yr.0 { yr.1 } else { yr.0 + 1.0 });
    let px = |x: f64| x0 + (x - xmin) / (xmax - xmin) * w;
    let py = |y: f64| y0 + h - (y - ymin) / (ymax - ymin) * h;
    out.push_str(&format!(
        "<rect x='{x0}' y='{y0}' width='{w}' height='{h}' fill='none' stroke='#999'/>\n<text x='{}' y='{}' font-size='13' font-weight='bold'>{}</text>\n",
        x0,
        y0 - 8.0,
        esc(title)
    ));
    for k in 0..=4 {
        let y = ymin + (ymax - ymin) * k as f64 / 4.0;
        out.push_str(&format!(
            "<line x1='{x0}' x2='{}' y1='{py}' y2='{py}' stroke='#eee'/><text x='{}' y='{}' font-size='10' text-anchor='end'>{}</text>\n",
            x0 + w,
            x0 - 4.0,
            py(y) + 3.0,
            trim_num(y),
            py = py(y)
        ));
    }
    out.push_str(&format!(
        "<text x='{x0}' y='{}' font-size='10'>step {}</text><text x='{}' y='{}' font-size='10' text-anchor='end'>{}</text>\n",
        y0 + h + 14.0,
        trim_num(xmin),
        x0 + w,
        y0 + h + 14.0,
        trim_num(xmax)
    ));
    for (i, s) in series.iter().enumerate() {
        if s.points.is_empty() {
            continue;
        }
        let pts: Vec<String> =
            s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y.clamp(ymin, ymax)))).collect();
        out.push_str(&format!(
            "<polyline fill='none' stroke='{}' stroke-width='1.8' points='{}'/>\n<text x='{}' y='{}' font-size='11' fill='{}'>{}</text>\n",
            s.color,
            pts.join(" "),
            x0 + w + 8.0,
            y0 + 12.0 + 14.0 * i as f64,
            s.color,
            esc(s.label)
        ));
    }
}

fn trim_num(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Renders the run as an SVG: reward and solve rate, usable-group fraction and band mass,
/// loss and gradient norm, and the last step's pool difficulty histogram.
pub fn plot_svg(steps: &[StepMetrics], title: &str) -> String {
    let (w, h) = (900.0, 760.0);
    let mut out = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='20' y='24' font-size='16'>{}</text>\n",
        esc(title)
    );
    let xs = |f: &dyn Fn(&StepMetrics) -> f64| steps.iter().map(|m| (m.step as f64, f(m))).collect::<Vec<_>>();
    panel(
        &mut out,
        "reward",
        &[
            Series { label: "reward mean", color: "#1f77b4", points: xs(&|m| m.reward_mean) },
            Series { label: "solve rate", color: "#2ca02c", points: xs(&|m| m.solve_rate) },
        ],
        (60.0, 60.0, 650.0, 150.0),
        (0.0, 1.0),
    );
    panel(
        &mut out,
        "groups with gradient / band",
        &[
            Series { label: "usable group share", color: "#ff7f0e", points: xs(&|m| m.usable_fraction) },
            Series {
                label: "band mass / pool",
                color: "#9467bd",
                points: xs(&|m| if m.pool_size == 0 { 0.0 } else { m.band_mass as f64 / m.pool_size as f64 }),
            },
        ],
        (60.0, 250.0, 650.0, 130.0),
        (0.0, 1.0),
    );
    let gmax = steps.iter().map(|m| m.grad_norm).fold(0.0f64, f64::max);
    let lmin = steps.iter().map(|m| m.loss).fold(0.0f64, f64::min);
    let lmax = steps.iter().map(|m| m.loss).fold(0.0f64, f64::max).max(gmax);
    panel(
        &mut out,
        "loss and gradient norm",
        &[
            Series { label: "loss", color: "#d62728", points: xs(&|m| m.loss) },
            Series { label: "grad norm", color: "#7f7f7f", points: xs(&|m| m.grad_norm) },
        ],
        (60.0, 420.0, 650.0, 130.0),
        (lmin, lmax),
    );
    // Difficulty histogram of the last step.
    let (x0, y0, pw, ph) = (60.0, 590.0, 650.0, 130.0);
    out.push_str(&format!(
        "<text x='{x0}' y='{}' font-size='13' font-weight='bold'>pool difficulty (p̂ bins, last step)</text>\n",
        y0 - 8.0
    ));
    if let Some(last) = steps.last() {
        let maxc = last.difficulty_hist.iter().copied().max().unwrap_or(0).max(1) as f64;
        let bw = pw / DIFFICULTY_BINS as f64;
        for (i, &c) in last.difficulty_hist.iter().enumerate() {
            let bh = c as f64 / maxc * ph;
            out.push_str(&format!(
                "<rect x='{:.1}' y='{:.1}' width='{:.1}' height='{:.1}' fill='#17becf'/><text x='{:.1}' y='{}' font-size='10' text-anchor='middle'>{:.1}</text><text x='{:.1}' y='{:.1}' font-size='10' text-anchor='middle'>{c}</text>\n",
                x0 + i as f64 * bw + 2.0,
                y0 + ph - bh,
                bw - 4.0,
                bh,
                x0 + (i as f64 + 0.5) * bw,
                y0 + ph + 14.0,
                i as f64 / DIFFICULTY_BINS as f64,
                x0 + (i as f64 + 0.5) * bw,
                y0 + ph - bh - 3.0,
            ));
        }
    }
    out.push_str("</svg>\n");
    out
}

/// Writes [`plot_svg`] of the log at `jsonl` to `svg`.
pub fn write_plot(jsonl: &Path, svg: &Path, title: &str) -> anyhow::Result<()> {
    let steps = read(jsonl)?;
    std::fs::write(svg, plot_svg(&steps, title)).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", svg.display()))
}

/// A curve averaged over runs: mean and standard deviation at each x (NaN points are skipped).
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// Legend text.
    pub label: String,
    /// SVG colour.
    pub color: String,
    /// The x values (shared by `mean` and `std`).
    pub x: Vec<f64>,
    /// Mean at each x.
    pub mean: Vec<f64>,
    /// Spread at each x (drawn as mean ± std).
    pub std: Vec<f64>,
}

/// One panel of [`bands_svg`].
#[derive(Debug, Clone, PartialEq)]
pub struct BandPanel {
    /// Panel title.
    pub title: String,
    /// y range shown.
    pub y: (f64, f64),
    /// The curves.
    pub bands: Vec<Band>,
}

/// Renders panels of mean curves with shaded ± std bands over a shared x axis named
/// `x_label` (e.g. learning curves of several arms over seeds).
pub fn bands_svg(title: &str, x_label: &str, panels: &[BandPanel]) -> String {
    let (pw, ph, gap) = (620.0, 170.0, 60.0);
    let (w, h) = (900.0, 50.0 + panels.len() as f64 * (ph + gap));
    let mut out = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='20' y='24' font-size='16'>{}</text>\n",
        esc(title)
    );
    for (k, p) in panels.iter().enumerate() {
        let (x0, y0) = (60.0, 60.0 + k as f64 * (ph + gap));
        let xs = p.bands.iter().flat_map(|b| b.x.iter().copied());
        let xmax = xs.clone().fold(f64::MIN, f64::max).max(1.0);
        let xmin = xs.fold(xmax, f64::min).min(xmax - 1.0);
        let (ymin, ymax) = (p.y.0, if p.y.1 > p.y.0 { p.y.1 } else { p.y.0 + 1.0 });
        let px = |x: f64| x0 + (x - xmin) / (xmax - xmin) * pw;
        let py = |y: f64| y0 + ph - (y.clamp(ymin, ymax) - ymin) / (ymax - ymin) * ph;
        out.push_str(&format!(
            "<rect x='{x0}' y='{y0}' width='{pw}' height='{ph}' fill='none' stroke='#999'/>\n<text x='{x0}' y='{}' font-size='13' font-weight='bold'>{}</text>\n",
            y0 - 8.0,
            esc(&p.title)
        ));
        for i in 0..=4 {
            let y = ymin + (ymax - ymin) * i as f64 / 4.0;
            out.push_str(&format!(
                "<line x1='{x0}' x2='{}' y1='{yy:.1}' y2='{yy:.1}' stroke='#eee'/><text x='{}' y='{:.1}' font-size='10' text-anchor='end'>{}</text>\n",
                x0 + pw,
                x0 - 4.0,
                py(y) + 3.0,
                trim_num(y),
                yy = py(y)
            ));
        }
        out.push_str(&format!(
            "<text x='{x0}' y='{}' font-size='10'>{}</text><text x='{}' y='{}' font-size='10' text-anchor='middle'>{}</text><text x='{}' y='{}' font-size='10' text-anchor='end'>{}</text>\n",
            y0 + ph + 14.0,
            trim_num(xmin),
            x0 + pw / 2.0,
            y0 + ph + 14.0,
            esc(x_label),
            x0 + pw,
            y0 + ph + 14.0,
            trim_num(xmax)
        ));
        for (i, b) in p.bands.iter().enumerate() {
            let pts: Vec<(f64, f64, f64)> =
                b.x.iter()
                    .zip(b.mean.iter().zip(&b.std))
                    .filter(|(_, (m, s))| m.is_finite() && s.is_finite())
                    .map(|(&x, (&m, &s))| (x, m, s))
                    .collect();
            if pts.is_empty() {
                continue;
            }
            let upper = pts.iter().map(|&(x, m, s)| format!("{:.1},{:.1}", px(x), py(m + s)));
            let lower = pts.iter().rev().map(|&(x, m, s)| format!("{:.1},{:.1}", px(x), py(m - s)));
            let band: Vec<String> = upper.chain(lower).collect();
            let line: Vec<String> = pts.iter().map(|&(x, m, _)| format!("{:.1},{:.1}", px(x), py(m))).collect();
            out.push_str(&format!(
                "<polygon fill='{c}' fill-opacity='0.15' stroke='none' points='{}'/>\n<polyline fill='none' stroke='{c}' stroke-width='1.8' points='{}'/>\n<text x='{}' y='{}' font-size='11' fill='{c}'>{}</text>\n",
                band.join(" "),
                line.join(" "),
                x0 + pw + 8.0,
                y0 + 12.0 + 14.0 * i as f64,
                esc(&b.label),
                c = b.color
            ));
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trip_truncate_and_plot() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("metrics.jsonl");
        for step in 1..=4 {
            let m = StepMetrics {
                step,
                reward_mean: step as f64 / 4.0,
                groups: 4,
                usable_groups: 2,
                difficulty_hist: vec![step as usize; DIFFICULTY_BINS],
                ..Default::default()
            };
            append(&log, &m).unwrap();
        }
        assert_eq!(read(&log).unwrap().len(), 4);
        truncate_after(&log, 2).unwrap();
        let kept = read(&log).unwrap();
        assert_eq!(kept.iter().map(|m| m.step).collect::<Vec<_>>(), vec![1, 2]);
        let svg = plot_svg(&kept, "run <a>");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("run &lt;a&gt;") && svg.contains("polyline"));
        std::fs::write(&log, "{\"step\": 1}\nnot json\n").unwrap();
        let err = read(&log).unwrap_err().to_string();
        assert!(err.contains(":2:"), "{err}");
    }

    #[test]
    fn bands_plot_has_a_band_and_a_line_per_curve() {
        let band = |label: &str| Band {
            label: label.into(),
            color: "#123456".into(),
            x: vec![0.0, 50.0, 100.0],
            mean: vec![0.1, f64::NAN, 0.5],
            std: vec![0.0, 0.1, 0.05],
        };
        let svg = bands_svg(
            "arms <x>",
            "rollout tokens",
            &[BandPanel { title: "held-out".into(), y: (0.0, 1.0), bands: vec![band("a"), band("b")] }],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("arms &lt;x&gt;") && svg.contains("rollout tokens"));
        assert_eq!(svg.matches("<polygon").count(), 2);
        assert_eq!(svg.matches("<polyline").count(), 2);
        // The NaN point is skipped: two points per line.
        let line = svg.split("<polyline").nth(1).unwrap();
        let pts = line.split("points='").nth(1).unwrap().split('\'').next().unwrap();
        assert_eq!(pts.split(' ').count(), 2, "{pts}");
    }
}
