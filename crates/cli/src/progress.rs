//! The libraries' [`Progress`] reports drawn as indicatif bars on stderr (hidden when stderr
//! is not a terminal).

use frognano_swe::progress::Progress;
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar for one job.
pub struct Bar {
    bar: ProgressBar,
    /// Whether the bar disappears when the job is over (else its last state stays).
    clear: bool,
}

impl Bar {
    fn styled(template: &str, progress_chars: Option<&str>, clear: bool) -> Bar {
        let mut style = ProgressStyle::with_template(template).expect("static template");
        if let Some(chars) = progress_chars {
            style = style.progress_chars(chars);
        }
        let bar = ProgressBar::new(0);
        bar.set_style(style);
        Bar { bar, clear }
    }

    /// `grade [00:00:12] =====>    3/10 resolved 2, errors 0`, left on screen at the end
    /// (`frognano eval`, `synth calibrate`).
    pub fn counting() -> Bar {
        Bar::styled("{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}", Some("=> "), false)
    }

    /// Candidates validated by `frognano synth`, cleared at the end.
    pub fn candidates() -> Bar {
        Bar::styled("{bar:30} {pos}/{len} candidates {msg} [{elapsed_precise}]", None, true)
    }

    /// Training steps of `frognano train`, cleared at the end.
    pub fn steps() -> Bar {
        Bar::styled("{bar:30} {pos}/{len} steps  {elapsed} elapsed, {eta} left", None, true)
    }
}

impl Progress for Bar {
    fn start(&self, label: &str, total: u64, done: u64) {
        self.bar.set_prefix(label.to_string());
        self.bar.set_length(total);
        self.bar.set_position(done);
        self.bar.reset_elapsed();
        self.bar.reset_eta();
    }

    fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    fn add_total(&self, n: u64) {
        self.bar.inc_length(n);
    }

    fn message(&self, text: &str) {
        self.bar.set_message(text.to_string());
    }

    fn println(&self, line: &str) {
        // A hidden bar (no terminal) drops println: write the line to stderr ourselves.
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    fn finish(&self) {
        if self.clear {
            self.bar.finish_and_clear();
        } else {
            self.bar.finish();
        }
    }
}

/// A long prompt's prefill in `frognano run` / `chat` on stderr (a terminal only):
/// `prefill ██████░░░░ 1024/2501 tokens  157 tok/s, 9s left`, cleared when the reply starts.
pub struct PrefillBar {
    bar: ProgressBar,
    /// Tokens that were in the state already.
    reused: u64,
    started: std::time::Instant,
}

impl PrefillBar {
    /// A bar for a prompt of `total` tokens, `reused` of them in the state already.
    pub fn new(total: u64, reused: u64) -> PrefillBar {
        let style =
            ProgressStyle::with_template("prefill {bar:30} {pos}/{len} tokens  {msg}").expect("static template");
        let bar = ProgressBar::new(total);
        bar.set_style(style);
        bar.set_position(reused);
        PrefillBar { bar, reused, started: std::time::Instant::now() }
    }

    /// `done` of `total` tokens in, with the rate so far and the time left at it. (The rate is
    /// computed here, when a piece ends: indicatif's estimate decays while a piece runs, and
    /// the pieces come seconds apart.)
    pub fn show(&self, done: u64, total: u64) {
        let (ran, secs) = (done.saturating_sub(self.reused), self.started.elapsed().as_secs_f64());
        if ran > 0 && secs > 0.0 {
            let rate = ran as f64 / secs;
            let left = (total.saturating_sub(done) as f64 / rate).round() as u64;
            let left = if left >= 60 { format!("{}m {:02}s", left / 60, left % 60) } else { format!("{left}s") };
            self.bar.set_message(format!("{rate:.0} tok/s, {left} left"));
        }
        self.bar.set_length(total);
        self.bar.set_position(done);
    }

    /// Takes the bar off the screen.
    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }
}
