//! The spinner `exec --wait` shows at a terminal: one row that names the key, the holder,
//! its lease and the time waited, fitted to the terminal's width, and drawn so that the
//! `^C` a terminal echoes after it stays on its row.

use std::io;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

/// Columns the spinner's row leaves free at its end for the `^C` a terminal echoes there,
/// plus one. indicatif pads its row with spaces to the terminal's last column: the echo
/// then wrapped onto a new row, the "interrupted" line was written there, and the spinner's
/// row stayed above it (a redraw clears only its own row).
const ECHO_COLUMNS: usize = 3;

/// Columns before the message: the spinner and a space.
const LEAD_COLUMNS: usize = 2;

/// Starts the spinner on stderr (drawn 8 times a second, with no message yet).
pub fn start() -> ProgressBar {
    let target = ProgressDrawTarget::term_like(Box::new(Narrower(console::Term::stderr())));
    let bar = ProgressBar::with_draw_target(None, target);
    // `wide_msg` cuts what `row` could not fit at the edge (one row whatever the width: a
    // wrapped row is more than a redraw clears).
    if let Ok(style) = ProgressStyle::with_template("{spinner} {wide_msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// stderr, `ECHO_COLUMNS` narrower than it is.
#[derive(Debug)]
struct Narrower(console::Term);

impl TermLike for Narrower {
    fn width(&self) -> u16 {
        TermLike::width(&self.0)
            .saturating_sub(ECHO_COLUMNS as u16)
            .max(1)
    }

    fn height(&self) -> u16 {
        TermLike::height(&self.0)
    }

    fn move_cursor_up(&self, n: usize) -> io::Result<()> {
        TermLike::move_cursor_up(&self.0, n)
    }

    fn move_cursor_down(&self, n: usize) -> io::Result<()> {
        TermLike::move_cursor_down(&self.0, n)
    }

    fn move_cursor_right(&self, n: usize) -> io::Result<()> {
        TermLike::move_cursor_right(&self.0, n)
    }

    fn move_cursor_left(&self, n: usize) -> io::Result<()> {
        TermLike::move_cursor_left(&self.0, n)
    }

    fn write_line(&self, s: &str) -> io::Result<()> {
        TermLike::write_line(&self.0, s)
    }

    fn write_str(&self, s: &str) -> io::Result<()> {
        TermLike::write_str(&self.0, s)
    }

    fn clear_line(&self) -> io::Result<()> {
        TermLike::clear_line(&self.0)
    }

    fn flush(&self) -> io::Result<()> {
        TermLike::flush(&self.0)
    }
}

/// The width of the terminal on stderr, if it is one.
pub fn columns() -> Option<usize> {
    console::Term::stderr()
        .size_checked()
        .map(|(_, cols)| usize::from(cols))
}

/// The spinner's message, `KEY: HOLDER TAIL`, made to fit a terminal of `columns` (the
/// whole message when it fits, or when the width is unknown). The key is shortened first,
/// in its middle, then `held by ` dropped, so the holder, its lease and the time waited
/// (`tail`) stay in sight; what still does not fit is cut at the row's edge.
pub fn row(key: &str, holder: &str, tail: &str, columns: Option<usize>) -> String {
    let whole = format!("{key}: {holder}{tail}");
    let Some(columns) = columns else {
        return whole;
    };
    let room = columns.saturating_sub(LEAD_COLUMNS + ECHO_COLUMNS);
    if width(&whole) <= room {
        return whole;
    }
    let short = holder.strip_prefix("held by ").unwrap_or(holder);
    for (holder, shortest) in [(holder, 12), (short, 4)] {
        let left = room.saturating_sub(width(holder) + width(tail) + 2);
        if left >= shortest {
            return format!("{}: {holder}{tail}", shorten(key, left));
        }
    }
    format!("{}: {short}{tail}", shorten(key, 4))
        .chars()
        .take(room)
        .collect()
}

/// Columns a message takes (one per character: keys and labels are mostly ASCII).
fn width(s: &str) -> usize {
    s.chars().count()
}

/// `s` in at most `max` columns, its middle replaced by `…` if it is longer.
fn shorten(s: &str, max: usize) -> String {
    let n = width(s);
    if n <= max {
        return s.to_owned();
    }
    let keep = max.saturating_sub(1);
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let chars: Vec<char> = s.chars().collect();
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[n - tail..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_keeps_the_holder_lease_and_wait() {
        let key = "reports:quarterly:2026-q4:eu-west-1:consolidated";
        let holder = "held by night-report, lease 26.1s left";
        let tail = " (waiting 3s)";
        let whole = format!("{key}: {holder}{tail}");
        assert_eq!(row(key, holder, tail, None), whole);
        assert_eq!(row(key, holder, tail, Some(200)), whole);
        for columns in [100, 80, 60, 50, 20] {
            let row = row(key, holder, tail, Some(columns));
            assert!(
                width(&row) + LEAD_COLUMNS + ECHO_COLUMNS <= columns,
                "{columns}: {row:?}"
            );
            if columns < 60 {
                continue;
            }
            assert!(
                row.contains("night-report, lease 26.1s left (waiting 3s)"),
                "{columns}: {row:?}"
            );
            assert!(row.starts_with("re") && row.contains('…'), "{row:?}");
        }
        // `held by` goes only when the key would be shorter than 12 columns with it.
        assert!(row(key, holder, tail, Some(80)).contains("held by"));
        assert!(!row(key, holder, tail, Some(60)).contains("held by"));
    }

    #[test]
    fn shorten_keeps_both_ends() {
        assert_eq!(shorten("abcdefghij", 10), "abcdefghij");
        assert_eq!(shorten("abcdefghij", 5), "ab…ij");
        assert_eq!(shorten("abcdefghij", 6), "abc…ij");
        assert_eq!(shorten("ab", 1), "…");
    }
}
