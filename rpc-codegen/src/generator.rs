//! The [`prost_build::ServiceGenerator`] that turns each protobuf service into a
//! `foo_client` and a `foo_server` module (see [`crate::client`] and [`crate::server`]).

use proc_macro2::{Ident, TokenStream};
use prost_build::{Comments, Method, Service};
use quote::{quote, ToTokens};

use crate::naming;

/// What the generator needs to know from the [`crate::Builder`].
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub build_client: bool,
    pub build_server: bool,
    /// Path of the runtime crate, e.g. `::rdma_rpc`.
    pub core_path: TokenStream,
    /// Protobuf paths (`.pkg.Msg` or `.pkg`) whose Rust paths prost-build takes verbatim.
    pub extern_prefixes: Vec<String>,
    /// Whether `google.protobuf` types are generated locally instead of taken from prost-types.
    pub compile_well_known_types: bool,
}

/// Generates the client and server modules of every service prost-build hands over.
#[derive(Debug)]
pub(crate) struct Generator {
    settings: Settings,
}

impl Generator {
    pub(crate) fn new(settings: Settings) -> Self {
        Generator { settings }
    }
}

impl prost_build::ServiceGenerator for Generator {
    fn generate(&mut self, service: Service, buf: &mut String) {
        let model = ServiceModel::new(&service, &self.settings);
        let mut tokens = TokenStream::new();
        if self.settings.build_client {
            tokens.extend(crate::client::generate(&model));
        }
        if self.settings.build_server {
            tokens.extend(crate::server::generate(&model));
        }
        // prost-build parses and formats the whole file (prettyplease) once it is complete.
        buf.push('\n');
        buf.push_str(&tokens.to_string());
        buf.push('\n');
    }
}

/// A service with every name and type the client and server generators need.
#[derive(Debug)]
pub(crate) struct ServiceModel {
    /// `pkg.Foo`.
    pub full_name: String,
    /// Path of the runtime crate.
    pub core: TokenStream,
    /// Doc lines from the .proto (leading and trailing comments).
    pub docs: Vec<String>,
    /// `Foo`: the server trait.
    pub trait_ident: Ident,
    /// `foo_client`.
    pub client_mod: Ident,
    /// `FooClient`.
    pub client_ident: Ident,
    /// `foo_server`.
    pub server_mod: Ident,
    /// `FooServer`.
    pub server_ident: Ident,
    pub methods: Vec<MethodModel>,
}

/// One method of a [`ServiceModel`].
#[derive(Debug)]
pub(crate) struct MethodModel {
    /// `/pkg.Foo/Bar`: the wire path the method id is derived from.
    pub path: String,
    /// `bar` (or `r#type`).
    pub fn_ident: Ident,
    /// `bar_blocking`.
    pub blocking_ident: Ident,
    /// `BAR`: the method descriptor constant.
    pub const_ident: Ident,
    /// Request type as seen from inside the generated modules.
    pub input: TokenStream,
    /// Response type as seen from inside the generated modules.
    pub output: TokenStream,
    /// Doc lines from the .proto.
    pub docs: Vec<String>,
    /// Unary, or which side streams.
    pub kind: MethodKind,
    /// `BarStream`: the server trait's associated type for the messages of a server- or
    /// bidirectional-streaming method (as tonic names it).
    pub stream_ident: Ident,
}

/// Which sides of a method stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MethodKind {
    /// One request, one response.
    Unary,
    /// One request, a stream of responses.
    ServerStreaming,
    /// A stream of requests, one response.
    ClientStreaming,
    /// Streams both ways.
    Bidi,
}

impl MethodKind {
    fn new(client_streaming: bool, server_streaming: bool) -> Self {
        match (client_streaming, server_streaming) {
            (false, false) => MethodKind::Unary,
            (false, true) => MethodKind::ServerStreaming,
            (true, false) => MethodKind::ClientStreaming,
            (true, true) => MethodKind::Bidi,
        }
    }

    /// The client sends a stream of requests.
    pub(crate) fn streams_requests(self) -> bool {
        matches!(self, MethodKind::ClientStreaming | MethodKind::Bidi)
    }

    /// The server answers with a stream of responses.
    pub(crate) fn streams_responses(self) -> bool {
        matches!(self, MethodKind::ServerStreaming | MethodKind::Bidi)
    }
}

impl ServiceModel {
    fn new(service: &Service, settings: &Settings) -> Self {
        let full_name = if service.package.is_empty() {
            service.proto_name.clone()
        } else {
            format!("{}.{}", service.package, service.proto_name)
        };
        let snake = naming::unraw(&naming::snake(&service.proto_name)).to_owned();
        let camel = naming::camel(&service.proto_name);
        let camel_base = naming::unraw(&camel).to_owned();
        let methods = service
            .methods
            .iter()
            .map(|method| MethodModel::new(&full_name, method, settings))
            .collect();
        ServiceModel {
            core: settings.core_path.clone(),
            docs: doc_lines(&service.comments),
            trait_ident: naming::ident(&camel),
            client_mod: naming::ident(&format!("{snake}_client")),
            client_ident: naming::ident(&format!("{camel_base}Client")),
            server_mod: naming::ident(&format!("{snake}_server")),
            server_ident: naming::ident(&format!("{camel_base}Server")),
            full_name,
            methods,
        }
    }
}

impl MethodModel {
    fn new(service: &str, method: &Method, settings: &Settings) -> Self {
        let fn_name = naming::snake(&method.proto_name);
        MethodModel {
            path: format!("/{service}/{}", method.proto_name),
            blocking_ident: naming::ident(&format!("{}_blocking", naming::unraw(&fn_name))),
            fn_ident: naming::ident(&fn_name),
            const_ident: naming::ident(&naming::shouty(&method.proto_name)),
            input: rust_type(&method.input_proto_type, &method.input_type, settings),
            output: rust_type(&method.output_proto_type, &method.output_type, settings),
            docs: doc_lines(&method.comments),
            kind: MethodKind::new(method.client_streaming, method.server_streaming),
            stream_ident: naming::ident(&format!(
                "{}Stream",
                naming::unraw(&naming::camel(&method.proto_name))
            )),
        }
    }
}

/// The Rust type of a request or response as seen from inside `foo_client`/`foo_server`.
///
/// prost-build resolves message types relative to the package module, so local and
/// sibling-package types get a `super::` prefix; absolute paths, extern paths, well-known
/// types taken from prost-types and `()` (for `google.protobuf.Empty`) are used verbatim.
fn rust_type(proto_type: &str, rust_type: &str, settings: &Settings) -> TokenStream {
    let is_extern = |prefix: &String| {
        proto_type
            .strip_prefix(prefix.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    };
    let verbatim = rust_type == "()"
        || rust_type.starts_with("::")
        || rust_type.starts_with("crate::")
        || (!settings.compile_well_known_types && proto_type.starts_with(".google.protobuf."))
        || settings.extern_prefixes.iter().any(is_extern);
    let path = if verbatim {
        rust_type.to_owned()
    } else {
        format!("super::{rust_type}")
    };
    match syn::parse_str::<syn::Type>(&path) {
        Ok(ty) => ty.into_token_stream(),
        Err(err) => {
            let message = format!("rpc-codegen: cannot use `{path}` as a Rust type: {err}");
            quote!(::core::compile_error!(#message))
        }
    }
}

/// The leading and trailing comments of an item as rustdoc lines, sanitized by prost-build
/// the same way it sanitizes message docs (URLs, brackets, indentation).
fn doc_lines(comments: &Comments) -> Vec<String> {
    let comments = Comments {
        leading_detached: Vec::new(),
        leading: comments.leading.clone(),
        trailing: comments.trailing.clone(),
    };
    let mut buf = String::new();
    comments.append_with_indent(0, &mut buf);
    buf.lines()
        .filter_map(|line| line.strip_prefix("///"))
        .map(str::to_owned)
        .collect()
}

/// `#[doc]` attributes: `summary` first, then the .proto docs as a separate paragraph.
pub(crate) fn doc_attrs(summary: &str, docs: &[String]) -> TokenStream {
    let summary = format!(" {summary}");
    let mut attrs = quote!(#[doc = #summary]);
    if !docs.is_empty() {
        attrs.extend(quote!(#[doc = ""]));
        attrs.extend(docs.iter().map(|line| quote!(#[doc = #line])));
    }
    attrs
}

/// `#[doc]` attributes: the .proto docs, or `fallback` when the .proto has none.
pub(crate) fn doc_attrs_or(fallback: &str, docs: &[String]) -> TokenStream {
    if docs.is_empty() {
        doc_attrs(fallback, &[])
    } else {
        docs.iter().map(|line| quote!(#[doc = #line])).collect()
    }
}
