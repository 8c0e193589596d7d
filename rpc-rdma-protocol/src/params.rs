//! Connection parameters exchanged in rdma_cm private data.
//!
//! Each side states its receive ring, the part of it backed by posted receives (the peer's
//! initial credits) and the protocol versions it speaks. The
//! client puts its [`ConnectParams`] in the CONNECT_REQUEST private data (at most
//! [`MAX_CONNECT_PRIVATE_DATA`] bytes), the server answers with its own in the accept
//! private data (at most [`MAX_ACCEPT_PRIVATE_DATA`] bytes). Both sides then run the same
//! [`crate::Geometry::negotiate`].
//!
//! Layout ([`CONNECT_PARAMS_LEN`] bytes, little-endian):
//!
//! | offset | size | field          | meaning                                             |
//! |-------:|-----:|----------------|-----------------------------------------------------|
//! | 0      | 4    | magic          | [`CM_MAGIC`] (`"RRCM"`)                             |
//! | 4      | 1    | min_version    | lowest transport protocol version spoken            |
//! | 5      | 1    | max_version    | highest transport protocol version spoken           |
//! | 6      | 2    | flags          | [`FLAG_AUTH`]; unknown bits are rejected            |
//! | 8      | 4    | recv_slots     | most credits the sender will ever grant (ceiling)   |
//! | 12     | 4    | recv_slot_size | bytes per receive slot = largest frame accepted     |
//! | 16     | 4    | recv_window    | receives posted before connecting/accepting: the    |
//! |        |      |                | peer's initial credits (`3..=recv_slots`)           |
//!
//! With [`FLAG_AUTH`], authentication bytes follow the parameters: the client's hello
//! (`rpc_wire::auth::HELLO_LEN` bytes, so the connect private data is 52 of its 56 bytes), or
//! the server's proof in its accept (`rpc_wire::auth::PROOF_LEN`). Other bytes after the
//! parameters are ignored: rdma_cm pads private data with zeros, and a later version
//! appends its fields there.

use super::credits::UNLENT_SLOTS;
use super::error::ParamsError;

/// Flag: authentication bytes follow the parameters (see the module documentation).
pub const FLAG_AUTH: u16 = 1;

/// First four bytes of the private data: `"RRCM"`.
pub const CM_MAGIC: u32 = u32::from_le_bytes(*b"RRCM");
/// Transport protocol version (credit and ring rules) spoken by this build.
pub const TRANSPORT_VERSION: u8 = 2;
/// Size of encoded [`ConnectParams`].
pub const CONNECT_PARAMS_LEN: usize = 20;
/// Private data an RC CONNECT_REQUEST may carry (InfiniBand CM limit, rdma_cm header removed).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Private data an RC accept (REP) may carry.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;

/// Fewest slots in a ring: one reserved credit plus a credit-return threshold of at least
/// two that stays below the ring size (see `docs/PROTOCOL-credits.md`).
pub const MIN_SLOT_COUNT: u32 = 3;
/// Most slots in a ring (beyond any HCA's queue depth).
pub const MAX_SLOT_COUNT: u32 = 1 << 16;
/// Smallest slot: a bare header.
pub const MIN_SLOT_SIZE: u32 = rpc_wire::HEADER_LEN as u32;
/// Largest slot; bigger payloads take the RDMA WRITE rendezvous path.
pub const MAX_SLOT_SIZE: u32 = 16 << 20;
/// Largest ring (slot count × slot size).
pub const MAX_RING_BYTES: u64 = 1 << 30;

const _: () = assert!(CONNECT_PARAMS_LEN <= MAX_CONNECT_PRIVATE_DATA);

/// What one side announces about itself when connecting or accepting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectParams {
    /// Lowest transport protocol version spoken.
    pub min_version: u8,
    /// Highest transport protocol version spoken.
    pub max_version: u8,
    /// Receive slots of the sender of these parameters: the most credits it will ever have
    /// granted at once.
    pub recv_slots: u32,
    /// Bytes per receive slot: the largest frame the peer may send.
    pub recv_slot_size: u32,
    /// Receives the sender posted before the connection was established: the peer's
    /// initial credits. The sender may grant more later, up to `recv_slots`.
    pub recv_window: u32,
}

impl ConnectParams {
    /// Parameters for a receive ring of `recv_slots` × `recv_slot_size`, every slot posted,
    /// speaking only [`TRANSPORT_VERSION`].
    pub const fn new(recv_slots: u32, recv_slot_size: u32) -> Self {
        ConnectParams {
            min_version: TRANSPORT_VERSION,
            max_version: TRANSPORT_VERSION,
            recv_slots,
            recv_slot_size,
            recv_window: recv_slots,
        }
    }

    /// The same parameters with only `recv_window` receives posted at first.
    pub const fn with_window(self, recv_window: u32) -> Self {
        ConnectParams {
            recv_window,
            ..self
        }
    }

    /// Checks the version range and the ring geometry.
    pub fn validate(&self) -> Result<(), ParamsError> {
        if self.min_version == 0 || self.min_version > self.max_version {
            return Err(ParamsError::InvalidVersionRange {
                min: self.min_version,
                max: self.max_version,
            });
        }
        validate_ring("peer receive ring", self.recv_slots, self.recv_slot_size)?;
        validate_window("peer receive window", self.recv_window, self.recv_slots)
    }

    /// The encoded form, to be sent as rdma_cm private data.
    pub fn encode(&self) -> [u8; CONNECT_PARAMS_LEN] {
        let mut out = [0u8; CONNECT_PARAMS_LEN];
        out[0..4].copy_from_slice(&CM_MAGIC.to_le_bytes());
        out[4] = self.min_version;
        out[5] = self.max_version;
        out[6..8].copy_from_slice(&0u16.to_le_bytes());
        out[8..12].copy_from_slice(&self.recv_slots.to_le_bytes());
        out[12..16].copy_from_slice(&self.recv_slot_size.to_le_bytes());
        out[16..20].copy_from_slice(&self.recv_window.to_le_bytes());
        out
    }

    /// The parameters followed by `auth` (a client's hello, a server's proof), flagged.
    pub fn encode_with_auth(&self, auth: &[u8]) -> Vec<u8> {
        let mut out = self.encode().to_vec();
        out[6..8].copy_from_slice(&FLAG_AUTH.to_le_bytes());
        out.extend_from_slice(auth);
        out
    }

    /// The `len` authentication bytes after the parameters in `src`, if it is flagged as
    /// carrying them (`src` decoded as parameters already).
    pub fn auth_data(src: &[u8], len: usize) -> Result<Option<&[u8]>, ParamsError> {
        let flags = src
            .get(6..8)
            .map_or(0, |f| u16::from_le_bytes([f[0], f[1]]));
        if flags & FLAG_AUTH == 0 {
            return Ok(None);
        }
        let need = CONNECT_PARAMS_LEN + len;
        src.get(CONNECT_PARAMS_LEN..need)
            .map(Some)
            .ok_or(ParamsError::Truncated {
                len: src.len(),
                need,
            })
    }

    /// Decodes and validates private data received from the peer. Trailing bytes (rdma_cm
    /// padding, fields of later versions) are ignored.
    pub fn decode(src: &[u8]) -> Result<Self, ParamsError> {
        let src: &[u8; CONNECT_PARAMS_LEN] = src
            .get(..CONNECT_PARAMS_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(ParamsError::Truncated {
                len: src.len(),
                need: CONNECT_PARAMS_LEN,
            })?;
        let u32_at =
            |at: usize| u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]]);
        let magic = u32_at(0);
        if magic != CM_MAGIC {
            return Err(ParamsError::BadMagic(magic));
        }
        let flags = u16::from_le_bytes([src[6], src[7]]);
        if flags & !FLAG_AUTH != 0 {
            return Err(ParamsError::UnknownFlags(flags));
        }
        let params = ConnectParams {
            min_version: src[4],
            max_version: src[5],
            recv_slots: u32_at(8),
            recv_slot_size: u32_at(12),
            recv_window: u32_at(16),
        };
        params.validate()?;
        Ok(params)
    }

    /// The highest version both sides speak.
    pub fn common_version(&self, peer: &ConnectParams) -> Result<u8, ParamsError> {
        let version = self.max_version.min(peer.max_version);
        if version < self.min_version.max(peer.min_version) {
            return Err(ParamsError::NoCommonVersion {
                local_min: self.min_version,
                local_max: self.max_version,
                peer_min: peer.min_version,
                peer_max: peer.max_version,
            });
        }
        Ok(version)
    }
}

/// `value` if it lies in `min..=max`, else [`ParamsError::PolicyOutOfRange`] naming `what`.
pub(crate) fn in_range(
    what: &'static str,
    value: u32,
    min: u32,
    max: u32,
) -> Result<u32, ParamsError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ParamsError::PolicyOutOfRange {
            what,
            value,
            min,
            max,
        })
    }
}

/// Validates a receive window: at least [`UNLENT_SLOTS`] (the reserved credit and two to
/// return), at most the ring.
pub(crate) fn validate_window(
    what: &'static str,
    window: u32,
    slots: u32,
) -> Result<(), ParamsError> {
    if (UNLENT_SLOTS..=slots).contains(&window) {
        return Ok(());
    }
    Err(ParamsError::WindowOutOfRange {
        what,
        window,
        min: UNLENT_SLOTS,
        max: slots,
    })
}

/// Validates one ring's geometry; `what` names it in the error.
pub(crate) fn validate_ring(
    what: &'static str,
    slots: u32,
    slot_size: u32,
) -> Result<(), ParamsError> {
    if !(MIN_SLOT_COUNT..=MAX_SLOT_COUNT).contains(&slots) {
        return Err(ParamsError::SlotCountOutOfRange {
            what,
            count: slots,
            min: MIN_SLOT_COUNT,
            max: MAX_SLOT_COUNT,
        });
    }
    if !(MIN_SLOT_SIZE..=MAX_SLOT_SIZE).contains(&slot_size) {
        return Err(ParamsError::SlotSizeOutOfRange {
            what,
            size: slot_size,
            min: MIN_SLOT_SIZE,
            max: MAX_SLOT_SIZE,
        });
    }
    let bytes = u64::from(slots) * u64::from(slot_size);
    if bytes > MAX_RING_BYTES {
        return Err(ParamsError::RingTooLarge {
            what,
            bytes,
            max: MAX_RING_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn authentication_bytes_follow_flagged_parameters() {
        let p = ConnectParams::new(64, 4096);
        let hello = [7u8; 32];
        let data = p.encode_with_auth(&hello);
        assert!(
            data.len() <= MAX_CONNECT_PRIVATE_DATA,
            "{} bytes",
            data.len()
        );
        assert_eq!(ConnectParams::decode(&data), Ok(p));
        assert_eq!(ConnectParams::auth_data(&data, 32), Ok(Some(&hello[..])));
        assert_eq!(
            ConnectParams::auth_data(&p.encode(), 32),
            Ok(None),
            "not flagged"
        );
        assert_eq!(
            ConnectParams::auth_data(&data[..40], 32),
            Err(ParamsError::Truncated { len: 40, need: 52 })
        );
    }

    #[test]
    fn round_trips_and_fits_private_data() {
        let p = ConnectParams::new(64, 4096);
        let bytes = p.encode();
        assert!(bytes.len() <= MAX_CONNECT_PRIVATE_DATA);
        assert_eq!(&bytes[..4], b"RRCM");
        assert_eq!(ConnectParams::decode(&bytes), Ok(p));
        // rdma_cm pads private data to its maximum with zeros.
        let mut padded = [0u8; MAX_CONNECT_PRIVATE_DATA];
        padded[..CONNECT_PARAMS_LEN].copy_from_slice(&bytes);
        assert_eq!(ConnectParams::decode(&padded), Ok(p));
    }

    #[test]
    fn rejects_garbage_with_named_errors() {
        let good = ConnectParams::new(64, 4096).encode();
        assert_eq!(
            ConnectParams::decode(&good[..15]),
            Err(ParamsError::Truncated { len: 15, need: 20 })
        );
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            ConnectParams::decode(&b),
            Err(ParamsError::BadMagic(_))
        ));
        let mut b = good;
        b[7] = 0x80;
        assert_eq!(
            ConnectParams::decode(&b),
            Err(ParamsError::UnknownFlags(0x8000))
        );
        let mut b = good;
        b[4] = 3;
        b[5] = 2;
        assert_eq!(
            ConnectParams::decode(&b),
            Err(ParamsError::InvalidVersionRange { min: 3, max: 2 })
        );
        let mut b = good;
        b[4] = 0;
        assert!(matches!(
            ConnectParams::decode(&b),
            Err(ParamsError::InvalidVersionRange { .. })
        ));
    }

    #[test]
    fn window_travels_and_is_bounded_by_liveness_and_ring() {
        let p = ConnectParams::new(64, 4096).with_window(8);
        assert_eq!(ConnectParams::decode(&p.encode()), Ok(p));
        for window in [0, 2, 65, u32::MAX] {
            assert_eq!(
                ConnectParams::decode(&p.with_window(window).encode()),
                Err(ParamsError::WindowOutOfRange {
                    what: "peer receive window",
                    window,
                    min: 3,
                    max: 64
                })
            );
        }
        // A version-1 peer's 16 bytes, zero-padded by rdma_cm: window 0, refused by name.
        let mut v1 = [0u8; MAX_CONNECT_PRIVATE_DATA];
        v1[..16].copy_from_slice(&p.encode()[..16]);
        assert!(matches!(
            ConnectParams::decode(&v1),
            Err(ParamsError::WindowOutOfRange { window: 0, .. })
        ));
    }

    #[test]
    fn rejects_zero_and_absurd_geometry() {
        let check = |slots, size| ConnectParams::decode(&ConnectParams::new(slots, size).encode());
        assert!(matches!(
            check(0, 4096),
            Err(ParamsError::SlotCountOutOfRange { count: 0, .. })
        ));
        assert!(matches!(
            check(2, 4096),
            Err(ParamsError::SlotCountOutOfRange { count: 2, .. })
        ));
        assert!(matches!(
            check(u32::MAX, 4096),
            Err(ParamsError::SlotCountOutOfRange { .. })
        ));
        assert!(matches!(
            check(64, 0),
            Err(ParamsError::SlotSizeOutOfRange { size: 0, .. })
        ));
        assert!(matches!(
            check(64, 63),
            Err(ParamsError::SlotSizeOutOfRange { size: 63, .. })
        ));
        assert!(matches!(
            check(64, u32::MAX),
            Err(ParamsError::SlotSizeOutOfRange { .. })
        ));
        assert!(matches!(
            check(1 << 16, 1 << 20),
            Err(ParamsError::RingTooLarge { .. })
        ));
        assert!(check(MIN_SLOT_COUNT, MIN_SLOT_SIZE).is_ok());
        assert!(check(1 << 16, 1 << 14).is_ok());
    }

    #[test]
    fn negotiates_highest_common_version() {
        let a = ConnectParams {
            min_version: 1,
            max_version: 3,
            ..ConnectParams::new(8, 256)
        };
        let b = ConnectParams {
            min_version: 2,
            max_version: 5,
            ..ConnectParams::new(8, 256)
        };
        assert_eq!(a.common_version(&b), Ok(3));
        assert_eq!(b.common_version(&a), Ok(3));
        let c = ConnectParams {
            min_version: 4,
            max_version: 5,
            ..ConnectParams::new(8, 256)
        };
        assert!(matches!(
            a.common_version(&c),
            Err(ParamsError::NoCommonVersion { .. })
        ));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(p) = ConnectParams::decode(&bytes) {
                prop_assert_eq!(&p.encode()[..], &bytes[..CONNECT_PARAMS_LEN]);
            }
        }
    }
}
