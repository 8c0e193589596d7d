//! What the generator writes: files per package, item shapes, type paths, docs and options.

mod common;

use common::{configure, generate, parse};
use syn::{ImplItem, Item, ItemMod, TraitItem};

/// The top-level module `name` of a generated file.
fn module<'a>(file: &'a syn::File, name: &str) -> Option<&'a ItemMod> {
    file.items.iter().find_map(|item| match item {
        Item::Mod(m) if m.ident == name => Some(m),
        _ => None,
    })
}

fn items(module: &ItemMod) -> &[Item] {
    &module.content.as_ref().expect("inline module").1
}

/// Names of the functions in the inherent impl of a module.
fn impl_fns(module: &ItemMod) -> Vec<String> {
    items(module)
        .iter()
        .filter_map(|item| match item {
            Item::Impl(imp) if imp.trait_.is_none() => Some(imp),
            _ => None,
        })
        .flat_map(|imp| &imp.items)
        .filter_map(|item| match item {
            ImplItem::Fn(f) => Some(f.sig.ident.to_string()),
            _ => None,
        })
        .collect()
}

fn consts(module: &ItemMod) -> Vec<String> {
    items(module)
        .iter()
        .filter_map(|item| match item {
            Item::Const(c) => Some(c.ident.to_string()),
            _ => None,
        })
        .collect()
}

fn trait_fns(module: &ItemMod, name: &str) -> Vec<String> {
    items(module)
        .iter()
        .find_map(|item| match item {
            Item::Trait(t) if t.ident == name => Some(t),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no trait {name}"))
        .items
        .iter()
        .filter_map(|item| match item {
            TraitItem::Fn(f) => Some(f.sig.ident.to_string()),
            _ => None,
        })
        .collect()
}

fn has_struct(module: &ItemMod, name: &str) -> bool {
    items(module)
        .iter()
        .any(|item| matches!(item, Item::Struct(s) if s.ident == name))
}

#[test]
fn echo_has_the_client_and_server_shape() {
    let out = generate(configure(), &["echo.proto"]).unwrap();
    let file = parse(&out.package("echo"));

    let client = module(&file, "echo_client").expect("echo_client");
    assert!(has_struct(client, "EchoClient"));
    assert_eq!(
        impl_fns(client),
        [
            "new",
            "get_ref",
            "into_inner",
            "with_interceptor",
            "channel",
            "echo",
            "echo_blocking",
            "now",
            "now_blocking",
            "ping",
            "ping_blocking",
            "r#type",
            "type_blocking"
        ]
    );

    let server = module(&file, "echo_server").expect("echo_server");
    assert_eq!(
        consts(server),
        ["ECHO", "NOW", "PING", "TYPE", "SERVICE_NAME"]
    );
    assert_eq!(trait_fns(server, "Echo"), ["echo", "now", "ping", "r#type"]);
    assert!(has_struct(server, "EchoServer"));
    assert_eq!(impl_fns(server), ["new", "from_arc", "with_interceptor"]);
}

#[test]
fn one_file_per_package_with_imports_and_nested_packages() {
    let out = generate(configure(), &["shop/orders/v1/orders.proto"]).unwrap();
    // Imported packages get their messages; well-known types come from prost-types.
    assert_eq!(out.files(), ["shop.common.rs", "shop.orders.v1.rs"]);

    let orders = out.package("shop.orders.v1");
    let file = parse(&orders);
    assert!(module(&file, "orders_client").is_some());
    assert!(module(&file, "orders_server").is_some());
    // Cross-package and nested-message types resolve from inside the generated modules.
    assert!(orders.contains("::rpc_core::Response<super::super::super::common::Money>"));
    assert!(orders.contains("::rpc_core::Response<super::order::Line>"));
    assert!(orders.contains("::rpc_core::IntoRequest<super::Order>"));
    assert!(orders.contains("\"/shop.orders.v1.Orders/LastLine\""));
    assert!(orders.contains("pub const SERVICE_NAME: &str = \"shop.orders.v1.Orders\";"));
    // A service without methods still gets its modules.
    let nothing = module(&file, "nothing_server").expect("nothing_server");
    assert_eq!(trait_fns(nothing, "Nothing"), Vec::<String>::new());

    // The service of the imported file is not generated.
    let common = out.package("shop.common");
    parse(&common);
    assert!(common.contains("pub struct Money"));
    assert!(!common.contains("exchange_client") && !common.contains("exchange_server"));
}

#[test]
fn well_known_types_map_to_prost_types() {
    let out = generate(configure(), &["echo.proto"]).unwrap();
    let echo = out.package("echo");
    assert!(echo.contains("::rpc_core::Response<::prost_types::Timestamp>"));
    // google.protobuf.Empty is `()`, which implements prost::Message.
    assert!(echo.contains("::rpc_core::IntoRequest<()>"));
    assert!(echo.contains("::rpc_core::Response<()>"));
    assert!(!out.files().contains(&"google.protobuf.rs".to_owned()));
}

#[test]
fn well_known_types_can_be_compiled_locally() {
    let out = generate(configure().compile_well_known_types(true), &["echo.proto"]).unwrap();
    assert!(out.files().contains(&"google.protobuf.rs".to_owned()));
    let echo = out.package("echo");
    assert!(echo.contains("Response<super::super::google::protobuf::Timestamp>"));
    assert!(echo.contains("IntoRequest<super::super::google::protobuf::Empty>"));
}

#[test]
fn google_api_http_annotations_resolve_from_vendored_files() {
    let fds_dir = tempfile::tempdir().unwrap();
    let fds_path = fds_dir.path().join("echo.fds");
    let out = generate(
        configure().file_descriptor_set_path(&fds_path),
        &["echo.proto"],
    )
    .unwrap();
    assert!(out.files().contains(&"google.api.rs".to_owned()));
    // The option is parsed and kept in the encoded descriptor set.
    let fds = std::fs::read(&fds_path).unwrap();
    let contains = |needle: &[u8]| fds.windows(needle.len()).any(|w| w == needle);
    assert!(contains(b"google/api/annotations.proto"));
    assert!(contains(b"/v1/echo"));
    assert!(contains(b"/v1/now"));
}

#[test]
fn doc_comments_carry_over() {
    let out = generate(configure(), &["echo.proto"]).unwrap();
    let echo = out.package("echo");
    // Service docs on the client module and the server trait, after the generated summary.
    assert!(
        echo.contains("/// Generated client for `echo.Echo`.\n///\n/// Echoes what it is sent.\n")
    );
    assert!(echo.contains("    ///\n    /// Echoes what it is sent.\n    ///\n    /// See [the docs](<https://example.invalid/echo>) for details.\n    pub trait Echo"));
    // Method docs on the client method and the trait method; a fallback where there are none.
    assert_eq!(
        echo.matches("/// Returns the request's message unchanged.")
            .count(),
        2
    );
    assert!(echo.contains("/// Calls `/echo.Echo/Ping`."));
    assert!(echo.contains("/// Handles `/echo.Echo/Ping`."));
    // Message and field docs through prost.
    assert!(echo.contains("/// What to echo.\n"));
    assert!(echo.contains("/// The text to send back.\n"));
}

#[test]
fn client_only_and_server_only() {
    let client_only = generate(configure().build_server(false), &["echo.proto"]).unwrap();
    let file = parse(&client_only.package("echo"));
    assert!(module(&file, "echo_client").is_some());
    assert!(module(&file, "echo_server").is_none());

    let server_only = generate(configure().build_client(false), &["echo.proto"]).unwrap();
    let file = parse(&server_only.package("echo"));
    assert!(module(&file, "echo_client").is_none());
    assert!(module(&file, "echo_server").is_some());

    let neither = generate(
        configure().build_client(false).build_server(false),
        &["echo.proto"],
    )
    .unwrap();
    let echo = neither.package("echo");
    assert!(echo.contains("pub struct EchoRequest"));
    assert!(!echo.contains("echo_client") && !echo.contains("echo_server"));
}

#[test]
fn messages_only_generates_no_service() {
    let out = generate(
        configure().build_client(false).build_server(false),
        &["shop/common/money.proto"],
    )
    .unwrap();
    assert!(out.package("shop.common").contains("pub struct Money"));
}

#[test]
fn generated_code_names_the_facade_unless_told_otherwise() {
    // An application depends on `rdma-rpc` alone: the default path is the facade's.
    let out = generate(rpc_codegen::configure(), &["echo.proto"]).unwrap();
    let echo = out.package("echo");
    parse(&echo);
    assert!(echo.contains("channel: ::rdma_rpc::Channel"));
    assert!(echo.contains("impl<T: Echo> ::rdma_rpc::server::Service for EchoServer<T>"));
    assert!(!echo.contains("rpc_core"));

    let out = generate(configure().core_path("::my_rt::core"), &["echo.proto"]).unwrap();
    let echo = out.package("echo");
    parse(&echo);
    assert!(echo.contains("channel: ::my_rt::core::Channel"));
    assert!(!echo.contains("rdma_rpc") && !echo.contains("rpc_core"));
}

#[test]
fn prost_settings_pass_through() {
    let out = generate(
        configure()
            .bytes([".echo.EchoRequest.payload"])
            .type_attribute(".echo.EchoReply", "#[non_exhaustive]")
            .field_attribute(".echo.EchoRequest.message", "#[doc(alias = \"text\")]"),
        &["echo.proto"],
    )
    .unwrap();
    let echo = out.package("echo");
    assert!(echo.contains("pub payload: ::prost::bytes::Bytes"));
    let attribute = echo.find("#[non_exhaustive]").expect("type attribute");
    assert!(attribute > echo.find("pub struct EchoRequest").unwrap());
    assert!(attribute < echo.find("pub struct EchoReply").unwrap());
    assert!(echo.contains("#[doc(alias = \"text\")]"));
}

#[test]
fn extern_paths_are_used_verbatim() {
    let out = generate(
        configure().extern_path(".shop.common", "shop_common_types"),
        &["shop/orders/v1/orders.proto"],
    )
    .unwrap();
    assert_eq!(out.files(), ["shop.orders.v1.rs"]);
    let orders = out.package("shop.orders.v1");
    assert!(orders.contains("::rpc_core::Response<shop_common_types::Money>"));
}

#[test]
fn files_without_a_package_go_to_underscore_rs() {
    let (_include, out) = common::generate_sources(
        configure(),
        &[(
            "plain.proto",
            "syntax = \"proto3\";\nmessage Ping {}\nservice Pinger { rpc Ping(Ping) returns (Ping); }\n",
        )],
        &["plain.proto"],
    );
    let out = out.unwrap();
    assert_eq!(out.files(), ["_.rs"]);
    let code = out.package("_");
    parse(&code);
    assert!(code.contains("::rpc_core::Method::new(\"/Pinger/Ping\")"));
    assert!(code.contains("pub const SERVICE_NAME: &str = \"Pinger\";"));
}

#[test]
fn include_file_lists_every_package() {
    let out = generate(
        configure().include_file("_includes.rs"),
        &["shop/orders/v1/orders.proto"],
    )
    .unwrap();
    let includes = out.package("_includes");
    parse(&includes);
    for package in ["shop.common.rs", "shop.orders.v1.rs"] {
        assert!(includes.contains(package), "{includes}");
    }
}
