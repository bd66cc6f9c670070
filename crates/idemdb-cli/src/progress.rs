//! The progress bar of long scans, exports and verifications: on stderr, only when stderr is a
//! terminal, not with `--quiet`, and not while records stream to a terminal on stdout (the
//! lines are the progress then).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Below this many records a pass is over before a bar would mean anything.
const MIN_RECORDS: u64 = 10_000;

pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A bar over `total` records, or nothing (see the module's rules). `streams_to_stdout`:
    /// the command writes a line per record.
    pub fn new(what: &'static str, total: u64, quiet: bool, streams_to_stdout: bool) -> Progress {
        let show = !quiet
            && total >= MIN_RECORDS
            && std::io::stderr().is_terminal()
            && !(streams_to_stdout && std::io::stdout().is_terminal());
        if !show {
            return Progress(None);
        }
        let style = ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} records ({eta} left)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
            .with_style(style)
            .with_message(what);
        Progress(Some(bar))
    }

    /// Records read so far (the total grows if the file had more than counted).
    pub fn set(&self, read: u64) {
        if let Some(bar) = &self.0 {
            if bar.length().is_some_and(|len| read > len) {
                bar.set_length(read);
            }
            bar.set_position(read);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
