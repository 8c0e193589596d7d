//! Checks on the services to generate, run before any code is written: protobuf names that
//! would map onto the same Rust item.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;

use prost_types::{FileDescriptorProto, FileDescriptorSet, ServiceDescriptorProto};

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
    // (package, Rust module) -> the service that generates it.
    let mut modules = HashMap::new();
    for file in &fds.file {
        for (index, descriptor) in file.service.iter().enumerate() {
            let service = ServiceAt {
                file,
                index,
                descriptor,
                includes,
            };
            check_modules(&service, halves, &mut modules, &mut problems);
            check_methods(&service, halves, &mut problems);
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(invalid_input(problems.join("\n")))
    }
}

/// A service and where it is defined.
struct ServiceAt<'a> {
    file: &'a FileDescriptorProto,
    index: usize,
    descriptor: &'a ServiceDescriptorProto,
    includes: &'a [PathBuf],
}

impl ServiceAt<'_> {
    /// `pkg.Foo`.
    fn full_name(&self) -> String {
        match self.file.package() {
            "" => self.descriptor.name().to_owned(),
            package => format!("{package}.{}", self.descriptor.name()),
        }
    }

    /// The service's Rust names: `foo` (modules) and `Foo` (trait, client and server types).
    fn rust_names(&self) -> (String, String) {
        let name = self.descriptor.name();
        let snake = naming::unraw(&naming::snake(name)).to_owned();
        let camel = naming::unraw(&naming::camel(name)).to_owned();
        (snake, camel)
    }

    /// `file:line:column: ` of the service, or of its method `method`.
    fn location(&self, method: Option<usize>) -> String {
        let mut path = vec![FILE_SERVICE, index_i32(self.index)];
        if let Some(method) = method {
            path.extend([SERVICE_METHOD, index_i32(method)]);
        }
        location(self.file, &path, self.includes)
    }
}

/// Two services of one package must not generate the same module.
fn check_modules<'a>(
    service: &ServiceAt<'a>,
    halves: Halves,
    modules: &mut HashMap<(&'a str, String), String>,
    problems: &mut Vec<String>,
) {
    let (snake, _) = service.rust_names();
    let full_name = service.full_name();
    let suffixes = [("client", halves.client), ("server", halves.server)];
    for (suffix, _) in suffixes.iter().filter(|(_, wanted)| *wanted) {
        let module = format!("{snake}_{suffix}");
        let key = (service.file.package(), module.clone());
        if let Some(other) = modules.insert(key, full_name.clone()) {
            problems.push(format!(
                "{}services {other} and {full_name} both generate module `{module}`",
                service.location(None)
            ));
        }
    }
}

/// Every method must map to Rust names no other item of the service uses.
fn check_methods(service: &ServiceAt<'_>, halves: Halves, problems: &mut Vec<String>) {
    let (snake, camel) = service.rust_names();
    let client = format!("{camel}Client");
    let server_mod = format!("{snake}_server");
    let mut names = Names::default();
    if halves.client {
        names.claim(format!("{client}::new"), "the generated constructor");
        names.claim(format!("{client}::channel"), "the generated accessor");
    }
    if halves.server {
        let name = format!("{server_mod}::SERVICE_NAME");
        names.claim(name, "the generated service name constant");
    }

    for (index, method) in service.descriptor.method.iter().enumerate() {
        let loc = service.location(Some(index));
        let method_name = format!("{}/{}", service.full_name(), method.name());

        let fn_name = naming::unraw(&naming::snake(method.name())).to_owned();
        let mut items = Vec::new();
        if halves.client {
            items.push(format!("{client}::{fn_name}"));
            items.push(format!("{client}::{fn_name}_blocking"));
        }
        if halves.server {
            items.push(format!("{camel}::{fn_name}"));
            items.push(format!("{server_mod}::{}", naming::shouty(method.name())));
        }
        let owner = format!("method {method_name}");
        // Clashing items grouped by what they clash with, in a stable order.
        let mut clashes: Vec<(String, Vec<String>)> = Vec::new();
        for item in items {
            let Some(other) = names.claim(item.clone(), &owner) else {
                continue;
            };
            match clashes.iter_mut().find(|(o, _)| *o == other) {
                Some((_, list)) => list.push(format!("`{item}`")),
                None => clashes.push((other, vec![format!("`{item}`")])),
            }
        }
        for (other, items) in clashes {
            let items = items.join(", ");
            problems.push(format!(
                "{loc}{owner} clashes with {other}: both generate {items}"
            ));
        }
    }
}

/// Generated item names of one service and what claimed each.
#[derive(Default)]
struct Names(HashMap<String, String>);

impl Names {
    /// Claims `name` for `owner`; returns the previous owner if it was taken.
    fn claim(&mut self, name: String, owner: &str) -> Option<String> {
        if let Some(previous) = self.0.get(&name) {
            return Some(previous.clone());
        }
        self.0.insert(name, owner.to_owned());
        None
    }
}

/// Descriptor indexes fit `i32` (protobuf limits the number of services and methods).
fn index_i32(index: usize) -> i32 {
    i32::try_from(index).unwrap_or(i32::MAX)
}

/// `file:line:column: ` of the item at `path` in `file`, or `file: ` without source info.
fn location(file: &FileDescriptorProto, path: &[i32], includes: &[PathBuf]) -> String {
    let name = display_path(file.name(), includes);
    let span = file
        .source_code_info
        .as_ref()
        .and_then(|info| info.location.iter().find(|loc| loc.path == path))
        .map(|loc| loc.span.as_slice());
    match span {
        Some([line, column, ..]) => format!("{name}:{}:{}: ", line + 1, column + 1),
        _ => format!("{name}: "),
    }
}
