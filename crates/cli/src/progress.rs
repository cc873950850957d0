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
