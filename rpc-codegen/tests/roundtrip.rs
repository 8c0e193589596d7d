//! Compiles the generated code for `tests/protos/echo.proto` (checked in as
//! `tests/generated/echo.rs`, kept current by `tests/golden.rs`) against rpc-core under strict
//! lints, and calls every method through the generated client and server over an in-memory
//! transport.

#![deny(warnings, missing_docs, clippy::all)]

/// The generated `echo` package.
pub mod echo {
    include!("generated/echo.rs");
}

use std::sync::Arc;

use bytes::Bytes;
use echo::echo_client::EchoClient;
use echo::echo_server::{self, EchoServer};
use echo::{EchoReply, EchoRequest};
use rpc_core::body::RawBody;
use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::server::{ServerCall, ServerReply, Service};
use rpc_core::{
    CallTable, Channel, ChannelConfig, ClientTransport, Code, FrameKind, FrameSender, Header,
    MetadataMap, Request, Response, Status,
};

/// The service under test.
struct EchoImpl;

impl echo_server::Echo for EchoImpl {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let tenant = request.metadata().get("x-tenant").map(<[u8]>::to_vec);
        let EchoRequest { message, payload } = request.into_inner();
        let mut response = Response::new(EchoReply {
            message,
            payload,
            at: None,
        });
        if let Some(tenant) = tenant {
            response.metadata_mut().insert("x-tenant", tenant).unwrap();
        }
        Ok(response)
    }

    async fn now(&self, _request: Request<()>) -> Result<Response<prost_types::Timestamp>, Status> {
        Ok(Response::new(prost_types::Timestamp {
            seconds: 42,
            nanos: 7,
        }))
    }

    async fn ping(&self, _request: Request<()>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }

    async fn r#type(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        Err(Status::invalid_argument(format!(
            "no types here: {}",
            request.get_ref().message
        )))
    }
}

/// A client transport that hands each request frame to a service on another thread and
/// completes the call with the encoded reply, through the same frame encoding real
/// transports use.
struct Loopback {
    calls: Arc<CallTable>,
    service: Arc<dyn Service>,
}

impl FrameSender for Loopback {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let header = *frame.header();
        if header.kind != FrameKind::Request {
            return Ok(());
        }
        let bytes = encode(frame);
        let header_len = header.encoded_len();
        let metadata_end = header_len + header.metadata_len as usize;
        let call = ServerCall::new(
            MetadataMap::decode_from(&bytes[header_len..metadata_end])
                .map_err(|e| Status::internal(e.to_string()))?,
            bytes.slice(metadata_end..),
            None,
        );
        let reply = self.service.call(header.method_id, call);
        let calls = Arc::clone(&self.calls);
        std::thread::spawn(move || {
            let response = respond(header.call_id, futures::executor::block_on(reply));
            calls.complete(header.call_id, Ok(response));
        });
        Ok(())
    }
}

impl ClientTransport for Loopback {
    fn peer(&self) -> &str {
        "loopback"
    }

    fn close(&self) {
        self.calls.close(Status::unavailable("loopback closed"));
    }
}

fn encode(frame: &OutgoingFrame<'_>) -> Bytes {
    let mut buf = vec![0; frame.len()];
    frame.write_to(&mut buf);
    Bytes::from(buf)
}

/// The response frame a server sends for `result`, as the client receives it.
fn respond(call_id: u64, result: Result<ServerReply, Status>) -> InboundFrame {
    let mut header = Header::new(FrameKind::Response, call_id);
    let bytes = match &result {
        Ok(reply) => encode(&OutgoingFrame::new(header, &reply.metadata, reply.body()).unwrap()),
        Err(status) => {
            header.status = status.code();
            let message = RawBody(status.message().as_bytes());
            encode(&OutgoingFrame::new(header, &MetadataMap::new(), &message).unwrap())
        }
    };
    let header_len = Header::wire_len(&bytes).unwrap();
    let header = Header::decode(&bytes[..header_len]).unwrap();
    let metadata_end = header_len + header.metadata_len as usize;
    InboundFrame {
        header,
        metadata: bytes.slice(header_len..metadata_end),
        payload: bytes.slice(metadata_end..),
    }
}

fn client() -> EchoClient {
    let calls = Arc::new(CallTable::new());
    let transport = Loopback {
        calls: Arc::clone(&calls),
        service: Arc::new(EchoServer::new(EchoImpl)),
    };
    EchoClient::new(Channel::new(
        calls,
        Arc::new(transport),
        ChannelConfig::default(),
    ))
}

fn request(message: &str) -> EchoRequest {
    EchoRequest {
        message: message.to_owned(),
        payload: vec![1, 2, 3],
    }
}

#[test]
fn blocking_call_round_trips_message_and_metadata() {
    let mut req = Request::new(request("hello"));
    req.metadata_mut().insert("x-tenant", "blue").unwrap();
    let response = client().echo_blocking(req).unwrap();
    assert_eq!(response.metadata().get("x-tenant"), Some(&b"blue"[..]));
    let reply = response.into_inner();
    assert_eq!(reply.message, "hello");
    assert_eq!(reply.payload, vec![1, 2, 3]);
}

#[test]
fn async_call_is_send_and_static() {
    fn spawnable<F: std::future::Future + Send + 'static>(future: F) -> F {
        future
    }
    let future = spawnable(client().echo(request("async")));
    let reply = futures::executor::block_on(future).unwrap().into_inner();
    assert_eq!(reply.message, "async");
}

#[test]
fn well_known_types_empty_and_timestamp() {
    let client = client();
    let now = client.now_blocking(()).unwrap().into_inner();
    assert_eq!((now.seconds, now.nanos), (42, 7));
    let pong: () = futures::executor::block_on(client.ping(()))
        .unwrap()
        .into_inner();
    assert_eq!(pong, ());
}

#[test]
fn handler_status_reaches_the_caller() {
    let status = client().type_blocking(request("t")).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "no types here: t");
    let status = futures::executor::block_on(client().r#type(request("u"))).unwrap_err();
    assert_eq!(status.message(), "no types here: u");
}

#[test]
fn server_describes_its_methods() {
    let server = EchoServer::new(EchoImpl);
    assert_eq!(server.name(), "echo.Echo");
    assert_eq!(echo_server::SERVICE_NAME, "echo.Echo");
    let paths: Vec<_> = server.methods().iter().map(|m| m.path).collect();
    assert_eq!(
        paths,
        [
            "/echo.Echo/Echo",
            "/echo.Echo/Now",
            "/echo.Echo/Ping",
            "/echo.Echo/Type"
        ]
    );
    for method in server.methods() {
        assert_eq!(method.id, rpc_core::method_id(method.path));
    }
    assert_eq!(echo_server::ECHO.path, "/echo.Echo/Echo");
    assert_eq!(echo_server::TYPE.id, rpc_core::method_id("/echo.Echo/Type"));
}

#[test]
fn server_rejects_unknown_method_ids() {
    let server = EchoServer::from_arc(Arc::new(EchoImpl)).clone();
    let call = ServerCall::new(MetadataMap::new(), Bytes::new(), None);
    let status = futures::executor::block_on(server.call(0xdead_beef, call)).unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    assert_eq!(
        status.message(),
        "method id 0xdeadbeef is not part of echo.Echo"
    );
}

#[test]
fn server_decodes_requests_and_encodes_replies() {
    use prost::Message as _;
    let server = EchoServer::new(EchoImpl);
    let call = ServerCall::new(
        MetadataMap::new(),
        Bytes::from(request("direct").encode_to_vec()),
        None,
    );
    let reply = futures::executor::block_on(server.call(echo_server::ECHO.id, call)).unwrap();
    let mut buf = vec![0; reply.body().encoded_len()];
    reply.body().encode_into(&mut buf);
    assert_eq!(EchoReply::decode(&buf[..]).unwrap().message, "direct");

    let garbage = ServerCall::new(MetadataMap::new(), Bytes::from_static(&[0xff, 0xff]), None);
    let status =
        futures::executor::block_on(server.call(echo_server::ECHO.id, garbage)).unwrap_err();
    assert_eq!(status.code(), Code::Internal);
}

#[test]
fn generated_types_are_debug_and_clone() {
    let server = EchoServer::new(EchoImpl);
    assert_eq!(format!("{:?}", server.clone()), "EchoServer { .. }");
    let client = client();
    assert!(format!("{:?}", client.clone()).contains("loopback"));
    assert_eq!(client.channel().in_flight(), 0);
}
