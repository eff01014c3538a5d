//! [`ShmTransport`]: shared-memory links between ranks of one host. Each rank listens on an
//! abstract Unix socket named after the communicator; peers meet there, authenticate with the
//! job secret, and hand each other their incoming ring segments and doorbells.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_transport::auth::Secret;
use oxccl_transport::{Link, PeerInfo, Rank, Result, Transport, TransportError};

use crate::area::{Area, AreaSegment};
use crate::cma::Process;
use crate::link::{RingMem, ShmLink};
use crate::setup;

/// How a rank's shared-memory transport is set up.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// This rank.
    pub rank: Rank,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The job secret.
    pub secret: Secret,
    /// Distinguishes communicators (part of the socket name and the authentication context).
    pub context: Vec<u8>,
    /// Largest message (the slice size): the slot size.
    pub max_message: usize,
    /// Slots per ring (at least 2: one lent while the next arrives).
    pub slots: usize,
}

/// The shared-memory transport of one rank.
#[derive(Debug)]
pub struct ShmTransport {
    cfg: ShmConfig,
    tag: String,
    listener: Option<UnixListener>,
    bell: Arc<OwnedFd>,
    areas: AreaSet,
}

/// The area segments this rank has mapped — its own and its peers' — filled in by `connect`;
/// a handle that outlives boxing the transport.
#[derive(Clone, Debug)]
pub struct AreaSet(Arc<std::sync::Mutex<Vec<Option<AreaPeer>>>>);

/// One rank's area as this rank sees it.
#[derive(Clone, Debug)]
struct AreaPeer {
    seg: Arc<AreaSegment>,
    /// Its process held by a pidfd, where one could be opened (none for this rank).
    process: Option<Arc<Process>>,
    /// Whether this rank can read its memory directly.
    readable: bool,
}

impl AreaSet {
    /// The group area, if this rank reached every rank of the communicator over shared memory.
    pub fn group(&self, rank: Rank) -> Option<Area> {
        let peers = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let all: Option<Vec<AreaPeer>> = peers.iter().cloned().collect();
        all.filter(|a| a.len() > 1).map(|a| {
            let readable = a.iter().map(|p| p.readable).collect();
            let processes = a.iter().map(|p| p.process.clone()).collect();
            Area::new(
                rank,
                a.into_iter().map(|p| p.seg).collect(),
                processes,
                readable,
            )
        })
    }
}

impl ShmTransport {
    /// Creates the transport (and this rank's doorbell).
    pub fn new(cfg: ShmConfig) -> Result<ShmTransport> {
        if cfg.slots < 2 {
            return Err(TransportError::Unavailable(
                "shm: a ring needs at least 2 slots".into(),
            ));
        }
        let bell = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| TransportError::io("shm: create the doorbell", e.into()))?;
        let material = [cfg.secret.as_bytes().as_slice(), b"/", &cfg.context].concat();
        let tag = Secret::derive(&material).to_hex()[..20].to_string();
        let mine = AreaSegment::create()
            .map_err(|e| TransportError::io("shm: create the group area", e))?;
        let mut segs = vec![None; cfg.nranks];
        if let Some(s) = segs.get_mut(cfg.rank) {
            *s = Some(AreaPeer {
                seg: Arc::new(mine),
                process: None,
                readable: true,
            });
        }
        let areas = AreaSet(Arc::new(std::sync::Mutex::new(segs)));
        Ok(ShmTransport {
            cfg,
            tag,
            listener: None,
            bell: Arc::new(bell),
            areas,
        })
    }

    /// A handle on the group area segments (complete after `connect`).
    pub fn areas(&self) -> AreaSet {
        self.areas.clone()
    }

    /// Connects one authenticated socket to `peer` and builds the link.
    fn link(
        &self,
        mut sock: std::os::unix::net::UnixStream,
        peer: Rank,
        deadline: Instant,
    ) -> Result<ShmLink> {
        let cfg = &self.cfg;
        let inbound = RingMem::create(cfg.slots, cfg.max_message)
            .map_err(|e| TransportError::io(format!("shm: create the ring from rank {peer}"), e))?;
        let mine = self.areas.0.lock().unwrap_or_else(|p| p.into_inner())[cfg.rank]
            .as_ref()
            .map(|p| p.seg.clone())
            .ok_or_else(|| TransportError::Unavailable("shm: no area of this rank".into()))?;
        let ex = setup::exchange(
            &mut sock,
            inbound.fd().as_fd(),
            self.bell.as_fd(),
            mine.fd().as_fd(),
            peer,
            deadline,
        )?;
        let area = AreaSegment::open(ex.area).map_err(|e| TransportError::Protocol {
            peer,
            what: format!("its area segment is unusable: {e}"),
        })?;
        if let Some(slot) = self
            .areas
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(peer)
        {
            *slot = Some(AreaPeer {
                seg: Arc::new(area),
                process: ex.process.clone(),
                readable: ex.we_read_peer,
            });
        }
        let outbound = RingMem::open(ex.segment).map_err(|e| TransportError::Protocol {
            peer,
            what: format!("its ring segment is unusable: {e}"),
        })?;
        if outbound.slot_bytes() < cfg.max_message {
            return Err(TransportError::Protocol {
                peer,
                what: format!(
                    "its slots hold {} bytes but messages here are up to {} (mismatched slice sizes?)",
                    outbound.slot_bytes(),
                    cfg.max_message
                ),
            });
        }
        if !ex.peer_reads_us {
            tracing::debug!(
                rank = cfg.rank,
                peer,
                "shm: the peer cannot read our memory; copying every message"
            );
        }
        ShmLink::new(
            peer,
            cfg.max_message,
            inbound,
            outbound,
            ex.process.filter(|_| ex.we_read_peer),
            ex.bell,
            self.bell.clone(),
            sock,
            ex.peer_reads_us,
        )
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    /// Listens on an abstract socket whose name ends in 64 random bits: published only once
    /// it is bound (through the store), it cannot be taken first by another local user to
    /// make this rank's start fail (a name taken anyway is replaced by a fresh one).
    fn listen(&mut self) -> Result<Vec<u8>> {
        let mut last = None;
        for _ in 0..4 {
            let random = oxccl_transport::auth::random_bytes()?;
            let mut name = setup::socket_name(&self.tag, self.cfg.rank);
            name.extend(
                format!(
                    "-{:016x}",
                    u64::from_le_bytes(random[..8].try_into().expect("8 bytes"))
                )
                .bytes(),
            );
            match setup::listen(&name) {
                Ok(l) => {
                    self.listener = Some(l);
                    return Ok(name);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => return Err(TransportError::io("shm: listen", e)),
            }
        }
        Err(TransportError::io(
            "shm: listen (every name tried was taken)",
            last.unwrap_or_else(|| std::io::Error::other("no name")),
        ))
    }

    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        me.host == peer.host && me.endpoint("shm").is_some() && peer.endpoint("shm").is_some()
    }

    fn connect(&mut self, peers: &[&PeerInfo], deadline: Instant) -> Result<Vec<Box<dyn Link>>> {
        let me = self.cfg.rank;
        let handshake = Duration::from_secs(2);
        let mut links: Vec<Option<ShmLink>> = peers.iter().map(|_| None).collect();
        // Connect to lower ranks, accept from higher ones (as TCP does).
        for (i, p) in peers.iter().enumerate().filter(|(_, p)| p.rank < me) {
            let name = p.endpoint("shm").ok_or_else(|| {
                TransportError::Unavailable(format!("shm: rank {} has no endpoint", p.rank))
            })?;
            let mut s = setup::connect(name, deadline)?;
            // One deadline for the handshake and the hand-over that follows.
            let by = Instant::now() + handshake;
            setup::authenticate(
                &mut s,
                &self.cfg.secret,
                &self.cfg.context,
                me,
                true,
                Some(p.rank),
                by,
            )?;
            links[i] = Some(self.link(s, p.rank, by)?);
        }
        let mut missing: Vec<Rank> = peers
            .iter()
            .filter(|p| p.rank > me)
            .map(|p| p.rank)
            .collect();
        if !missing.is_empty() {
            let listener = self
                .listener
                .as_ref()
                .ok_or_else(|| TransportError::Unavailable("shm: listen first".into()))?;
            while !missing.is_empty() {
                let Some(mut s) = setup::accept(listener, deadline)? else {
                    return Err(TransportError::Timeout(format!(
                        "shm: ranks {missing:?} never connected"
                    )));
                };
                let by = Instant::now() + handshake;
                let peer = match setup::authenticate(
                    &mut s,
                    &self.cfg.secret,
                    &self.cfg.context,
                    me,
                    false,
                    None,
                    by,
                ) {
                    Ok(p) if missing.contains(&p) => p,
                    Ok(p) => {
                        tracing::warn!(
                            rank = me,
                            "shm: refused a connection claiming rank {p}, which is not expected"
                        );
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(rank = me, "shm: refused a connection: {e}");
                        continue;
                    }
                };
                missing.retain(|&m| m != peer);
                let i = peers
                    .iter()
                    .position(|p| p.rank == peer)
                    .expect("expected peer");
                links[i] = Some(self.link(s, peer, by)?);
            }
        }
        self.listener = None;
        Ok(links
            .into_iter()
            .map(|l| Box::new(l.expect("every peer connected")) as Box<dyn Link>)
            .collect())
    }
}
