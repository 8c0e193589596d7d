mod common;
use rpc_codegen::configure;
#[test]
fn show() {
    let cases: &[(&str, &str)] = &[
        ("bad.proto", "syntax = \"proto3\";\npackage bad;\nmessage Broken { string name = 1 }\n"),
        ("bad.proto", "syntax = \"proto3\";\npackage bad;\nmessage Broken { string name = 1; @ }\nmessage X { int32 9a = 1; }\n"),
        ("bad.proto", "syntax = \"proto3\";\npackage bad;\nmessage A { Missing m = 1; }\n"),
        ("bad.proto", "syntax = \"proto3\";\nimport \"nope.proto\";\npackage bad;\n"),
        ("bad.proto", "syntax = \"proto3\";\npackage chat;\nmessage M {}\nservice Chat {\n  rpc Say(M) returns (M);\n  rpc Talk(stream M) returns (stream M);\n  rpc Listen(M) returns (stream M);\n  rpc Upload(stream M) returns (M);\n}\n"),
        ("bad.proto", "syntax = \"proto3\";\npackage clash;\nmessage M {}\nservice Svc {\n  rpc GetFoo(M) returns (M);\n  rpc get_foo(M) returns (M);\n  rpc New(M) returns (M);\n  rpc ServiceName(M) returns (M);\n}\nservice svc {}\n"),
        ("bad.proto", "syntax = \"proto3\";\npackage x;\nmessage A { int32 a = 1; int32 b = 1; }\n"),
    ];
    for (name, src) in cases {
        let (_i, r) = common::generate_sources(configure(), &[(name, src)], &[name]);
        let e = r.err().unwrap();
        println!("---- {:?}\n{}", e.kind(), e);
    }
    let e = common::generate(configure(), &["missing.proto"]).err().unwrap();
    println!("---- {:?}\n{}", e.kind(), e);
    let e = common::generate(configure().core_path("not a path"), &["echo.proto"]).err().unwrap();
    println!("---- {:?}\n{}", e.kind(), e);
}
