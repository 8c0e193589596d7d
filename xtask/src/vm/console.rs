//! The marker protocol on the guest console: `init.sh` and the generated guest script print
//! `@@xtask-vm <nonce> <event> [args]` lines; the host parses them out of the serial output.
//! The nonce keeps a command that happens to print such text from confusing the runner.

use std::collections::VecDeque;

/// The prefix every marker starts with.
pub const MARKER: &str = "@@xtask-vm";

/// Progress reported by the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `init.sh` (PID 1) started.
    Init,
    /// The host root is mounted; the guest script is about to start.
    Root,
    /// The guest script started setting up soft-RoCE.
    Setup,
    /// `rxe0` is up; steps follow.
    Ready,
    /// Step `n` started.
    Begin(usize),
    /// Step `n` ended with this exit code.
    End(usize, i32),
    /// Setup failed: the reason.
    Fail(String),
    /// The guest script exited with this code (normally after `Done`).
    Exit(i32),
    /// All steps ran.
    Done,
}

/// Splits a console line into the text before a marker (a command's output that did not end
/// with a newline) and the marker's event; `None` when the line has no marker for `nonce`.
pub fn parse<'a>(line: &'a str, nonce: &str) -> Option<(&'a str, Event)> {
    let at = line.find(MARKER)?;
    let (before, marker) = line.split_at(at);
    let mut words = marker[MARKER.len()..].split_whitespace();
    if words.next()? != nonce {
        return None;
    }
    let name = words.next()?;
    let mut number = || words.next().and_then(|w| w.parse::<i64>().ok());
    let event = match name {
        "init" => Event::Init,
        "root" => Event::Root,
        "setup" => Event::Setup,
        "ready" => Event::Ready,
        "begin" => Event::Begin(usize::try_from(number()?).ok()?),
        "end" => {
            let step = usize::try_from(number()?).ok()?;
            Event::End(step, i32::try_from(number()?).ok()?)
        }
        "exit" => Event::Exit(i32::try_from(number()?).ok()?),
        "done" => Event::Done,
        "fail" => {
            let reason = marker[MARKER.len()..]
                .split_once(" fail")
                .map(|(_, r)| r.trim())
                .unwrap_or_default();
            Event::Fail(reason.to_string())
        }
        _ => return None,
    };
    Some((before, event))
}

/// The last `capacity` console lines, for error messages.
#[derive(Debug)]
pub struct Tail {
    lines: VecDeque<String>,
    capacity: usize,
}

impl Tail {
    /// An empty tail keeping `capacity` lines.
    pub fn new(capacity: usize) -> Self {
        Tail {
            lines: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Remembers a line, forgetting the oldest beyond capacity.
    pub fn push(&mut self, line: &str) {
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
        }
        self.lines.push_back(line.to_string());
    }

    /// The remembered lines joined with newlines.
    pub fn text(&self) -> String {
        self.lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_markers() {
        assert_eq!(parse("@@xtask-vm N ready", "N"), Some(("", Event::Ready)));
        assert_eq!(
            parse("@@xtask-vm N end 3 -1", "N"),
            Some(("", Event::End(3, -1)))
        );
        assert_eq!(
            parse("partial@@xtask-vm N begin 0", "N"),
            Some(("partial", Event::Begin(0)))
        );
        assert_eq!(
            parse("@@xtask-vm N fail insmod /lib/x.ko", "N"),
            Some(("", Event::Fail("insmod /lib/x.ko".into())))
        );
        assert_eq!(parse("@@xtask-vm OTHER ready", "N"), None);
        assert_eq!(parse("plain output", "N"), None);
        assert_eq!(parse("@@xtask-vm N end x", "N"), None);
    }
}
