//! The two hosts of the pair tests (`chaos_pair`, `chaos_pair_heal`, `nic_pair`): the other
//! VM, which serves the echo service and takes its first link (`link0`) down and up when
//! asked.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;

use super::rdma;

/// Where the other VM's `echo-server`s listen (see `xtask`'s `pair_plans`).
const RDMA_PORT: u16 = 7471;
const TCP_PORT: u16 = 7472;

/// How long new connections are tried after the link comes back.
const RECOVERY: Duration = Duration::from_secs(10);

/// The other VM of the pair, and the directory the two VMs meet in.
pub struct Peer {
    addr: String,
    dir: PathBuf,
}

impl Peer {
    /// The peer of this run, once the device this side needs is there.
    pub fn from_env() -> Peer {
        rpc_transport_rdma::verbs::test_support::require_device().expect("an RDMA device");
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| panic!("{name}: run by `cargo xtask test`"))
        };
        Peer {
            addr: var("PAIR_PEER"),
            dir: PathBuf::from(var("PAIR_DIR")),
        }
    }

    /// The routes to it, one per link: this host's RDMA device on the link, this host's
    /// address on it, and the peer's.
    pub fn routes() -> Vec<Route> {
        let var = std::env::var("PAIR_ROUTES").expect("PAIR_ROUTES: run by `cargo xtask test`");
        var.split(',')
            .map(|link| {
                let parts: Vec<&str> = link.split('/').collect();
                let [device, local, peer] = parts[..] else {
                    panic!("PAIR_ROUTES: {link:?} is not device/local address/peer address");
                };
                let addr = |text: &str| {
                    text.parse()
                        .unwrap_or_else(|e| panic!("PAIR_ROUTES: {text:?}: {e}"))
                };
                Route {
                    device: device.to_owned(),
                    local: addr(local),
                    peer: addr(peer),
                }
            })
            .collect()
    }

    /// The URLs of its echo service: over rdma://, and over tcp://.
    pub fn urls(&self) -> (String, String) {
        (
            format!("rdma://{}:{RDMA_PORT}", self.addr),
            format!("tcp://{}:{TCP_PORT}", self.addr),
        )
    }

    /// Asks the server's VM to take its first link (`link0`, the one [`Peer::urls`] reach it
    /// across) `down` or `up`, and waits until it did.
    pub fn set_link0(&self, state: &str) {
        std::fs::write(self.dir.join(format!("link-{state}")), b"").expect("asking the peer");
        let done = self.dir.join(format!("link-is-{state}"));
        let until = Instant::now() + Duration::from_secs(30);
        while !done.exists() {
            assert!(
                Instant::now() < until,
                "the peer did not take link0 {state}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Peer {
    /// Asks the server's VM to take its first link (`link0`) down for `outage` and up
    /// again, and waits until it did.
    pub fn blip(&self, outage: Duration) {
        let ask = self.dir.join("link-blip");
        std::fs::write(&ask, format!("{:.3}", outage.as_secs_f64())).expect("asking the peer");
        let done = self.dir.join("link-is-blipped");
        let until = Instant::now() + Duration::from_secs(30) + outage;
        while !done.exists() {
            assert!(Instant::now() < until, "the peer did not blip link0");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The way to the peer over one link, as this host sees it.
#[derive(Debug, Clone)]
pub struct Route {
    /// This host's RDMA device on it.
    pub device: String,
    /// This host's address on it.
    pub local: IpAddr,
    /// The peer's address on it.
    pub peer: IpAddr,
}

impl Route {
    /// The peer's echo service over rdma://, across this link.
    pub fn url(&self) -> String {
        format!("rdma://{}:{RDMA_PORT}", self.peer)
    }
}

/// Whether a new connection to `url` answers a call within 10 s; how long it took.
pub fn new_connections_work(url: &str) -> Result<Duration, String> {
    let since = Instant::now();
    loop {
        let attempt = rdma_rpc::client()
            .rdma_config(rdma())
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(2))
            .connect_blocking(url)
            .map_err(|e| e.to_string())
            .and_then(|channel| {
                EchoClient::new(channel)
                    .echo_blocking(EchoRequest::default())
                    .map_err(|e| e.to_string())
            });
        match attempt {
            Ok(_) => return Ok(since.elapsed()),
            Err(e) if since.elapsed() > RECOVERY => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
