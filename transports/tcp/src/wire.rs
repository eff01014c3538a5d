//! The TCP transport's wire format: endpoints, connection hellos and message frames.
//!
//! Pure encoding and decoding, no I/O. Decoders never allocate from a length they read; callers
//! check lengths against their limits before trusting them.
//!
//! A connection starts with the authentication exchange of [`oxccl_transport::auth`], context
//! `b"oxccl-tcp"` followed by the communicator's context bytes. The connecting rank's hello is
//! [`ClientHello`], the accepting rank's is [`ServerHello`]; after checking the connecting
//! rank's proof, the accepting side sends one [`ACK`] byte, so the connecting side knows it was
//! accepted rather than turned away as a duplicate. Then both directions carry frames: an
//! 8-byte [`FrameHeader`] (`u32` LE payload length, `u32` LE kind) followed by the payload.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use oxccl_transport::Rank;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 8;
/// Frame kind of a data message (matched, in order, against posted receives).
pub const KIND_DATA: u32 = 0;
/// Frame kind of a control message (delivered as soon as it arrives).
pub const KIND_CONTROL: u32 = 1;
/// Largest control payload.
pub const MAX_CONTROL: usize = 4096;
/// The byte the accepting side sends once it has accepted a connection.
pub const ACK: u8 = 0x06;
/// Prefix of the authentication context; the communicator's context bytes follow.
pub const AUTH_CONTEXT: &[u8] = b"oxccl-tcp";

/// The 8 bytes in front of every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload length in bytes.
    pub len: u32,
    /// [`KIND_DATA`], [`KIND_CONTROL`], or (from a broken peer) anything else.
    pub kind: u32,
}

impl FrameHeader {
    /// The header's bytes.
    pub fn encode(self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&self.len.to_le_bytes());
        h[4..].copy_from_slice(&self.kind.to_le_bytes());
        h
    }

    /// Reads a header; the caller validates kind and length.
    pub fn decode(bytes: [u8; HEADER_LEN]) -> FrameHeader {
        FrameHeader {
            len: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            kind: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        }
    }
}

/// What the connecting rank says about itself (authenticated by the handshake's MACs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientHello {
    /// The connecting rank.
    pub from: Rank,
    /// The rank it means to reach.
    pub to: Rank,
    /// Ranks in its communicator.
    pub nranks: usize,
}

impl ClientHello {
    /// Bytes of an encoded hello.
    pub const LEN: usize = 12;

    /// The hello's bytes (`from`, `to`, `nranks`, each `u32` LE). Ranks above `u32::MAX` are
    /// refused by [`crate::TcpTransport::new`], so the narrowing never loses bits in practice.
    pub fn encode(&self) -> Vec<u8> {
        [self.from, self.to, self.nranks]
            .iter()
            .flat_map(|v| (*v as u32).to_le_bytes())
            .collect()
    }

    /// Parses a hello; `None` if it has the wrong length.
    pub fn decode(bytes: &[u8]) -> Option<ClientHello> {
        let v = u32s::<3>(bytes)?;
        Some(ClientHello {
            from: v[0] as Rank,
            to: v[1] as Rank,
            nranks: v[2] as usize,
        })
    }
}

/// What the accepting rank says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerHello {
    /// The accepting rank.
    pub rank: Rank,
    /// Ranks in its communicator.
    pub nranks: usize,
}

impl ServerHello {
    /// The hello's bytes (`rank`, `nranks`, each `u32` LE).
    pub fn encode(&self) -> Vec<u8> {
        [self.rank, self.nranks]
            .iter()
            .flat_map(|v| (*v as u32).to_le_bytes())
            .collect()
    }

    /// Parses a hello; `None` if it has the wrong length.
    pub fn decode(bytes: &[u8]) -> Option<ServerHello> {
        let v = u32s::<2>(bytes)?;
        Some(ServerHello {
            rank: v[0] as Rank,
            nranks: v[1] as usize,
        })
    }
}

fn u32s<const N: usize>(bytes: &[u8]) -> Option<[u32; N]> {
    if bytes.len() != 4 * N {
        return None;
    }
    let mut v = [0u32; N];
    for (x, c) in v.iter_mut().zip(bytes.chunks_exact(4)) {
        *x = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Some(v)
}

/// Encodes a listening address as endpoint bytes: `4`, the IPv4 address, the port (`u16` LE);
/// or `6`, the IPv6 address, the port, the scope id (`u32` LE).
pub fn encode_endpoint(addr: &SocketAddr) -> Vec<u8> {
    let mut e = Vec::with_capacity(23);
    match addr {
        SocketAddr::V4(a) => {
            e.push(4);
            e.extend_from_slice(&a.ip().octets());
            e.extend_from_slice(&a.port().to_le_bytes());
        }
        SocketAddr::V6(a) => {
            e.push(6);
            e.extend_from_slice(&a.ip().octets());
            e.extend_from_slice(&a.port().to_le_bytes());
            e.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    e
}

/// Decodes [`encode_endpoint`]'s bytes; `None` if they are not a well-formed endpoint.
pub fn decode_endpoint(bytes: &[u8]) -> Option<SocketAddr> {
    match bytes {
        [4, rest @ ..] if rest.len() == 6 => {
            let ip = Ipv4Addr::new(rest[0], rest[1], rest[2], rest[3]);
            Some(SocketAddr::new(
                IpAddr::V4(ip),
                u16::from_le_bytes([rest[4], rest[5]]),
            ))
        }
        [6, rest @ ..] if rest.len() == 22 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&rest[..16]);
            let port = u16::from_le_bytes([rest[16], rest[17]]);
            let scope = u32::from_le_bytes([rest[18], rest[19], rest[20], rest[21]]);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                port,
                0,
                scope,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_garbage_is_refused() {
        for a in ["127.0.0.1:4000", "[::1]:65535", "[fe80::1%3]:7"] {
            let a: SocketAddr = match a.parse() {
                Ok(a) => a,
                // Older parsers reject scope ids; the other forms still run.
                Err(_) => continue,
            };
            assert_eq!(decode_endpoint(&encode_endpoint(&a)), Some(a));
        }
        assert_eq!(decode_endpoint(b""), None);
        assert_eq!(decode_endpoint(&[4, 1, 2, 3]), None);
        assert_eq!(decode_endpoint(&[5, 1, 2, 3, 4, 5, 6]), None);
    }

    #[test]
    fn hellos_and_headers_round_trip() {
        let c = ClientHello {
            from: 3,
            to: 1,
            nranks: 4,
        };
        assert_eq!(ClientHello::decode(&c.encode()), Some(c));
        assert_eq!(ClientHello::decode(&[0; 11]), None);
        let s = ServerHello { rank: 1, nranks: 4 };
        assert_eq!(ServerHello::decode(&s.encode()), Some(s));
        let h = FrameHeader {
            len: 0xdead_beef,
            kind: KIND_CONTROL,
        };
        assert_eq!(FrameHeader::decode(h.encode()), h);
    }
}
