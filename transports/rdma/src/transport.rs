//! [`RdmaTransport`]: picks this rank's device port and GID, then per peer meets it over an
//! authenticated TCP connection (the TCP transport's own handshake, under its own context),
//! trades queue-pair and ring facts there, and brings the queue pairs up.
//!
//! Why a TCP connection per peer rather than only keys in the bootstrap store: a reliable
//! connection needs facts from both ends of each pair (QP numbers exist once the pair's
//! queue pair does), the connection proves the peer knows the job's secret before any queue
//! pair is aimed at it (a stranger is refused there), and it stays open as the link's control
//! channel and as the fastest sign that the peer's process died (a closed socket, well before
//! the queue pair's retries run out). What goes through the store is the side connection's
//! address, published with every other endpoint.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_transport::auth::Secret;
use oxccl_transport::{Completion, Link, PeerInfo, Rank, Result, Transport, TransportError};
use oxccl_transport_tcp::{TcpConfig, TcpLink, TcpTransport};

use crate::device::{self, Choice, HcaFilter};
use crate::link::{Geometry, RdmaLink, WR_PROBE};
use crate::sys::{self, IbvWc};
use crate::verbs::{Device, Queue, Region, Remote};

/// The control message a side sends once its queue pair is ready to receive.
const READY: &[u8] = b"OXR1 ready";
/// Largest control message on the side connection (the transport contract's 4 KiB).
const SIDE_MAX_MESSAGE: usize = 4096;

/// Settings of one rank's RDMA transport.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// This process's rank.
    pub rank: Rank,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The job's secret; the side connections prove knowledge of it.
    pub secret: Secret,
    /// The address the side connections listen on (as the TCP transport's).
    pub bind_ip: IpAddr,
    /// Largest data message in bytes (at most 2^30); each link registers a receive ring and a
    /// staging area of twice this.
    pub max_message: usize,
    /// Distinguishes communicators sharing a secret.
    pub context: Vec<u8>,
    /// `OXCCL_IB_HCA`: which devices and ports may be used.
    pub hca: Option<HcaFilter>,
    /// `OXCCL_IB_GID_INDEX`: the GID table entry to use on a RoCE port.
    pub gid_index: Option<u8>,
}

/// One rank's RDMA transport: an open device port, then one [`RdmaLink`] per peer.
#[derive(Debug)]
pub struct RdmaTransport {
    cfg: RdmaConfig,
    dev: Arc<Device>,
    side: TcpTransport,
}

impl RdmaTransport {
    /// Finds the device port (sysfs, `hca`, `gid_index`) and opens it. Fails with
    /// [`TransportError::Unavailable`], saying what was found, when there is no usable device
    /// or libibverbs cannot be loaded.
    pub fn new(cfg: RdmaConfig) -> Result<RdmaTransport> {
        let choice = Self::choose(Path::new("/"), &cfg)?;
        let dev = Device::open(choice).map_err(TransportError::Unavailable)?;
        if cfg.max_message == 0 || cfg.max_message > 1 << 30 {
            return Err(TransportError::Unavailable(format!(
                "rdma: messages of {} bytes are outside 1 byte to 1 GiB",
                cfg.max_message
            )));
        }
        let side = TcpTransport::new(TcpConfig {
            rank: cfg.rank,
            nranks: cfg.nranks,
            secret: cfg.secret.clone(),
            bind_ip: cfg.bind_ip,
            max_message: SIDE_MAX_MESSAGE,
            context: [b"rdma/".as_slice(), &cfg.context].concat(),
        })?;
        tracing::debug!(rank = cfg.rank, device = ?dev, "rdma: device open");
        Ok(RdmaTransport { cfg, dev, side })
    }

    /// The port and GID `cfg` selects among the devices under `root` (sysfs).
    pub fn choose(root: &Path, cfg: &RdmaConfig) -> Result<Choice> {
        let ports = device::discover(root);
        device::choose(&ports, cfg.hca.as_ref(), cfg.gid_index)
            .map_err(|e| TransportError::Unavailable(format!("rdma: {e}")))
    }

    /// The port in use, for people: `rxe0:1 (RoCE, GID 1, eth0)`.
    pub fn describe(&self) -> String {
        let c = &self.dev.choice;
        let kind = if self.dev.is_roce() {
            format!("RoCE, GID {}", c.gid_index)
        } else {
            format!("InfiniBand, LID {}", self.dev.lid)
        };
        match &c.port.netdev {
            Some(n) => format!("{}:{} ({kind}, {n})", c.port.device, c.port.port),
            None => format!("{}:{} ({kind})", c.port.device, c.port.port),
        }
    }

    /// As [`Transport::connect`], returning the concrete links.
    pub fn connect_links(
        &mut self,
        peers: &[&PeerInfo],
        deadline: Instant,
    ) -> Result<Vec<RdmaLink>> {
        let me = self.cfg.rank;
        // The side connections go where each peer's rdma endpoint says.
        let fake: Vec<PeerInfo> = peers
            .iter()
            .map(|p| {
                let e = p.endpoint("rdma").ok_or_else(|| {
                    TransportError::Unavailable(format!(
                        "rdma: rank {} published no rdma endpoint",
                        p.rank
                    ))
                })?;
                Ok(PeerInfo {
                    rank: p.rank,
                    host: p.host.clone(),
                    endpoints: vec![("tcp".into(), e.to_vec())],
                })
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&PeerInfo> = fake.iter().collect();
        let sides = self.side.connect_links(&refs, deadline)?;
        let mut pairs = Vec::with_capacity(sides.len());
        for side in sides {
            pairs.push(Pair::new(&self.dev, side, self.cfg.max_message)?);
        }
        // Trade the facts, bring each queue pair up, then trade "ready".
        let mut out = Vec::new();
        loop {
            let mut waiting = Vec::new();
            for p in pairs.iter_mut() {
                p.step(&mut out)?;
                if !p.done() {
                    waiting.push(p.peer());
                }
            }
            if waiting.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(TransportError::Timeout(format!(
                    "rdma: rank {me} could not bring up queue pairs with ranks {waiting:?} in time"
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(pairs
            .into_iter()
            .map(|p| p.into_link(self.cfg.max_message))
            .collect())
    }
}

/// One peer's link while it is being brought up.
struct Pair {
    side: TcpLink,
    queue: Queue,
    ring: Region,
    staging: Region,
    psn: u32,
    rq_posted: u32,
    remote: Option<Remote>,
    peer_ready: bool,
    /// The probe write went out (after the peer's READY) and completed.
    probed: Option<bool>,
    early: Vec<Vec<u8>>,
    /// Completions taken while waiting for the probe's (the peer's own probe, or data from a
    /// peer already running), handed to the link.
    stash: Vec<IbvWc>,
    geometry: Geometry,
}

impl Pair {
    fn new(dev: &Arc<Device>, mut side: TcpLink, max_message: usize) -> Result<Pair> {
        let peer = side.peer();
        let fail = |e: String| TransportError::Unavailable(format!("{e} (link to rank {peer})"));
        let geometry = Geometry::new(max_message);
        let queue = Queue::new(dev, geometry.depths()).map_err(fail)?;
        let ring = Region::new(dev, geometry.cap as usize, true).map_err(fail)?;
        let staging = Region::new(dev, geometry.cap as usize, false).map_err(fail)?;
        let mut rq_posted = 0;
        RdmaLink::fill_receives(&queue, &mut rq_posted, geometry.depths().recv).map_err(fail)?;
        let mut r = [0u8; 4];
        getrandom::fill(&mut r)
            .map_err(|e| fail(format!("rdma: draw a packet sequence number: {e}")))?;
        let psn = u32::from_le_bytes(r) & 0xff_ffff;
        let mine = Remote {
            gid: dev.gid.0,
            global: dev.is_roce(),
            lid: dev.lid,
            qpn: queue.qpn,
            psn,
            mtu: dev.mtu,
            ring_addr: ring.ptr() as u64,
            ring_rkey: ring.reg.rkey,
            ring_len: geometry.cap,
            slot: geometry.slot as u32,
        };
        side.post_control(&mine.encode())?;
        Ok(Pair {
            side,
            queue,
            ring,
            staging,
            psn,
            rq_posted,
            remote: None,
            peer_ready: false,
            probed: None,
            early: Vec::new(),
            stash: Vec::new(),
            geometry,
        })
    }

    fn peer(&self) -> Rank {
        self.side.peer()
    }

    fn done(&self) -> bool {
        self.remote.is_some()
            && self.peer_ready
            && self.probed == Some(true)
            && !self.side.control_pending()
    }

    /// Posts the probe once the peer's queue pair is up, and looks for its completion: the
    /// fabric really carries this pair's traffic (READY only proves the TCP path).
    fn probe(&mut self) -> Result<()> {
        let peer = self.peer();
        let (Some(remote), true) = (&self.remote, self.peer_ready) else {
            return Ok(());
        };
        if self.probed.is_none() {
            RdmaLink::post_probe(&self.queue, remote).map_err(|e| {
                TransportError::Unavailable(format!("rdma: {e} (link to rank {peer})"))
            })?;
            self.probed = Some(false);
        }
        let mut wc = [IbvWc::default(); 16];
        // SAFETY: the CQ is live and `wc` has room for 16 entries.
        let n = unsafe { self.queue.dev.v.poll_cq(self.queue.cq, 16, wc.as_mut_ptr()) };
        for w in &wc[..n.max(0) as usize] {
            if (w.wr_id == WR_PROBE && w.opcode == sys::IBV_WC_RDMA_WRITE) || w.status != 0 {
                if w.status != sys::IBV_WC_SUCCESS {
                    if self.side.peer_closed() {
                        return Err(TransportError::PeerClosed { peer });
                    }
                    return Err(TransportError::Unavailable(format!(
                        "rdma: rank {peer} is not reachable over rdma from {}: the probe write failed: {} (status {}); check OXCCL_IB_HCA and OXCCL_IB_GID_INDEX on both ranks",
                        self.describe_local(),
                        sys::wc_status_name(w.status),
                        w.status
                    )));
                }
                self.probed = Some(true);
            } else {
                self.stash.push(*w);
            }
        }
        Ok(())
    }

    fn describe_local(&self) -> String {
        format!("{:?}", self.queue.dev)
    }

    fn step(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let peer = self.peer();
        out.clear();
        self.side.poll(out)?;
        if self.side.peer_closed() && !self.done() {
            return Err(TransportError::PeerClosed { peer });
        }
        for c in out.drain(..) {
            let Completion::Control(b) = c else {
                continue;
            };
            if self.remote.is_none() {
                let r = Remote::decode(&b).ok_or_else(|| TransportError::Protocol {
                    peer,
                    what: format!("rdma: unreadable queue-pair facts ({} bytes)", b.len()),
                })?;
                if (u64::from(r.slot), r.ring_len) != (self.geometry.slot, self.geometry.cap) {
                    return Err(TransportError::Protocol {
                        peer,
                        what: format!(
                            "rdma: its receive ring ({} bytes in slots of {}) differs from this side's ({} in {}): do the ranks agree on OXCCL_SLICE_BYTES?",
                            r.ring_len, r.slot, self.geometry.cap, self.geometry.slot
                        ),
                    });
                }
                self.queue.connect(&r, self.psn).map_err(|e| {
                    TransportError::Unavailable(format!("{e} (link to rank {peer})"))
                })?;
                self.remote = Some(r);
                self.side.post_control(READY)?;
            } else if !self.peer_ready && b == READY {
                self.peer_ready = true;
            } else if self.peer_ready {
                // The peer is already running and has something to say: keep it for the link.
                self.early.push(b);
            } else {
                return Err(TransportError::Protocol {
                    peer,
                    what: "rdma: unexpected message while bringing the queue pair up".into(),
                });
            }
        }
        self.probe()
    }

    fn into_link(self, max_message: usize) -> RdmaLink {
        let peer = self.side.peer();
        RdmaLink::new(
            peer,
            max_message,
            self.side,
            self.queue,
            self.ring,
            self.staging,
            self.remote.expect("connected"),
            self.rq_posted,
            self.early,
            self.stash,
            self.geometry,
        )
    }
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn listen(&mut self) -> Result<Vec<u8>> {
        self.side.listen()
    }

    fn can_connect(&self, me: &PeerInfo, peer: &PeerInfo) -> bool {
        me.endpoint("rdma").is_some() && peer.endpoint("rdma").is_some()
    }

    fn connect(&mut self, peers: &[&PeerInfo], deadline: Instant) -> Result<Vec<Box<dyn Link>>> {
        Ok(self
            .connect_links(peers, deadline)?
            .into_iter()
            .map(|l| Box::new(l) as Box<dyn Link>)
            .collect())
    }
}
