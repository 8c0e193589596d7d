//! Checks on the services to generate, run before any code is written: streaming methods
//! (not supported yet) and protobuf names that would map onto the same Rust item.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;

use prost_types::{FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto};

use crate::error::{display_path, invalid_input};
use crate::naming;

/// Field numbers of `FileDescriptorProto.service` and `ServiceDescriptorProto.method`, for
/// locating items in `SourceCodeInfo`.
const FILE_SERVICE: i32 = 6;
const SERVICE_METHOD: i32 = 2;

/// Which halves will be generated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Halves {
    pub client: bool,
    pub server: bool,
}

/// Fails with every problem found, one `file:line:column: message` line each.
pub(crate) fn check_services(
    fds: &FileDescriptorSet,
    includes: &[PathBuf],
    halves: Halves,
) -> io::Result<()> {
    if !halves.client && !halves.server {
        return Ok(());
    }
    let mut problems = Vec::new();
    // Rust module name -> the service that claimed it, per package.
    let mut modules: HashMap<(&str, String), String> = HashMap::new();
    for file in &fds.file {
        let locate = |path: &[i32]| location(file, path, includes);
        for (si, service) in file.service.iter().enumerate() {
            let service_name = qualified(file.package(), service.name());
            let service_loc = locate(&[FILE_SERVICE, si as i32]);
            let snake = naming::unraw(&naming::snake(service.name())).to_owned();
            for (suffix, wanted) in [("_client", halves.client), ("_server", halves.server)] {
                let module = format!("{snake}{suffix}");
                if !wanted {
                    continue;
                }
                if let Some(other) =
                    modules.insert((file.package(), module.clone()), service_name.clone())
                {
                    problems.push(format!(
                        "{service_loc}services {other} and {service_name} both generate module `{module}`"
                    ));
                }
            }

            let client = format!("{}Client", naming::unraw(&naming::camel(service.name())));
            let server_trait = naming::unraw(&naming::camel(service.name())).to_owned();
            let server_mod = format!("{snake}_server");
            let mut names = Names::default();
            if halves.client {
                names.claim(format!("{client}::new"), "the generated constructor");
                names.claim(format!("{client}::channel"), "the generated accessor");
            }
            if halves.server {
                names.claim(
                    format!("{server_mod}::SERVICE_NAME"),
                    "the generated service name constant",
                );
            }
            for (mi, method) in service.method.iter().enumerate() {
                let loc = locate(&[FILE_SERVICE, si as i32, SERVICE_METHOD, mi as i32]);
                let method_name = format!("{service_name}/{}", method.name());
                if let Some(kind) = streaming_kind(method) {
                    problems.push(format!(
                        "{loc}streaming method {method_name} is not supported yet ({kind}); \
                         only unary methods can be generated"
                    ));
                }
                let fn_name = naming::unraw(&naming::snake(method.name())).to_owned();
                let mut items = Vec::new();
                if halves.client {
                    items.push(format!("{client}::{fn_name}"));
                    items.push(format!("{client}::{fn_name}_blocking"));
                }
                if halves.server {
                    items.push(format!("{server_trait}::{fn_name}"));
                    items.push(format!("{server_mod}::{}", naming::shouty(method.name())));
                }
                let owner = format!("method {method_name}");
                // Clashing items grouped by what they clash with, in a stable order.
                let mut clashes: Vec<(String, Vec<String>)> = Vec::new();
                for item in items {
                    if let Some(other) = names.claim(item.clone(), &owner) {
                        match clashes.iter_mut().find(|(o, _)| *o == other) {
                            Some((_, list)) => list.push(item),
                            None => clashes.push((other, vec![item])),
                        }
                    }
                }
                for (other, items) in clashes {
                    let items = items
                        .iter()
                        .map(|item| format!("`{item}`"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    problems.push(format!(
                        "{loc}{owner} clashes with {other}: both generate {items}"
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(invalid_input(problems.join("\n")))
    }
}

/// Generated item names of one service and what claimed each.
#[derive(Default)]
struct Names(HashMap<String, String>);

impl Names {
    /// Claims `name` for `owner`; returns the previous owner if it was taken.
    fn claim(&mut self, name: String, owner: &str) -> Option<String> {
        match self.0.get(&name) {
            Some(previous) => Some(previous.clone()),
            None => {
                self.0.insert(name, owner.to_owned());
                None
            }
        }
    }
}

fn qualified(package: &str, name: &str) -> String {
    if package.is_empty() {
        name.to_owned()
    } else {
        format!("{package}.{name}")
    }
}

fn streaming_kind(method: &MethodDescriptorProto) -> Option<&'static str> {
    match (method.client_streaming(), method.server_streaming()) {
        (false, false) => None,
        (true, false) => Some("client streaming"),
        (false, true) => Some("server streaming"),
        (true, true) => Some("bidirectional streaming"),
    }
}

/// `file:line:column: ` of the item at `path` in `file`, or `file: ` without source info.
fn location(file: &FileDescriptorProto, path: &[i32], includes: &[PathBuf]) -> String {
    let name = display_path(file.name(), includes);
    let span = file
        .source_code_info
        .as_ref()
        .and_then(|info| info.location.iter().find(|loc| loc.path == path))
        .map(|loc| loc.span.clone());
    match span.as_deref() {
        Some([line, column, ..]) => format!("{name}:{}:{}: ", line + 1, column + 1),
        _ => format!("{name}: "),
    }
}
