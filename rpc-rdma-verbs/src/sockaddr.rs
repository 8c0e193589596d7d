//! Conversions between `std::net::SocketAddr` and the C socket addresses rdma_cm takes.

use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A C socket address with room for IPv4 and IPv6.
pub(crate) struct RawSockAddr {
    storage: libc::sockaddr_storage,
}

impl RawSockAddr {
    pub(crate) fn new(addr: SocketAddr) -> RawSockAddr {
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (AF_UNSPEC) value.
        let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
        match addr {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned at least as strictly as
                // sockaddr_in, which the socket API defines as a valid prefix view.
                unsafe {
                    std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin)
                };
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as for sockaddr_in above.
                unsafe {
                    std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6)
                };
            }
        }
        RawSockAddr { storage }
    }

    /// The address as the `sockaddr_storage` rdma_cm keeps in a route.
    #[cfg(verbs_fabric)]
    pub(crate) fn into_storage(self) -> libc::sockaddr_storage {
        self.storage
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&mut self.storage as *mut libc::sockaddr_storage).cast()
    }
}

/// Reads an IPv4 or IPv6 address; `None` for other families (or an unset address).
///
/// # Safety
/// `addr` must point to a socket address whose storage is large enough for its family
/// (as the `rdma_addr` unions inside a `rdma_cm_id` are).
pub(crate) unsafe fn to_socket_addr(addr: *const libc::sockaddr) -> Option<SocketAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `addr` points to a readable socket address.
    let family = i32::from(unsafe { (*addr).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; read unaligned to be
            // independent of the container's alignment.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read_unaligned(addr.cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6: libc::sockaddr_in6 = unsafe { std::ptr::read_unaligned(addr.cast()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for text in ["192.168.77.1:7471", "[fe80::1]:9"] {
            let addr: SocketAddr = text.parse().unwrap();
            let mut raw = RawSockAddr::new(addr);
            // SAFETY: `raw` holds a full sockaddr_storage.
            let back = unsafe { to_socket_addr(raw.as_mut_ptr()) };
            assert_eq!(back, Some(addr));
        }
    }
}
