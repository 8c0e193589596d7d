//! [`Builder`]: what to generate and where, plus the prost-build settings passed through.

use std::io;
use std::path::{Path, PathBuf};

use quote::ToTokens;

use crate::error::invalid_input;
use crate::generator::{Generator, Settings};
use crate::load;
use crate::validate::{self, Halves};

/// Configures and runs code generation; created by [`crate::configure`].
///
/// Settings not listed here keep prost-build's defaults. Methods that take protobuf paths
/// (`type_attribute`, `bytes`, ...) use prost-build's path syntax: `.` for everything,
/// `.pkg` for a package, `.pkg.Msg` for a message, `.pkg.Msg.field` for a field.
#[derive(Debug, Clone)]
#[must_use = "a Builder does nothing until `compile_protos` is called"]
pub struct Builder {
    out_dir: Option<PathBuf>,
    build_client: bool,
    build_server: bool,
    core_path: String,
    emit_rerun_if_changed: Option<bool>,
    compile_well_known_types: bool,
    file_descriptor_set_path: Option<PathBuf>,
    include_file: Option<PathBuf>,
    extern_paths: Vec<(String, String)>,
    type_attributes: Vec<(String, String)>,
    message_attributes: Vec<(String, String)>,
    enum_attributes: Vec<(String, String)>,
    field_attributes: Vec<(String, String)>,
    bytes: Vec<String>,
    btree_map: Vec<String>,
    boxed: Vec<String>,
    disable_comments: Vec<String>,
    skip_debug: Vec<String>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            out_dir: None,
            build_client: true,
            build_server: true,
            core_path: "::rdma_rpc".to_owned(),
            emit_rerun_if_changed: None,
            compile_well_known_types: false,
            file_descriptor_set_path: None,
            include_file: None,
            extern_paths: Vec::new(),
            type_attributes: Vec::new(),
            message_attributes: Vec::new(),
            enum_attributes: Vec::new(),
            field_attributes: Vec::new(),
            bytes: Vec::new(),
            btree_map: Vec::new(),
            boxed: Vec::new(),
            disable_comments: Vec::new(),
            skip_debug: Vec::new(),
        }
    }
}

impl Builder {
    /// Where the `<package>.rs` files go (default: the `OUT_DIR` of the build script).
    pub fn out_dir(mut self, out_dir: impl AsRef<Path>) -> Self {
        self.out_dir = Some(out_dir.as_ref().to_owned());
        self
    }

    /// Whether to generate `foo_client` modules (default true).
    pub fn build_client(mut self, enable: bool) -> Self {
        self.build_client = enable;
        self
    }

    /// Whether to generate `foo_server` modules (default true).
    pub fn build_server(mut self, enable: bool) -> Self {
        self.build_server = enable;
        self
    }

    /// The path generated code uses to reach the runtime (default `::rdma_rpc`, the crate
    /// applications depend on); `::rpc_core` for a crate below the facade (the health
    /// service).
    pub fn core_path(mut self, path: impl Into<String>) -> Self {
        self.core_path = path.into();
        self
    }

    /// Whether to print `cargo:rerun-if-changed` for every input file and include directory
    /// (default: only when running in a build script, i.e. when `OUT_DIR` is set).
    pub fn emit_rerun_if_changed(mut self, enable: bool) -> Self {
        self.emit_rerun_if_changed = Some(enable);
        self
    }

    /// Generates `google.protobuf` types instead of using prost-types
    /// (see [`prost_build::Config::compile_well_known_types`]).
    pub fn compile_well_known_types(mut self, enable: bool) -> Self {
        self.compile_well_known_types = enable;
        self
    }

    /// Also writes the encoded `FileDescriptorSet` (imports and custom options included) to
    /// `path`, for reflection.
    pub fn file_descriptor_set_path(mut self, path: impl AsRef<Path>) -> Self {
        self.file_descriptor_set_path = Some(path.as_ref().to_owned());
        self
    }

    /// Also writes a file that includes every generated package as nested modules
    /// (see [`prost_build::Config::include_file`]); relative to the output directory.
    pub fn include_file(mut self, path: impl AsRef<Path>) -> Self {
        self.include_file = Some(path.as_ref().to_owned());
        self
    }

    /// Uses an existing Rust type for a protobuf path instead of generating one
    /// (see [`prost_build::Config::extern_path`]).
    pub fn extern_path(
        mut self,
        proto_path: impl Into<String>,
        rust_path: impl Into<String>,
    ) -> Self {
        self.extern_paths
            .push((proto_path.into(), rust_path.into()));
        self
    }

    /// Adds an attribute to matching messages and enums
    /// (see [`prost_build::Config::type_attribute`]).
    pub fn type_attribute(mut self, path: impl Into<String>, attribute: impl Into<String>) -> Self {
        self.type_attributes.push((path.into(), attribute.into()));
        self
    }

    /// Adds an attribute to matching messages (see [`prost_build::Config::message_attribute`]).
    pub fn message_attribute(
        mut self,
        path: impl Into<String>,
        attribute: impl Into<String>,
    ) -> Self {
        self.message_attributes
            .push((path.into(), attribute.into()));
        self
    }

    /// Adds an attribute to matching enums (see [`prost_build::Config::enum_attribute`]).
    pub fn enum_attribute(mut self, path: impl Into<String>, attribute: impl Into<String>) -> Self {
        self.enum_attributes.push((path.into(), attribute.into()));
        self
    }

    /// Adds an attribute to matching fields (see [`prost_build::Config::field_attribute`]).
    pub fn field_attribute(
        mut self,
        path: impl Into<String>,
        attribute: impl Into<String>,
    ) -> Self {
        self.field_attributes.push((path.into(), attribute.into()));
        self
    }

    /// Represents matching `bytes` fields as [`bytes::Bytes`](https://docs.rs/bytes) instead of
    /// `Vec<u8>`, so large payloads decode without a copy (see [`prost_build::Config::bytes`]).
    pub fn bytes<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.bytes
            .extend(paths.into_iter().map(|p| p.as_ref().to_owned()));
        self
    }

    /// Represents matching map fields as `BTreeMap` (see [`prost_build::Config::btree_map`]).
    pub fn btree_map<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.btree_map
            .extend(paths.into_iter().map(|p| p.as_ref().to_owned()));
        self
    }

    /// Boxes matching message fields (see [`prost_build::Config::boxed`]).
    pub fn boxed(mut self, path: impl Into<String>) -> Self {
        self.boxed.push(path.into());
        self
    }

    /// Drops .proto comments of matching messages and fields
    /// (see [`prost_build::Config::disable_comments`]).
    pub fn disable_comments<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.disable_comments
            .extend(paths.into_iter().map(|p| p.as_ref().to_owned()));
        self
    }

    /// Skips `#[derive(Debug)]` on matching types (see [`prost_build::Config::skip_debug`]).
    pub fn skip_debug<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.skip_debug
            .extend(paths.into_iter().map(|p| p.as_ref().to_owned()));
        self
    }

    /// Parses `protos` (paths of files under one of `includes`, or include-relative names)
    /// and writes one `<package>.rs` per protobuf package.
    ///
    /// Services are generated for the files in `protos`; files they import contribute their
    /// messages only. `google/protobuf/*` and `google/api/{annotations,http}.proto` resolve
    /// without being in `includes`.
    ///
    /// # Errors
    ///
    /// Any parse or type error (as `file:line:column: message` lines), two protobuf names that map onto the same Rust item, an invalid
    /// [`core_path`](Builder::core_path), no `OUT_DIR` and no [`out_dir`](Builder::out_dir),
    /// or failing to write the output.
    pub fn compile_protos(
        self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> io::Result<()> {
        let protos: Vec<PathBuf> = protos.iter().map(|p| p.as_ref().to_owned()).collect();
        let includes: Vec<PathBuf> = includes.iter().map(|p| p.as_ref().to_owned()).collect();
        let out_dir = match &self.out_dir {
            Some(dir) => dir.clone(),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| {
                    invalid_input(
                        "OUT_DIR is not set: call `out_dir` when not running in a build script",
                    )
                })?,
        };
        let core_path = syn::parse_str::<syn::Path>(&self.core_path)
            .map_err(|err| invalid_input(format!("invalid core_path `{}`: {err}", self.core_path)))?
            .into_token_stream();
        let emit_rerun = self
            .emit_rerun_if_changed
            .unwrap_or_else(|| std::env::var_os("OUT_DIR").is_some());
        if emit_rerun {
            for path in protos.iter().chain(&includes) {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }

        let mut loaded = load::load(&protos, &includes)?;
        // Imported files contribute messages only: their services are neither checked nor
        // generated unless the file is passed in `protos` too.
        for file in &mut loaded.fds.file {
            if !loaded.requested.contains(file.name()) {
                file.service.clear();
            }
        }
        let halves = Halves {
            client: self.build_client,
            server: self.build_server,
        };
        validate::check_services(&loaded.fds, &includes, halves)?;

        if let Some(path) = &self.file_descriptor_set_path {
            std::fs::write(path, &loaded.encoded)?;
        }
        std::fs::create_dir_all(&out_dir)?;
        let settings = Settings {
            build_client: self.build_client,
            build_server: self.build_server,
            core_path,
            extern_prefixes: self
                .extern_paths
                .iter()
                .map(|(proto, _)| proto.clone())
                .collect(),
            compile_well_known_types: self.compile_well_known_types,
        };
        self.prost_config(settings).compile_fds(loaded.fds)
    }

    fn prost_config(self, settings: Settings) -> prost_build::Config {
        let mut config = prost_build::Config::new();
        config.service_generator(Box::new(Generator::new(settings)));
        // Without an explicit directory prost-build uses `OUT_DIR` itself, which also makes
        // its `include_file` refer to `env!("OUT_DIR")` rather than an absolute path.
        if let Some(out_dir) = self.out_dir {
            config.out_dir(out_dir);
        }
        if self.compile_well_known_types {
            config.compile_well_known_types();
        }
        if let Some(path) = self.include_file {
            config.include_file(path);
        }
        for (proto, rust) in self.extern_paths {
            config.extern_path(proto, rust);
        }
        for (path, attribute) in self.type_attributes {
            config.type_attribute(path, attribute);
        }
        for (path, attribute) in self.message_attributes {
            config.message_attribute(path, attribute);
        }
        for (path, attribute) in self.enum_attributes {
            config.enum_attribute(path, attribute);
        }
        for (path, attribute) in self.field_attributes {
            config.field_attribute(path, attribute);
        }
        for path in self.boxed {
            config.boxed(path);
        }
        config
            .bytes(self.bytes)
            .btree_map(self.btree_map)
            .disable_comments(self.disable_comments)
            .skip_debug(self.skip_debug);
        config
    }
}
