//! Parsing .proto files with protox (no `protoc`): user include directories, then the
//! vendored `google/api` files, then the well-known types protox ships.

use std::collections::HashSet;
use std::io;
use std::path::PathBuf;

use prost_types::FileDescriptorSet;
use protox::file::{
    ChainFileResolver, File, FileResolver, GoogleFileResolver, IncludeFileResolver,
};

use crate::error;

/// Files vendored into the crate (from `proto-include/`) so users need no googleapis checkout.
const VENDORED: &[(&str, &str)] = &[
    (
        "google/api/annotations.proto",
        include_str!("../proto-include/google/api/annotations.proto"),
    ),
    (
        "google/api/http.proto",
        include_str!("../proto-include/google/api/http.proto"),
    ),
];

/// The parsed files: everything prost-build needs, plus which were asked for.
#[derive(Debug)]
pub(crate) struct Loaded {
    /// Every file, imports included, dependencies first, with source info (comments).
    pub fds: FileDescriptorSet,
    /// The same set encoded by protox, which keeps custom options such as `google.api.http`.
    pub encoded: Vec<u8>,
    /// Names (include-relative) of the files passed in, as opposed to their imports.
    pub requested: HashSet<String>,
}

/// Parses `protos` and everything they import.
pub(crate) fn load(protos: &[PathBuf], includes: &[PathBuf]) -> io::Result<Loaded> {
    // protox reports a missing input as "not in any include path"; say what is wrong.
    for proto in protos {
        let exists = proto.is_file() || includes.iter().any(|inc| inc.join(proto).is_file());
        if !exists {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no such file", proto.display()),
            ));
        }
    }

    let mut resolver = ChainFileResolver::new();
    for include in includes {
        resolver.add(IncludeFileResolver::new(include.clone()));
    }
    resolver.add(VendoredFileResolver);
    resolver.add(GoogleFileResolver::new());

    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true).include_source_info(true);
    compiler
        .open_files(protos)
        .map_err(|err| error::from_protox(&err, includes))?;
    let requested = compiler
        .files()
        .filter(|file| !file.is_import())
        .map(|file| file.name().to_owned())
        .collect();
    Ok(Loaded {
        fds: compiler.file_descriptor_set(),
        encoded: compiler.encode_file_descriptor_set(),
        requested,
    })
}

/// Resolves the [`VENDORED`] files.
#[derive(Debug)]
struct VendoredFileResolver;

impl FileResolver for VendoredFileResolver {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match VENDORED.iter().find(|(path, _)| *path == name) {
            Some((_, source)) => File::from_source(name, source),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}
