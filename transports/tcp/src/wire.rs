//! The TCP transport's wire format: endpoints, connection hellos and message frames.
//!
//! Pure encoding and decoding, no I/O. Decoders never allocate from a length they read; callers
//! check lengths against their limits before trusting them.
//!
//! A connection starts with the authentication exchange of [`oxccl_transport::auth`], context
//! `b"oxccl-tcp"` followed by the communicator's context bytes. The connecting rank's hello is
//! [`ClientHello`], the accepting rank's is [`ServerHello`]; after checking the connecting
//! rank's proof, the accepting side sends one [`ACK`] byte, so the connecting side knows it was
//! accepted rather than turned away as a duplicate.
//!
//! Two connections join each pair of ranks, one per direction of data (the [`Lane`] in the
//! connecting rank's hello): frames (an 8-byte [`FrameHeader`], `u32` LE payload length and
//! `u32` LE kind, then the payload) flow only from a lane's sender to its receiver, and the
//! receiver writes nothing after the handshake. So a receiver that stops reading, and whose
//! window closes, never holds up the acknowledgements of the other direction's data: on one
//! connection they ride on segments that a receive window closed under memory pressure drops
//! whole (Linux 6.17 and later), and both ranks could wait for each other until the deadline.

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

/// Which way a connection carries data between the connecting (higher) rank and the accepting
/// (lower) one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    /// From the connecting rank to the accepting rank.
    Up,
    /// From the accepting rank to the connecting rank.
    Down,
}

impl Lane {
    /// Both lanes, in wire order.
    pub const BOTH: [Lane; 2] = [Lane::Up, Lane::Down];

    fn code(self) -> u32 {
        match self {
            Lane::Up => 0,
            Lane::Down => 1,
        }
    }

    fn from_code(code: u32) -> Option<Lane> {
        match code {
            0 => Some(Lane::Up),
            1 => Some(Lane::Down),
            _ => None,
        }
    }

    /// The lane on which a rank sends to `peer` (`me > peer`: this rank connects).
    pub fn sending(me: Rank, peer: Rank) -> Lane {
        if me > peer { Lane::Up } else { Lane::Down }
    }

    /// The lane the other way.
    pub fn reverse(self) -> Lane {
        match self {
            Lane::Up => Lane::Down,
            Lane::Down => Lane::Up,
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
    /// Which way the connection will carry data.
    pub lane: Lane,
    /// Random, the same in both hellos of one rank's connections to this peer: the accepting
    /// side takes a pair's second connection only from the session of its first.
    pub session: u64,
}

impl ClientHello {
    /// Bytes of an encoded hello.
    pub const LEN: usize = 24;

    /// The hello's bytes (`from`, `to`, `nranks`, lane (0 up, 1 down), each `u32` LE, then
    /// the session, `u64` LE). Ranks above `u32::MAX` are refused by
    /// [`crate::TcpTransport::new`], so the narrowing never loses bits in practice.
    pub fn encode(&self) -> Vec<u8> {
        let mut b: Vec<u8> = [
            self.from as u32,
            self.to as u32,
            self.nranks as u32,
            self.lane.code(),
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
        b.extend_from_slice(&self.session.to_le_bytes());
        b
    }

    /// Parses a hello; `None` if it has the wrong length or names no lane.
    pub fn decode(bytes: &[u8]) -> Option<ClientHello> {
        if bytes.len() != Self::LEN {
            return None;
        }
        let (words, session) = bytes.split_at(16);
        let v = u32s::<4>(words)?;
        Some(ClientHello {
            from: v[0] as Rank,
            to: v[1] as Rank,
            nranks: v[2] as usize,
            lane: Lane::from_code(v[3])?,
            session: u64::from_le_bytes(session.try_into().ok()?),
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
        for lane in Lane::BOTH {
            let c = ClientHello {
                from: 3,
                to: 1,
                nranks: 4,
                lane,
                session: 0x0123_4567_89ab_cdef,
            };
            assert_eq!(ClientHello::decode(&c.encode()), Some(c));
        }
        assert_eq!(ClientHello::decode(&[0; 23]), None);
        assert_eq!(ClientHello::decode(&[0; 25]), None);
        let mut no_lane = [0u8; 24];
        no_lane[12] = 2;
        assert_eq!(ClientHello::decode(&no_lane), None);
        assert_eq!(Lane::sending(3, 1), Lane::Up);
        assert_eq!(Lane::sending(1, 3), Lane::Down);
        assert_eq!(Lane::sending(3, 1).reverse(), Lane::sending(1, 3));
        let s = ServerHello { rank: 1, nranks: 4 };
        assert_eq!(ServerHello::decode(&s.encode()), Some(s));
        let h = FrameHeader {
            len: 0xdead_beef,
            kind: KIND_CONTROL,
        };
        assert_eq!(FrameHeader::decode(h.encode()), h);
    }
}
