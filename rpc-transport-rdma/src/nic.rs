//! Choosing the NIC a connection goes through ([`Nic`]): a source address, or a device, its
//! port and a GID table entry, whose address the connection then uses. rdma_cm picks the
//! device by route when nothing is set.
//!
//! On RoCE every GID table entry of a port is an address of its network device (an
//! IPv4-mapped one for IPv4), so naming a device (and a GID index) names a source address,
//! and rdma_cm binds to the device that owns it; it then picks the GID entry and RoCE
//! version for that address itself. On InfiniBand GIDs are not IP addresses: name the
//! IPoIB address as the source instead. After the route is resolved, the device and port
//! it leaves through are checked against the ones named, and a failed handshake names them
//! and the source address: rdma_cm looks the route up on the named device's link only,
//! where the kernel takes a peer no route there covers to be on the link, so a peer that
//! is not makes the handshake time out.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use rpc_core::Status;

use crate::verbs::{devices, CmId, Context, LinkLayer, PortState};

/// Which RDMA device and port a client's connections leave through, and a server listens on
/// ([`RdmaConfig::nic`](crate::RdmaConfig::nic)).
///
/// ```
/// use rpc_transport_rdma::Nic;
/// // The address of mlx5_1's port 1 (its first GID that is an IPv4 or global IPv6 address).
/// let nic = Nic::default().device("mlx5_1");
/// // The address in port 2's GID 3.
/// let nic = Nic::default().device("mlx5_1").port(2).gid_index(3);
/// // Or an address of the NIC itself.
/// let nic = Nic::default().source("192.168.77.2".parse().unwrap());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Nic {
    /// The local address a client connects from, an address of the device to use; and the
    /// one a server listening on an unspecified address (`0.0.0.0`, `::`) listens on
    /// instead. `None`: the address of `device` (if set), else rdma_cm's choice by route.
    pub source: Option<IpAddr>,
    /// The device by name (`mlx5_0`, `rxe0`); `None`: whichever the route leads to. A client
    /// whose route leaves through another device, or a server given an address of another
    /// device, fails naming both.
    pub device: Option<String>,
    /// The device's port (default 1); checked only with `device`.
    pub port: u8,
    /// The GID table entry of `device`'s port whose address to use (RoCE); `None`: the
    /// first entry holding an address of the peer's family (IPv4, or global IPv6).
    /// Link-local entries are never used: they name no interface to connect through. It
    /// chooses the address: rdma_cm picks the entry (and RoCE version) for it.
    pub gid_index: Option<u32>,
}

impl Default for Nic {
    fn default() -> Self {
        Nic {
            source: None,
            device: None,
            port: 1,
            gid_index: None,
        }
    }
}

impl Nic {
    /// Sets [`Nic::source`].
    #[must_use]
    pub fn source(mut self, source: IpAddr) -> Nic {
        self.source = Some(source);
        self
    }

    /// Sets [`Nic::device`].
    #[must_use]
    pub fn device(mut self, device: impl Into<String>) -> Nic {
        self.device = Some(device.into());
        self
    }

    /// Sets [`Nic::port`].
    #[must_use]
    pub fn port(mut self, port: u8) -> Nic {
        self.port = port;
        self
    }

    /// Sets [`Nic::gid_index`].
    #[must_use]
    pub fn gid_index(mut self, index: u32) -> Nic {
        self.gid_index = Some(index);
        self
    }

    /// The address connections to or listeners on an address of `family`'s kind take as
    /// their own: [`Nic::source`], or the address of [`Nic::device`]'s GID; `None` when
    /// neither is set.
    pub(crate) fn local_address(&self, family: &SocketAddr) -> Result<Option<IpAddr>, Status> {
        if let Some(source) = self.source {
            return Ok(Some(source));
        }
        let Some(name) = &self.device else {
            return Ok(None);
        };
        let context = open(name)?;
        let port = context.query_port(self.port).map_err(|e| {
            Status::invalid_argument(format!("device {name} has no port {}: {e}", self.port))
        })?;
        if port.link_layer == LinkLayer::InfiniBand {
            return Err(Status::invalid_argument(format!(
                "device {name} port {} is InfiniBand, whose GIDs are not IP addresses: \
                 name its IPoIB address as the source instead",
                self.port
            )));
        }
        if port.state != PortState::Active {
            return Err(Status::unavailable(format!(
                "port {} of device {name} is not active ({:?})",
                self.port, port.state
            )));
        }
        let address_of = |index: u32| {
            let gid = context.query_gid(self.port, index).ok()?;
            gid_address(gid)
        };
        let address = match self.gid_index {
            Some(index) => address_of(index).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "GID {index} of device {name} port {} holds no usable address \
                     (empty, link-local, or past the table's {} entries)",
                    self.port, port.gid_tbl_len
                ))
            })?,
            None => (0..port.gid_tbl_len)
                .filter_map(address_of)
                .find(|address| address.is_ipv4() == family.is_ipv4())
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "device {name} port {} has no {} address in its GID table",
                        self.port,
                        if family.is_ipv4() {
                            "IPv4"
                        } else {
                            "global IPv6"
                        }
                    ))
                })?,
        };
        Ok(Some(address))
    }

    /// Whether a source address or a device is named.
    pub(crate) fn named(&self) -> bool {
        self.source.is_some() || self.device.is_some()
    }

    /// Checks that `id`, resolved or bound, uses the device and port named (if any).
    pub(crate) fn check(&self, id: &CmId) -> Result<(), Status> {
        let Some(name) = &self.device else {
            return Ok(());
        };
        let address = id
            .local_addr()
            .map_or("it".to_owned(), |a| a.ip().to_string());
        let used = id
            .context()
            .map_err(|_| {
                Status::invalid_argument(format!(
                    "{address} is not an address of an RDMA device, so not of device {name}"
                ))
            })?
            .name();
        let port = id.port_num();
        if used != *name || port != self.port {
            return Err(Status::invalid_argument(format!(
                "the route goes through device {used} port {port}, not the configured \
                 device {name} port {}",
                self.port
            )));
        }
        Ok(())
    }
}

/// The device named `name`, or an error naming it and the devices there are.
fn open(name: &str) -> Result<std::sync::Arc<Context>, Status> {
    Context::open(name).map_err(|e| {
        let present = devices()
            .map(|list| list.into_iter().map(|d| d.name).collect::<Vec<_>>())
            .unwrap_or_default();
        Status::invalid_argument(format!(
            "no RDMA device {name} ({e}); devices here: {}",
            if present.is_empty() {
                "none".to_owned()
            } else {
                present.join(", ")
            }
        ))
    })
}

/// The address a RoCE GID holds: IPv4 for an IPv4-mapped GID, else a global IPv6 address;
/// `None` for an empty or link-local one.
fn gid_address(gid: [u8; 16]) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(gid);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(IpAddr::V4(v4));
    }
    let link_local = v6.segments()[0] & 0xffc0 == 0xfe80;
    (!v6.is_unspecified() && !link_local).then_some(IpAddr::V6(v6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gid_holds_an_ipv4_or_a_global_ipv6_address() {
        let v4: Ipv6Addr = "::ffff:10.0.2.15".parse().unwrap();
        assert_eq!(gid_address(v4.octets()), Some("10.0.2.15".parse().unwrap()));
        let global: Ipv6Addr = "fd00::15".parse().unwrap();
        assert_eq!(gid_address(global.octets()), Some(IpAddr::V6(global)));
        let link_local: Ipv6Addr = "fe80::5054:ff:fe12:3456".parse().unwrap();
        assert_eq!(gid_address(link_local.octets()), None);
        assert_eq!(gid_address([0; 16]), None);
    }

    #[test]
    fn nothing_named_leaves_the_choice_to_rdma_cm() {
        let any: SocketAddr = "10.0.0.1:7471".parse().unwrap();
        assert_eq!(Nic::default().local_address(&any).unwrap(), None);
        let source: IpAddr = "10.0.0.2".parse().unwrap();
        let nic = Nic::default().source(source);
        assert_eq!(nic.local_address(&any).unwrap(), Some(source));
    }
}
