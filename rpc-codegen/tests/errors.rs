//! Failures: every message names the file, line and column, and the build fails rather than
//! skipping anything.

mod common;

use std::io;

use common::{configure, generate, generate_sources};

/// Compiles one file `bad.proto` with `source`; returns the error kind and message, with the
/// temporary include directory stripped from the paths.
fn compile_error(source: &str) -> (io::ErrorKind, String) {
    let (include, result) = generate_sources(configure(), &[("bad.proto", source)], &["bad.proto"]);
    let err = result.err().expect("compilation should fail");
    // Positions point at the file under its include directory.
    let dir = format!("{}/", include.path().display());
    let message = err.to_string();
    assert!(message.starts_with(&dir), "{message}");
    (err.kind(), message.replace(&dir, ""))
}

#[test]
fn syntax_error_has_file_line_column_and_parser_message() {
    let (kind, message) =
        compile_error("syntax = \"proto3\";\npackage bad;\nmessage Broken { string name = 1 }\n");
    assert_eq!(kind, io::ErrorKind::InvalidInput);
    assert_eq!(
        message,
        "bad.proto:3:34: expected ';' or '[', but found '}'"
    );
}

#[test]
fn every_syntax_error_is_reported() {
    let (kind, message) = compile_error(
        "syntax = \"proto3\";\nmessage A { string a = 1; @ }\nmessage B { int32 9b = 1; }\n",
    );
    assert_eq!(kind, io::ErrorKind::InvalidInput);
    assert!(
        message.starts_with("bad.proto:2:27: invalid token\n"),
        "{message}"
    );
    assert!(message.contains("bad.proto:3:19: "), "{message}");
}

#[test]
fn undefined_type_is_located() {
    let (kind, message) =
        compile_error("syntax = \"proto3\";\npackage bad;\nmessage A { Missing m = 1; }\n");
    assert_eq!(kind, io::ErrorKind::InvalidInput);
    assert_eq!(message, "bad.proto:3:13: name 'Missing' is not defined");
}

#[test]
fn secondary_positions_are_listed() {
    let (kind, message) = compile_error(
        "syntax = \"proto3\";\npackage bad;\nmessage A { int32 a = 1; int32 b = 1; }\n",
    );
    assert_eq!(kind, io::ErrorKind::InvalidInput);
    assert_eq!(
        message,
        "bad.proto:3:23: field number '1' is already used \
         (first defined here; defined again here at 3:36)"
    );
}

#[test]
fn missing_import_is_located() {
    let (kind, message) =
        compile_error("syntax = \"proto3\";\nimport \"nope.proto\";\npackage bad;\n");
    assert_eq!(kind, io::ErrorKind::NotFound);
    assert_eq!(message, "bad.proto:2:1: import 'nope.proto' not found");
}

#[test]
fn missing_input_file_is_named() {
    let err = generate(configure(), &["missing.proto"]).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(
        err.to_string()
            .ends_with("tests/protos/missing.proto: no such file"),
        "{err}"
    );
}

#[test]
fn streaming_methods_generate_tonic_shapes() {
    let (_include, result) = generate_sources(
        configure(),
        &[(
            "s.proto",
            "syntax = \"proto3\";
package s;
message M {}
service S {
  rpc Chat(stream M) returns (stream M);
  rpc Listen(M) returns (stream M);
  rpc Upload(stream M) returns (M);
}
",
        )],
        &["s.proto"],
    );
    let out = result.unwrap();
    let code = out.package("s").replace(char::is_whitespace, "");
    for expected in [
        // Server: an associated stream type per method whose responses stream.
        "typeChatStream:::rpc_core::__codegen::Stream<Item=::core::result::Result<super::M,::rpc_core::Status>,>+::core::marker::Send+'static;",
        "typeListenStream:",
        "fnchat(&self,request:::rpc_core::Request<::rpc_core::Streaming<super::M>>,",
        "::rpc_core::Response<Self::ChatStream>",
        "fnupload(&self,request:::rpc_core::Request<::rpc_core::Streaming<super::M>>,",
        "::rpc_core::server::streaming(call,|request|inner.chat(request),)",
        // Client: streams in, streams out, blocking iterators.
        "pubfnchat<R:::rpc_core::IntoStreamingRequest<Message=super::M>>",
        // Async streaming calls over any stream service; blocking ones over a channel.
        "impl<S:::rpc_core::StreamService>SClient<S>",
        "::rpc_core::client::stream_service::server_streaming(&self.service,&METHOD,",
        "::rpc_core::client::stream_service::streaming(&self.service,&METHOD,",
        "self.service.server_streaming_blocking(&METHOD,",
        "pubfnlisten_blocking(",
        "::rpc_core::stream::BlockingStreaming<super::M>",
        "pubfnupload_blocking<I:::core::iter::IntoIterator<Item=super::M>>",
    ] {
        assert!(code.contains(expected), "missing {expected}");
    }
    assert!(
        !code.contains("chat_blocking"),
        "bidirectional calls have no blocking form"
    );
    assert!(
        !code.contains("typeUploadStream"),
        "client streaming answers once"
    );
}

#[test]
fn names_that_clash_in_rust_are_rejected() {
    let (kind, message) = compile_error(
        "syntax = \"proto3\";
package clash;
message M {}
service Svc {
  rpc GetFoo(M) returns (M);
  rpc get_foo(M) returns (M);
  rpc New(M) returns (M);
  rpc ServiceName(M) returns (M);
}
service svc {}
",
    );
    assert_eq!(kind, io::ErrorKind::InvalidInput);
    assert_eq!(
        message,
        "bad.proto:6:3: method clash.Svc/get_foo clashes with method clash.Svc/GetFoo: both generate \
         `SvcClient::get_foo`, `SvcClient::get_foo_blocking`, `Svc::get_foo`, `svc_server::GET_FOO`
bad.proto:7:3: method clash.Svc/New clashes with the generated constructor: both generate `SvcClient::new`
bad.proto:8:3: method clash.Svc/ServiceName clashes with the generated service name constant: \
         both generate `svc_server::SERVICE_NAME`
bad.proto:10:1: services clash.Svc and clash.svc both generate module `svc_client`
bad.proto:10:1: services clash.Svc and clash.svc both generate module `svc_server`"
    );
}

#[test]
fn clashes_only_count_for_generated_halves() {
    // `New` only clashes with the client's constructor.
    let (_include, result) = generate_sources(
        configure().build_client(false),
        &[(
            "n.proto",
            "syntax = \"proto3\";\nmessage M {}\nservice S { rpc New(M) returns (M); }\n",
        )],
        &["n.proto"],
    );
    let out = result.unwrap();
    assert!(out.package("_").contains("fn new(\n"));
}

#[test]
fn invalid_core_path_is_rejected() {
    let err = generate(configure().core_path("not a path"), &["echo.proto"])
        .err()
        .unwrap();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(
        err.to_string()
            .starts_with("invalid core_path `not a path`"),
        "{err}"
    );
}

#[test]
fn out_dir_is_required_outside_build_scripts() {
    if std::env::var_os("OUT_DIR").is_some() {
        return; // Only meaningful when cargo did not set it.
    }
    let protos = common::protos_dir();
    let err = configure()
        .emit_rerun_if_changed(false)
        .compile_protos(&[protos.join("echo.proto")], &[&protos])
        .err()
        .unwrap();
    assert!(err.to_string().contains("OUT_DIR is not set"), "{err}");
}
