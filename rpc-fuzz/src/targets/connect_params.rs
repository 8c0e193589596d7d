//! The rdma_cm private data a server reads from anyone: connect parameters (decoded, then
//! negotiated against the default configuration and a small one) and reject reasons.

use rpc_rdma_protocol::{decode_reject, Config, ConnectParams, Geometry};

pub(crate) fn run(data: &[u8]) {
    let _ = decode_reject(data);
    let Ok(params) = ConnectParams::decode(data) else {
        return;
    };
    let _ = ConnectParams::auth_data(data, 32);
    let small = Config {
        send_slots: 4,
        send_slot_size: 256,
        recv_slots: 4,
        recv_slot_size: 256,
        shared_recv: data.first().is_some_and(|b| b & 1 == 1),
        ..Config::default()
    };
    for ours in [Config::default(), small] {
        if let Ok(geometry) = Geometry::negotiate(&ours, &params) {
            assert!(geometry.recv_slots >= 1 && geometry.max_send_frame >= 64);
            let _ = rpc_rdma_protocol::Connection::new(geometry);
        }
    }
    assert_eq!(ConnectParams::decode(&params.encode()), Ok(params));
}

/// The parameters a default client sends, to mutate.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    vec![Config::default().connect_params().encode().to_vec()]
}
