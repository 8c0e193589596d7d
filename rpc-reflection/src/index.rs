//! What the registered descriptor sets declare: each file (encoded, with its dependencies),
//! the file that declares each symbol and extension, and the services.

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;
use prost::Message;
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};

/// Every registered file and what it declares.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// File name → the encoded `FileDescriptorProto`.
    files: HashMap<String, Bytes>,
    /// File name → the files it imports.
    deps: HashMap<String, Vec<String>>,
    /// Fully qualified symbol (no leading dot) → its file.
    symbols: HashMap<String, String>,
    /// (extended message, field number) → the file declaring the extension.
    extensions: HashMap<(String, i32), String>,
    /// Fully qualified services, sorted.
    services: BTreeSet<String>,
}

/// `package.name`, or `name` without a package.
fn qualified(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_owned()
    } else {
        format!("{scope}.{name}")
    }
}

impl Index {
    /// Adds every file of `set` (a file already known keeps its first registration).
    pub(crate) fn add(&mut self, set: FileDescriptorSet) {
        for file in set.file {
            let name = file.name().to_owned();
            if self.files.contains_key(&name) {
                continue;
            }
            self.index_file(&name, &file);
            self.deps.insert(name.clone(), file.dependency.clone());
            self.files.insert(name, file.encode_to_vec().into());
        }
    }

    fn index_file(&mut self, name: &str, file: &FileDescriptorProto) {
        let package = file.package();
        for service in &file.service {
            let full = qualified(package, service.name());
            for method in &service.method {
                self.symbol(qualified(&full, method.name()), name);
            }
            self.services.insert(full.clone());
            self.symbol(full, name);
        }
        for message in &file.message_type {
            self.index_message(package, message, name);
        }
        for en in &file.enum_type {
            self.symbol(qualified(package, en.name()), name);
        }
        for ext in &file.extension {
            self.symbol(qualified(package, ext.name()), name);
            self.extension(ext.extendee(), ext.number(), name);
        }
    }

    fn index_message(&mut self, scope: &str, message: &DescriptorProto, file: &str) {
        let full = qualified(scope, message.name());
        for nested in &message.nested_type {
            self.index_message(&full, nested, file);
        }
        for en in &message.enum_type {
            self.symbol(qualified(&full, en.name()), file);
        }
        for ext in &message.extension {
            self.symbol(qualified(&full, ext.name()), file);
            self.extension(ext.extendee(), ext.number(), file);
        }
        self.symbol(full, file);
    }

    fn symbol(&mut self, symbol: String, file: &str) {
        self.symbols
            .entry(symbol)
            .or_insert_with(|| file.to_owned());
    }

    fn extension(&mut self, extendee: &str, number: i32, file: &str) {
        let key = (extendee.trim_start_matches('.').to_owned(), number);
        self.extensions
            .entry(key)
            .or_insert_with(|| file.to_owned());
    }

    /// The file `name` and every file it depends on, transitively, each once (the file
    /// first), or `None` if it is not registered.
    pub(crate) fn file_with_deps(&self, name: &str) -> Option<Vec<Bytes>> {
        self.files.get(name)?;
        let mut order = vec![name.to_owned()];
        let mut seen: BTreeSet<String> = order.iter().cloned().collect();
        let mut at = 0;
        while at < order.len() {
            for dep in self.deps.get(&order[at]).into_iter().flatten() {
                if self.files.contains_key(dep) && seen.insert(dep.clone()) {
                    order.push(dep.clone());
                }
            }
            at += 1;
        }
        Some(order.iter().map(|file| self.files[file].clone()).collect())
    }

    /// The file declaring `symbol` (fully qualified, a leading dot allowed).
    pub(crate) fn file_of_symbol(&self, symbol: &str) -> Option<&str> {
        self.symbols
            .get(symbol.trim_start_matches('.'))
            .map(String::as_str)
    }

    /// The file declaring the extension `number` of `message`.
    pub(crate) fn file_of_extension(&self, message: &str, number: i32) -> Option<&str> {
        let key = (message.trim_start_matches('.').to_owned(), number);
        self.extensions.get(&key).map(String::as_str)
    }

    /// The field numbers of `message`'s known extensions, ascending, if it is a message
    /// this index knows.
    pub(crate) fn extension_numbers(&self, message: &str) -> Option<Vec<i32>> {
        let message = message.trim_start_matches('.');
        self.symbols.get(message)?;
        let mut numbers: Vec<i32> = self
            .extensions
            .keys()
            .filter(|(extended, _)| extended == message)
            .map(|(_, number)| *number)
            .collect();
        numbers.sort_unstable();
        Some(numbers)
    }

    /// The services, sorted.
    pub(crate) fn services(&self) -> impl Iterator<Item = &str> {
        self.services.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use prost_types::{
        EnumDescriptorProto, FieldDescriptorProto, MethodDescriptorProto, ServiceDescriptorProto,
    };

    use super::*;

    fn named<T: Default>(set: impl FnOnce(&mut T)) -> T {
        let mut value = T::default();
        set(&mut value);
        value
    }

    /// `a.proto`: package `p`, message `M` (nested `N`, enum `E`), service `S` (`Do`);
    /// `b.proto` imports it and extends `p.M` with field 100.
    fn index() -> Index {
        let a = named(|f: &mut FileDescriptorProto| {
            f.name = Some("a.proto".into());
            f.package = Some("p".into());
            f.message_type = vec![named(|m: &mut DescriptorProto| {
                m.name = Some("M".into());
                m.nested_type = vec![named(|n: &mut DescriptorProto| n.name = Some("N".into()))];
                m.enum_type = vec![named(|e: &mut EnumDescriptorProto| {
                    e.name = Some("E".into())
                })];
            })];
            f.service = vec![named(|s: &mut ServiceDescriptorProto| {
                s.name = Some("S".into());
                s.method = vec![named(|m: &mut MethodDescriptorProto| {
                    m.name = Some("Do".into())
                })];
            })];
        });
        let b = named(|f: &mut FileDescriptorProto| {
            f.name = Some("b.proto".into());
            f.package = Some("p".into());
            f.dependency = vec!["a.proto".into(), "not-registered.proto".into()];
            f.extension = vec![named(|x: &mut FieldDescriptorProto| {
                x.name = Some("tag".into());
                x.extendee = Some(".p.M".into());
                x.number = Some(100);
            })];
        });
        let mut index = Index::default();
        index.add(FileDescriptorSet { file: vec![a, b] });
        index
    }

    #[test]
    fn symbols_files_and_extensions() {
        let index = index();
        for symbol in ["p.M", "p.M.N", "p.M.E", "p.S", "p.S.Do", ".p.M"] {
            assert_eq!(index.file_of_symbol(symbol), Some("a.proto"), "{symbol}");
        }
        assert_eq!(index.file_of_symbol("p.tag"), Some("b.proto"));
        assert_eq!(index.file_of_symbol("p.Nope"), None);
        assert_eq!(index.file_of_extension("p.M", 100), Some("b.proto"));
        assert_eq!(index.file_of_extension("p.M", 101), None);
        assert_eq!(index.extension_numbers(".p.M"), Some(vec![100]));
        assert_eq!(index.extension_numbers("p.Unknown"), None);
        assert_eq!(index.services().collect::<Vec<_>>(), ["p.S"]);
    }

    #[test]
    fn a_file_comes_with_what_it_imports_first_itself() {
        let index = index();
        let files = index.file_with_deps("b.proto").unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|encoded| {
                FileDescriptorProto::decode(encoded.clone())
                    .unwrap()
                    .name()
                    .to_owned()
            })
            .collect();
        assert_eq!(names, ["b.proto", "a.proto"]);
        assert!(index.file_with_deps("c.proto").is_none());
    }
}
