//! Our generated clients over `grpc://` against tonic's server, a gRPC server we did not
//! write: unary calls of every size up to several MiB, many in flight, and a method tonic
//! does not serve.

use std::time::Duration;

use rdma_rpc::{Code, Request};
use rpc_bench::tonic_echo::proto::echo_server::EchoServer;
use rpc_bench::tonic_echo::TonicEcho;
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;
use rpc_examples::testing::tester_client::TesterClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_tonic() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                EchoServer::new(TonicEcho)
                    .max_decoding_message_size(16 << 20)
                    .max_encoding_message_size(16 << 20),
            )
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    let channel = rdma_rpc::client()
        .max_message_size(16 << 20)
        .connect(&format!("grpc://{addr}"))
        .await
        .unwrap();
    let echo = EchoClient::new(channel.clone());
    for (seq, size) in [0, 1, 100, 70_000, 5 << 20].into_iter().enumerate() {
        let payload = vec![seq as u8; size];
        let mut request = Request::new(EchoRequest {
            payload: payload.clone().into(),
            seq: seq as u64,
        });
        request.set_timeout(Duration::from_secs(10));
        let reply = echo.echo(request).await.unwrap().into_inner();
        assert_eq!((reply.seq, reply.payload.len()), (seq as u64, size));
        assert!(reply.payload == payload);
    }
    let calls = (0..200u64).map(|seq| {
        let echo = echo.clone();
        async move {
            let request = EchoRequest {
                payload: seq.to_le_bytes().to_vec().into(),
                seq,
            };
            echo.echo(request).await.unwrap().into_inner().seq
        }
    });
    let seqs = futures::future::join_all(calls).await;
    assert_eq!(seqs, (0..200).collect::<Vec<_>>());

    let tester = TesterClient::new(channel);
    let status = tester.now(()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status}");

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
