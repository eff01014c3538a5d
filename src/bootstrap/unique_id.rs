//! `UniqueId`, NCCL's ncclUniqueId: 128 bytes that one process creates (starting a store
//! server) and hands to every rank out of band; they carry the store's address and the job
//! secret. Parsing must reject anything that is not a well-formed id; Debug must not show the
//! secret.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::{Secret, StoreServer, TcpStore, iface};
use crate::{Error, Result};

/// Size of a [`UniqueId`] in bytes (NCCL_UNIQUE_ID_BYTES).
pub const UNIQUE_ID_BYTES: usize = 128;

const MAGIC: [u8; 8] = *b"OXCCL-ID";
const VERSION: u8 = 1;
// Layout (integers little-endian):
//   0..8 magic · 8 version · 9 family (4 or 6) · 10..12 port · 12..28 address (IPv4 in the
//   first 4 bytes) · 28..32 IPv6 scope id · 32..36 IPv6 flow info · 36..68 secret ·
//   68..120 zero · 120..128 the first 8 bytes of SHA-256 over bytes 0..120
const FAMILY: usize = 9;
const PORT: usize = 10;
const ADDR: usize = 12;
const SCOPE: usize = 28;
const FLOW: usize = 32;
const SECRET: usize = 36;
const RESERVED: usize = 68;
const CHECKSUM: usize = 120;

/// Store servers started by [`UniqueId::new`]; they live as long as the process.
static SERVERS: Mutex<Vec<StoreServer>> = Mutex::new(Vec::new());

/// The store server [`UniqueId::new`] started in this process for `id`, handed over (to the
/// communicator of rank 0 made from it, with [`crate::Config::unique_id_server_with_comm`]):
/// it then lives as long as its new owner. `None` if this process did not make `id`.
pub(crate) fn take_server(id: &UniqueId) -> Option<StoreServer> {
    let addr = id.store_addr();
    let mut servers = SERVERS.lock().unwrap_or_else(PoisonError::into_inner);
    let i = servers.iter().position(|s| s.local_addr() == addr)?;
    Some(servers.swap_remove(i))
}

/// What every rank of a job needs to find the others: the store's address and the job secret,
/// in exactly 128 bytes (NCCL's ncclUniqueId). Create it once with [`UniqueId::new`], send
/// [`UniqueId::as_bytes`] to every rank, read it back with [`UniqueId::from_bytes`].
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// Starts a store server on this host — on the address [`iface::choose_ip`] picks with no
    /// store to route to, port 0 — with a fresh random secret, and returns its id. The server
    /// stays alive for the rest of the process.
    pub fn new() -> Result<UniqueId> {
        let ip = iface::choose_ip(None)?;
        let secret = Secret::random()
            .map_err(|e| Error::Bootstrap(format!("cannot make a job secret: {e}")))?;
        let server = StoreServer::bind(SocketAddr::new(ip, 0), secret.clone())?;
        let id = UniqueId::from_parts(server.local_addr(), &secret);
        SERVERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(server);
        Ok(id)
    }

    /// The id of a store already running at `addr` with `secret`.
    pub fn from_parts(addr: SocketAddr, secret: &Secret) -> UniqueId {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..8].copy_from_slice(&MAGIC);
        b[8] = VERSION;
        b[PORT..PORT + 2].copy_from_slice(&addr.port().to_le_bytes());
        match addr {
            SocketAddr::V4(a) => {
                b[FAMILY] = 4;
                b[ADDR..ADDR + 4].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[FAMILY] = 6;
                b[ADDR..ADDR + 16].copy_from_slice(&a.ip().octets());
                b[SCOPE..SCOPE + 4].copy_from_slice(&a.scope_id().to_le_bytes());
                b[FLOW..FLOW + 4].copy_from_slice(&a.flowinfo().to_le_bytes());
            }
        }
        b[SECRET..SECRET + 32].copy_from_slice(secret.as_bytes());
        let sum = checksum(&b);
        b[CHECKSUM..].copy_from_slice(&sum);
        UniqueId { bytes: b }
    }

    /// Reads an id from its bytes, checking magic, version, address family, port, the zeroed
    /// reserved bytes and the checksum: anything else is [`Error::InvalidArgument`].
    pub fn from_bytes(bytes: &[u8; UNIQUE_ID_BYTES]) -> Result<UniqueId> {
        let bad = |why: &str| {
            Err(Error::InvalidArgument(format!(
                "not an oxccl unique id: {why}"
            )))
        };
        if bytes[..8] != MAGIC {
            return bad("bad magic");
        }
        if bytes[8] != VERSION {
            return bad(&format!(
                "version {} (this build reads version {VERSION})",
                bytes[8]
            ));
        }
        if checksum(bytes) != bytes[CHECKSUM..] {
            return bad("checksum mismatch (corrupted)");
        }
        if bytes[RESERVED..CHECKSUM].iter().any(|&b| b != 0) {
            return bad("reserved bytes are not zero");
        }
        match bytes[FAMILY] {
            4 if bytes[ADDR + 4..FLOW + 4].iter().all(|&b| b == 0) => {}
            4 => return bad("IPv4 address with IPv6 fields set"),
            6 => {}
            f => return bad(&format!("unknown address family {f}")),
        }
        let id = UniqueId { bytes: *bytes };
        if id.store_addr().port() == 0 {
            return bad("port 0");
        }
        Ok(id)
    }

    /// The 128 bytes to hand to the other ranks.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// The store's address.
    pub fn store_addr(&self) -> SocketAddr {
        let b = &self.bytes;
        let port = u16::from_le_bytes([b[PORT], b[PORT + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b[FAMILY] == 4 {
            let ip = Ipv4Addr::new(b[ADDR], b[ADDR + 1], b[ADDR + 2], b[ADDR + 3]);
            SocketAddr::V4(SocketAddrV4::new(ip, port))
        } else {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&b[ADDR..ADDR + 16]);
            let ip = Ipv6Addr::from(octets);
            SocketAddr::V6(SocketAddrV6::new(ip, port, u32_at(FLOW), u32_at(SCOPE)))
        }
    }

    /// The store's IP address.
    pub fn store_ip(&self) -> IpAddr {
        self.store_addr().ip()
    }

    /// The job secret.
    pub fn secret(&self) -> Secret {
        let mut s = [0u8; 32];
        s.copy_from_slice(&self.bytes[SECRET..SECRET + 32]);
        Secret::from_bytes(s)
    }

    /// Connects to the id's store (see [`TcpStore::connect`]).
    pub fn connect(&self, deadline: Instant) -> Result<TcpStore> {
        TcpStore::connect(self.store_addr(), &self.secret(), deadline)
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UniqueId")
            .field("store", &self.store_addr())
            .field("secret", &"..")
            .finish()
    }
}

fn checksum(b: &[u8; UNIQUE_ID_BYTES]) -> [u8; 8] {
    let digest = Sha256::digest(&b[..CHECKSUM]);
    let mut out = [0u8; 8];
    out.copy_from_slice(&digest[..8]);
    out
}
