//! Parsing `tcp://host:port`, `rdma://host:port` and `grpc://host:port` URLs.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;
use crate::schemes;

/// The transport a URL selects (its position in the facade's table of schemes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// `tcp://`: the frames over a TCP stream; works on any machine.
    Tcp,
    /// `rdma://`: RC queue pairs set up with rdma_cm.
    Rdma,
    /// `grpc://`: standard gRPC over HTTP/2, to and from gRPC peers in any language.
    Grpc,
    /// `grpcs://`: the same over TLS (rustls).
    GrpcTls,
    /// `tcps://`: our frames over TLS (rustls).
    TcpTls,
}

/// A parsed endpoint URL.
///
/// ```
/// use rdma_rpc::{Endpoint, TransportKind};
/// let ep: Endpoint = "rdma://192.168.77.1:7471".parse().unwrap();
/// assert_eq!(ep.kind(), TransportKind::Rdma);
/// assert_eq!(ep.authority(), "192.168.77.1:7471");
/// assert!("http://x:1".parse::<Endpoint>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    kind: TransportKind,
    host: String,
    port: u16,
}

impl Endpoint {
    /// Which transport.
    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    /// Host name or address (IPv6 without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port`, bracketing IPv6 addresses, as socket APIs want it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.kind.scheme().name, self.authority())
    }
}

impl FromStr for Endpoint {
    type Err = Error;

    fn from_str(input: &str) -> Result<Endpoint, Error> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: input.to_owned(),
            reason,
        };
        let url = url::Url::parse(input).map_err(|e| invalid(e.to_string()))?;
        let Some(scheme) = schemes::named(url.scheme()) else {
            return Err(invalid(format!(
                "unsupported scheme '{}': use {}",
                url.scheme(),
                schemes::supported()
            )));
        };
        let kind = scheme.kind;
        let host = match url.host() {
            Some(url::Host::Ipv6(addr)) => addr.to_string(),
            Some(host) => host.to_string(),
            None => return Err(invalid("missing host".into())),
        };
        let port = url
            .port()
            .ok_or_else(|| invalid("missing port (e.g. tcp://127.0.0.1:50051)".into()))?;
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(invalid("unexpected path, query or fragment".into()));
        }
        Ok(Endpoint { kind, host, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_supported_urls() {
        let ep: Endpoint = "tcp://localhost:50051".parse().unwrap();
        assert_eq!(
            (ep.kind(), ep.host(), ep.port()),
            (TransportKind::Tcp, "localhost", 50051)
        );
        let v6: Endpoint = "tcp://[::1]:9".parse().unwrap();
        assert_eq!(v6.authority(), "[::1]:9");
        assert_eq!(v6.to_string(), "tcp://[::1]:9");
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("127.0.0.1:80", "relative URL"),
            ("http://h:1", "unsupported scheme 'http'"),
            ("tcp://h", "missing port"),
            ("tcp://:80", ""),
            ("tcp://h:99999", "invalid port"),
            ("tcp://h:1/path", "unexpected path"),
        ];
        for (url, expected) in cases {
            let err = url.parse::<Endpoint>().unwrap_err().to_string();
            assert!(err.contains(url), "{err} should name {url}");
            assert!(err.contains(expected), "{err} should say {expected}");
        }
    }
}
