//! Turning protox diagnostics into `io::Error`s that say `file:line:column: message`.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;

use miette::{Diagnostic, LabeledSpan, SourceCode};

/// An `InvalidInput` error with `message`.
pub(crate) fn invalid_input(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message.into())
}

/// Converts a protox error: one `file:line:column: message` line per diagnostic (the error
/// and its related errors), with the help text if any. I/O failures keep their kind.
pub(crate) fn from_protox(err: &protox::Error, includes: &[PathBuf]) -> io::Error {
    let kind = if err.is_io() {
        io::ErrorKind::Other
    } else if err.is_file_not_found() {
        io::ErrorKind::NotFound
    } else {
        io::ErrorKind::InvalidInput
    };
    let message = render(err, err.file(), includes);
    io::Error::new(kind, message)
}

/// Renders `diagnostic` and its related diagnostics; `file` names the source when the
/// diagnostic carries no source code of its own.
fn render(diagnostic: &dyn Diagnostic, file: Option<&str>, includes: &[PathBuf]) -> String {
    let source = diagnostic.source_code();
    let mut out = String::new();
    render_one(&mut out, diagnostic, source, file, includes);
    for related in diagnostic.related().into_iter().flatten() {
        out.push('\n');
        render_one(
            &mut out,
            related,
            related.source_code().or(source),
            file,
            includes,
        );
    }
    out
}

fn render_one(
    out: &mut String,
    diagnostic: &dyn Diagnostic,
    source: Option<&dyn SourceCode>,
    file: Option<&str>,
    includes: &[PathBuf],
) {
    // Like miette's own reports, the first label gives the position; the others are listed.
    let labels: Vec<LabeledSpan> = diagnostic.labels().into_iter().flatten().collect();
    let positions: Vec<Option<Position>> = labels
        .iter()
        .map(|label| {
            let contents = source?.read_span(label.inner(), 0, 0).ok()?;
            Some(Position {
                file: contents
                    .name()
                    .or(file)
                    .map(|name| display_path(name, includes)),
                line: contents.line() + 1,
                column: contents.column() + 1,
            })
        })
        .collect();
    match positions.first().cloned().flatten() {
        Some(Position {
            file: name,
            line,
            column,
        }) => {
            let name = name.as_deref().unwrap_or("<unknown>");
            let _ = write!(out, "{name}:{line}:{column}: {diagnostic}");
        }
        None => match file {
            Some(name) if !diagnostic.to_string().contains(name) => {
                let _ = write!(out, "{}: {diagnostic}", display_path(name, includes));
            }
            _ => {
                let _ = write!(out, "{diagnostic}");
            }
        },
    }
    let notes: Vec<String> = labels
        .iter()
        .zip(&positions)
        .enumerate()
        .filter_map(|(i, (label, position))| {
            // A lone label ("found here") adds nothing to the position already given.
            let text = label.label().filter(|_| labels.len() > 1)?;
            Some(match position {
                Some(p) if i > 0 => format!("{text} at {}:{}", p.line, p.column),
                _ => text.to_owned(),
            })
        })
        .collect();
    if !notes.is_empty() {
        let _ = write!(out, " ({})", notes.join("; "));
    }
    if let Some(help) = diagnostic.help() {
        let _ = write!(out, "\n  help: {help}");
    }
}

/// Where a label points.
#[derive(Clone)]
struct Position {
    file: Option<String>,
    line: usize,
    column: usize,
}

/// The path of protobuf file `name` under the first include directory that holds it, or
/// `name` itself (vendored and well-known files).
pub(crate) fn display_path(name: &str, includes: &[PathBuf]) -> String {
    includes
        .iter()
        .map(|include| include.join(name))
        .find(|path| path.is_file())
        .map_or_else(|| name.to_owned(), |path| path.display().to_string())
}
