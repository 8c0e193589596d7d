//! Python's grpcio serving the examples' Tester and Streamer (`tests/grpc/server.py`): the
//! gRPC server we did not write that our generated clients are tested against. Needs
//! `python3` with `grpcio` and `grpcio-tools` (the README's test command installs them).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running grpcio server, stopped when dropped.
pub struct GrpcioServer {
    child: Child,
    url: String,
}

impl GrpcioServer {
    /// Starts it on 127.0.0.1 (a free port); panics, naming what is missing, if it cannot.
    pub fn start() -> GrpcioServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc/server.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (install python3)");
        let mut first = String::new();
        let stdout = child.stdout.take().expect("piped");
        BufReader::new(stdout)
            .read_line(&mut first)
            .expect("the grpcio server prints its port");
        let port: u16 = first.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "the grpcio server did not start (is grpcio installed? pip install grpcio \
                 grpcio-tools); it printed {first:?}"
            )
        });
        GrpcioServer {
            child,
            url: format!("grpc://127.0.0.1:{port}"),
        }
    }

    /// `grpc://127.0.0.1:port`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for GrpcioServer {
    fn drop(&mut self) {
        // Closing its stdin tells it to stop; one that does not within a few seconds is
        // killed.
        drop(self.child.stdin.take());
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
