//! Rust names for protobuf services and methods, shared by validation and generation so
//! that both agree on what the generated code will call things.

use heck::{ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use proc_macro2::{Ident, Span};

/// `lower_snake` name of a method or module, escaped if it is a Rust keyword
/// (`Type` -> `r#type`, `Self` -> `self_`): the convention prost-build uses.
pub(crate) fn snake(name: &str) -> String {
    sanitize(name.to_snake_case())
}

/// `UpperCamel` name of a type or trait, escaped like [`snake`].
pub(crate) fn camel(name: &str) -> String {
    sanitize(name.to_upper_camel_case())
}

/// `SCREAMING_SNAKE` name of a method descriptor constant.
pub(crate) fn shouty(name: &str) -> String {
    let shouty = name.to_shouty_snake_case();
    if shouty.is_empty() || shouty.starts_with(|c: char| c.is_ascii_digit()) {
        format!("METHOD_{shouty}")
    } else {
        shouty
    }
}

/// `name` without a leading `r#`, for building derived names (`r#type` -> `type_blocking`).
pub(crate) fn unraw(name: &str) -> &str {
    name.strip_prefix("r#").unwrap_or(name)
}

/// An identifier from a name made by the functions above (raw if it starts with `r#`).
pub(crate) fn ident(name: &str) -> Ident {
    match name.strip_prefix("r#") {
        Some(raw) => Ident::new_raw(raw, Span::call_site()),
        None => Ident::new(name, Span::call_site()),
    }
}

fn sanitize(name: String) -> String {
    match name.as_str() {
        // Strict and reserved keywords of every edition: usable as raw identifiers.
        "as" | "break" | "const" | "continue" | "else" | "enum" | "false" | "fn" | "for" | "if"
        | "impl" | "in" | "let" | "loop" | "match" | "mod" | "move" | "mut" | "pub" | "ref"
        | "return" | "static" | "struct" | "trait" | "true" | "type" | "unsafe" | "use"
        | "where" | "while" | "dyn" | "abstract" | "become" | "box" | "do" | "final" | "macro"
        | "override" | "priv" | "typeof" | "unsized" | "virtual" | "yield" | "async" | "await"
        | "try" | "gen" => format!("r#{name}"),
        // Keywords that cannot be raw identifiers.
        "_" | "super" | "self" | "Self" | "extern" | "crate" => format!("{name}_"),
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prost_conventions() {
        assert_eq!(snake("SayHello"), "say_hello");
        assert_eq!(snake("Type"), "r#type");
        assert_eq!(snake("Self"), "self_");
        assert_eq!(camel("echo_service"), "EchoService");
        assert_eq!(shouty("SayHello"), "SAY_HELLO");
        assert_eq!(unraw("r#type"), "type");
        assert_eq!(ident("r#type").to_string(), "r#type");
        assert_eq!(ident("say_hello").to_string(), "say_hello");
    }
}
