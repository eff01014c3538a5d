//! Making a communicator: build the allowed transports, publish this rank's endpoints through
//! the store, read everyone else's, give each peer the first transport that can reach it,
//! connect, and wait until every rank is connected. Every wait has the configured deadline.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxccl_transport::auth::Secret;
use oxccl_transport::loopback::{Hub, LoopbackTransport};
use oxccl_transport::{Link, PeerInfo, Transport};
use oxccl_transport_rdma::device::HcaFilter;
use oxccl_transport_rdma::{RdmaConfig, RdmaTransport};
use oxccl_transport_shm::{AreaSet, ShmConfig, ShmTransport};
use oxccl_transport_tcp::{TcpConfig, TcpTransport};

use super::liveness::{self, Liveness};
use super::{Background, Communicator, Inner, State, tuning};
use crate::algo::Hosts;
use crate::bootstrap::{PrefixStore, Store, StoreServer, iface};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::area::AreaPath;
use crate::exec::descriptor;
use crate::exec::driver::Engine;
use crate::exec::flags::Flags;
use crate::topo::{self, Topology, discover};
use crate::tune::{self, LinkKind};
use crate::types::Rank;

/// How a communicator finds its peers: the store, its namespace in it, the job secret, and for
/// ranks inside one process the loopback hub. A clone shares the store server.
#[derive(Clone)]
pub(crate) struct Boot {
    store: Arc<dyn Store>,
    prefix: String,
    secret: Secret,
    hub: Option<Arc<Hub>>,
    store_addr: Option<SocketAddr>,
    /// The store server this rank hosts, kept alive as long as any communicator using it.
    _server: Option<Arc<StoreServer>>,
}

impl Boot {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        prefix: String,
        secret: Secret,
        hub: Option<Arc<Hub>>,
        store_addr: Option<SocketAddr>,
        server: Option<Arc<StoreServer>>,
    ) -> Boot {
        Boot {
            store,
            prefix,
            secret,
            hub,
            store_addr,
            _server: server,
        }
    }

    /// Called as a communicator goes: if this rank hosts the store and nothing else keeps
    /// it, waits (at most `bound`, 10 s at most) until every one of the `size` ranks has
    /// finished its setup, whose last store calls may still be under way, before the server
    /// stops with this `Boot`.
    pub(crate) fn let_go(&self, size: usize, bound: Duration) {
        let Some(server) = &self._server else {
            return;
        };
        if Arc::strong_count(server) > 1 {
            return; // a split of this communicator keeps it
        }
        let store = PrefixStore::new(self.store.clone(), self.prefix.clone());
        let until = Instant::now() + bound.min(Duration::from_secs(10));
        let mut pause = Duration::from_micros(100);
        loop {
            match store.add(SETUP_DONE, 0) {
                Ok(n) if n >= size as i64 => return,
                Ok(_) if Instant::now() < until => {}
                _ => return,
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Rank `rank`'s creation failed with `e`: where it had not published its connection
    /// information yet (`published`), a record saying so in its place, so that the others
    /// fail naming it instead of waiting for it; then it counts as done with its setup, and a
    /// rank that hosts the store waits (at most `linger`) for the others to be done too, so
    /// that they read what they need before the store goes. Best effort: a store that fails
    /// leaves the error as it was.
    fn failed(&self, rank: Rank, size: usize, e: &Error, published: bool, linger: Duration) {
        // Not where the store itself failed or did not answer in time (or a rank never came,
        // which no record helps): each request could take the whole timeout again.
        if matches!(e, Error::Bootstrap(_) | Error::Timeout { .. }) {
            return;
        }
        let store = PrefixStore::new(self.store.clone(), self.prefix.clone());
        if !published && rank < size {
            let mut record = FAILED.to_vec();
            record.extend(e.to_string().bytes().take(2000));
            let _ = store.set(&format!("peer/{rank}"), &record);
        }
        let _ = store.add(SETUP_DONE, 1);
        self.let_go(size, linger);
    }

    /// The same store and secret, in a sub-namespace (for split communicators).
    pub(crate) fn child(&self, name: &str) -> Boot {
        Boot {
            prefix: format!("{}/{name}", self.prefix),
            ..self.clone()
        }
    }
}

/// Slots per shared-memory ring: one can stay lent while the next arrives, and a couple more
/// let small messages queue.
const SHM_SLOTS: usize = 4;

/// The version of what connected ranks say to each other (descriptors, notices, the group
/// area's layout), published at setup as the endpoint `wire`: every rank of a job must run a
/// build that speaks the same. 2 since 2026-12-05 (point-to-point messages carry descriptors
/// of their own; builds before published none); 3 later that day (a mismatch notice carries
/// the call its sender received too); 4 later still (each rank publishes the settings that
/// choose routes, which must agree; descriptors through the group area name the way).
const WIRE: u32 = 4;

/// Fails unless every rank in `infos` speaks this build's [`WIRE`], naming the first that
/// does not.
fn check_wire(rank: Rank, infos: &[PeerInfo]) -> Result<()> {
    for info in infos {
        let theirs = info
            .endpoint("wire")
            .map(|b| <[u8; 4]>::try_from(b).ok().map(u32::from_le_bytes));
        if theirs != Some(Some(WIRE)) {
            let theirs = match theirs {
                None => "older than 2".to_string(),
                Some(Some(v)) => v.to_string(),
                Some(None) => "unreadable".to_string(),
            };
            return Err(Error::Bootstrap(format!(
                "rank {rank}: rank {} runs an oxccl build whose wire protocol is {theirs}, this \
                 rank's is {WIRE}: every rank of a job must run the same oxccl",
                info.rank
            )));
        }
    }
    Ok(())
}

/// Fails if rank `info.rank` was made a member of a communicator of another size (a rank that
/// publishes none, of an older build, is caught by the wire check).
fn check_size(rank: Rank, size: usize, info: &PeerInfo) -> Result<()> {
    let theirs = info
        .endpoints
        .iter()
        .find(|e| e.0 == "size")
        .and_then(|e| <[u8; 8]>::try_from(e.1.as_slice()).ok())
        .map(u64::from_le_bytes);
    match theirs {
        Some(n) if n != size as u64 => Err(Error::InvalidArgument(format!(
            "rank {rank}: creation: rank {} was given {n} ranks, this rank {size}: every rank \
             must pass the same nranks",
            info.rank
        ))),
        _ => Ok(()),
    }
}

/// This rank's [`Config::routing_settings`] as published at setup: a `variable=value` line
/// each, `OXCCL_TOPO_FILE` given as a digest of the topology it holds (or `unset`).
fn settings_text(config: &Config, fixture: Option<&Topology>) -> String {
    let mut text = String::new();
    let topo = fixture.map_or("unset".to_string(), |t| {
        // FNV-1a: the same on every build, unlike std's hasher.
        let digest = t.to_json().bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("a topology of digest {digest:016x}")
    });
    for (var, value) in config
        .routing_settings()
        .into_iter()
        .chain([("OXCCL_TOPO_FILE", topo)])
    {
        text += &format!("{var}={value}\n");
    }
    text
}

/// Fails if rank `info.rank` runs with other settings that choose routes than this rank's
/// (`ours`, from [`settings_text`]), naming the first that differs and both values.
fn check_settings(rank: Rank, ours: &str, info: &PeerInfo) -> Result<()> {
    if info.rank == rank {
        return Ok(());
    }
    let theirs = info
        .endpoint("settings")
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    let value = |text: &str, var: &str| {
        text.lines()
            .find_map(|l| l.split_once('=').filter(|(v, _)| *v == var).map(|p| p.1))
            .map(str::to_string)
    };
    for line in ours.lines() {
        let Some((var, mine)) = line.split_once('=') else {
            continue;
        };
        let other = value(&theirs, var);
        if other.as_deref() != Some(mine) {
            let other = other.unwrap_or_else(|| "nothing (not published)".into());
            return Err(Error::InvalidArgument(format!(
                "rank {rank}: creation: rank {} runs with {var}={other}, this rank with \
                 {var}={mine}: every rank of a communicator must share the settings that choose \
                 how calls travel (oxccl's version, OXCCL_ALGO, OXCCL_TRANSPORTS, \
                 OXCCL_SLICE_BYTES, OXCCL_SCRATCH_SLOTS, whether OXCCL_DIRECT_MIN or _MAX is set, \
                 OXCCL_DIRECT_COPY_MIN, OXCCL_AREA_WAY, OXCCL_TOPO_FILE's topology)",
                info.rank
            )));
        }
    }
    Ok(())
}

/// A wait at creation for what rank `peer` publishes that failed: where the store says the
/// key was not set by the deadline, an [`Error::Timeout`] naming the rank that never came (its
/// process did not start or create the communicator, or was given another unique id);
/// otherwise (a store that failed, or this rank's own key) what the store said.
fn joined_late(
    e: Error,
    rank: Rank,
    size: usize,
    peer: Rank,
    deadline: Instant,
    timeout: Duration,
) -> Error {
    if Instant::now() < deadline || peer == rank || crate::bootstrap::missing_key(&e).is_none() {
        return e;
    }
    tracing::debug!(rank, peer, "creation: {e}");
    Error::Timeout {
        rank,
        op: format!(
            "communicator creation ({size} ranks; a rank that never joins did not start, or was \
             given another unique id or rank)"
        ),
        peer: Some(peer),
        after: timeout,
    }
}

/// A creation that timed out waiting for its peers, told which ranks more than one process
/// created in this store: each creation of rank r counts `world/generation/r` up and joins
/// the ranks of the same count (`comm::generation`), so a process given a rank another
/// process already has waits among ranks that never come, and the rank it should have had
/// never joins. Counted only where the prefix is such a generation and for up to 1024 ranks
/// (one store request each); a store that does not answer leaves the error as it was.
fn claimed_twice(mut e: Error, boot: &Boot, size: usize) -> Error {
    let Error::Timeout { rank, op, .. } = &mut e else {
        return e;
    };
    let rank = *rank;
    let mine = boot
        .prefix
        .strip_prefix("world/")
        .and_then(|g| g.parse::<i64>().ok());
    let counts: Option<Vec<i64>> = mine.filter(|_| size <= 1024).and_then(|_| {
        (0..size)
            .map(|r| boot.store.add(&format!("world/generation/{r}"), 0).ok())
            .collect()
    });
    let (Some(mine), Some(counts)) = (mine, counts) else {
        return e;
    };
    // A rank (this one too) created again while this creation waited (a second process given
    // that rank, or one that retried alone), or this creation ahead of every other rank's
    // (this process is the second given its rank). Everybody at one count is a clean
    // recreation.
    let ahead: Vec<String> = counts
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c > mine)
        .map(|(r, c)| format!("rank {r} was created {c} times"))
        .take(8)
        .collect();
    let others = counts
        .iter()
        .enumerate()
        .filter(|&(r, _)| r != rank)
        .map(|(_, &c)| c)
        .max()
        .unwrap_or(0);
    if !ahead.is_empty() {
        op.push_str(&format!(
            "; {} in this job's store while this is creation {mine} of rank {rank}: was \
             another process given that rank?",
            ahead.join(", ")
        ));
    } else if mine > 1 && others < mine {
        op.push_str(&format!(
            "; this is creation {mine} of rank {rank} in this job's store, and no other rank \
             was created more than {others} times: was another process given rank {rank}?"
        ));
    }
    e
}

/// Connects rank `rank` of `size` and returns its communicator.
///
/// A rank whose creation fails says so in the store where the others look for it: before it
/// published its connection information, in that key (the others fail at once, naming it and
/// its reason, where they waited for it until the deadline); and a rank that hosts the store
/// keeps it up a little longer (at most 2 s) for the others to find out, where they were told
/// the store closed.
pub(crate) fn init(boot: Boot, rank: Rank, size: usize, config: Config) -> Result<Communicator> {
    let keeper = boot.clone();
    let linger = config.timeout.min(Duration::from_secs(2));
    let mut published = false;
    let result = init_inner(boot, rank, size, config, &mut published);
    if let Err(e) = &result {
        keeper.failed(rank, size, e, published, linger);
    }
    result
}

/// Marks a `peer/{rank}` record that says the rank's creation failed (its reason follows);
/// connection information never starts with it.
const FAILED: &[u8] = b"\0oxccl creation failed\0";

fn init_inner(
    boot: Boot,
    rank: Rank,
    size: usize,
    config: Config,
    published: &mut bool,
) -> Result<Communicator> {
    config.validate()?;
    if size == 0 || size > crate::MAX_RANKS || rank >= size {
        return Err(Error::InvalidArgument(format!(
            "rank {rank}: creation: a communicator of {size} ranks (1 to {} ranks, each \
             below the size)",
            crate::MAX_RANKS
        )));
    }
    let deadline = Instant::now() + config.timeout;
    let store = PrefixStore::new(boot.store.clone(), boot.prefix.clone());
    let host = topo::host_id(config.host_id.as_deref());
    let max_message = config.slice_bytes.max(descriptor::LEN);
    let (mut transports, areas, rdma) = transports(&boot, rank, size, &config, max_message)?;

    let mut endpoints = Vec::new();
    for t in transports.iter_mut() {
        let e = t
            .listen()
            .map_err(|e| transport_error(rank, format!("listen on {}", t.name()), e))?;
        endpoints.push((t.name().to_string(), e));
    }
    // Heartbeats, except between threads of one process (which cannot vanish apart): on the
    // address the TCP transport publishes, else loopback (every peer is on this host).
    let heartbeat = match (config.heartbeat, &boot.hub) {
        (Some(period), None) => {
            let ip = endpoints
                .iter()
                .find(|e| e.0 == "tcp" || e.0 == "rdma")
                .and_then(|e| oxccl_transport_tcp::decode_endpoint(&e.1))
                .map(|a| a.ip())
                .filter(|ip| !ip.is_unspecified())
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            let io = |what: String| move |source| Error::Io { what, source };
            let socket = liveness::bind(ip).map_err(io(format!(
                "rank {rank}: bind the heartbeat socket on {ip}"
            )))?;
            let addr = socket
                .local_addr()
                .map_err(io(format!("rank {rank}: the heartbeat socket's address")))?;
            endpoints.push(("hb".into(), liveness::endpoint(addr, period)));
            Some((socket, period))
        }
        _ => None,
    };
    // Which process this rank is in: ranks of one process share device memory directly.
    endpoints.push(("proc".into(), process_token().to_vec()));
    endpoints.push(("wire".into(), WIRE.to_le_bytes().to_vec()));
    // The size this rank was given, so that a rank given another one is named at once.
    endpoints.push(("size".into(), (size as u64).to_le_bytes().to_vec()));
    // The settings that choose routes, which every rank must share; a topology fixture is
    // loaded now, so that a rank whose file differs is named here instead of the others
    // waiting for the topology it does not publish.
    let fixture = config
        .topo_file
        .as_deref()
        .map(Topology::load)
        .transpose()?;
    let settings = settings_text(&config, fixture.as_ref());
    endpoints.push(("settings".into(), settings.clone().into_bytes()));
    let me = PeerInfo {
        rank,
        host,
        endpoints,
    };
    store.set(&format!("peer/{rank}"), &me.encode())?;
    *published = true;
    let mut infos = Vec::with_capacity(size);
    for r in 0..size {
        let bytes = store.get(&format!("peer/{r}"), deadline).map_err(|e| {
            claimed_twice(
                joined_late(e, rank, size, r, deadline, config.timeout),
                &boot,
                size,
            )
        })?;
        if let Some(why) = bytes.strip_prefix(FAILED) {
            return Err(Error::PeerFailed {
                rank,
                peer: r,
                op: format!("communicator creation ({size} ranks)"),
                cause: format!("its own creation failed: {}", String::from_utf8_lossy(why)),
            });
        }
        let info = PeerInfo::decode(&bytes)
            .filter(|i| i.rank == r)
            .ok_or_else(|| {
                Error::Bootstrap(format!(
                    "rank {rank}: rank {r} published unreadable connection information"
                ))
            })?;
        check_size(rank, size, &info)?;
        infos.push(info);
    }
    check_wire(rank, &infos)?;
    for info in &infos {
        check_settings(rank, &settings, info)?;
    }

    let topo = topology(
        &boot, &store, &config, rank, &infos, rdma, deadline, fixture,
    )?;

    // Each peer gets the first allowed transport that can reach it.
    let mut assigned: Vec<Vec<&PeerInfo>> = vec![Vec::new(); transports.len()];
    let mut link_names = vec![None; size];
    for p in infos.iter().filter(|p| p.rank != rank) {
        let t = transports
            .iter()
            .position(|t| t.can_connect(&me, p))
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "rank {rank}: no allowed transport reaches rank {} (ours: {:?}; theirs: {:?})",
                    p.rank,
                    me.endpoints.iter().map(|e| &e.0).collect::<Vec<_>>(),
                    p.endpoints.iter().map(|e| &e.0).collect::<Vec<_>>()
                ))
            })?;
        assigned[t].push(p);
        link_names[p.rank] = Some(transports[t].name());
    }
    let mut links: Vec<Option<Box<dyn Link>>> = (0..size).map(|_| None).collect();
    for (t, peers) in transports.iter_mut().zip(&assigned) {
        if peers.is_empty() {
            continue;
        }
        let connected = t
            .connect(peers, deadline)
            .map_err(|e| transport_error(rank, format!("connect over {}", t.name()), e))?;
        for (p, link) in peers.iter().zip(connected) {
            links[p.rank] = Some(link);
        }
    }

    // Nobody starts before everybody is connected: a rank that failed to connect shows up
    // here, by name, instead of as a timeout in the first collective.
    // Each rank also says whether it can read all its peers' memory directly; the group
    // area's direct path needs every rank to agree.
    let group = areas
        .filter(|_| {
            link_names
                .iter()
                .enumerate()
                .all(|(r, n)| r == rank || *n == Some("shm"))
        })
        .and_then(|a| a.group(rank));
    let direct = group.as_ref().is_some_and(|a| a.direct());
    if rank == 0 {
        // A probe needs the area and one host (a fixture that spreads the ranks over hosts
        // gives the tuner no area); the caches are named after the first host's label.
        let one_host = Hosts::from_labels(&topo.hosts).count() == 1;
        let area = group.is_some() && one_host;
        tuning::hand_out(&store, &config, (&topo.hosts[0], size), area)?;
    }
    // And whether it is crowded (shares its cores with more ranks than they are): the area's
    // ring is wider where any rank is, for that rank's longer lag.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let crowded = topo.crowded(rank, cores);
    // And which kinds of links it has to peers on its host and on others, from which every
    // rank takes the same (the lowest rank's that has one): the tuner prices schedules by
    // them, and ranks that priced with different kinds (RDMA on some hosts only) could pick
    // different routes for one call.
    let hosts = Hosts::from_labels(&topo.hosts);
    let local = link_kind(&link_names, &hosts, rank, true).or_else(|| {
        // Alone on its host: what the others there would use.
        me.endpoints
            .iter()
            .any(|e| e.0 == "shm")
            .then_some(LinkKind::Shm)
    });
    let remote = link_kind(&link_names, &hosts, rank, false);
    let kind_code = |k: Option<LinkKind>| k.map_or(b'-', |k| k.name().as_bytes()[0]);
    let ready = [
        if direct { b'd' } else { b'1' },
        if crowded { b'c' } else { b'-' },
        kind_code(local),
        kind_code(remote),
    ];
    store.set(&format!("ready/{rank}"), &ready)?;
    let keys: Vec<String> = (0..size).map(|r| format!("ready/{r}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait(&keys, deadline).map_err(|e| {
        // The rank whose key was missing, as the other creation waits name it.
        match crate::bootstrap::missing_key(&e)
            .and_then(|k| k.rsplit_once("ready/")?.1.parse::<Rank>().ok())
            .filter(|&r| r < size)
        {
            Some(r) => joined_late(e, rank, size, r, deadline, config.timeout),
            None => e,
        }
    })?;
    let (costs, then) = tuning::take(&store, rank, deadline)?;
    let (mut everyone_direct, mut anyone_crowded) = (direct, crowded);
    let (mut job_local, mut job_remote) = (None, None);
    let kind_of = |code: Option<&u8>| {
        LinkKind::ALL
            .into_iter()
            .find(|k| Some(&k.name().as_bytes()[0]) == code)
    };
    // Without an area only the link kinds are wanted, usually all in rank 0's key: a job of
    // many ranks over several hosts makes one request here, not one per rank.
    let one_host = hosts.count() == 1;
    for k in &keys {
        if group.is_none() && job_local.is_some() && (job_remote.is_some() || one_host) {
            break;
        }
        let v = store.get(k, deadline)?;
        if group.is_some() {
            everyone_direct &= v.first() == Some(&b'd');
            anyone_crowded |= v.get(1) == Some(&b'c');
        }
        job_local = job_local.or_else(|| kind_of(v.get(2)));
        job_remote = job_remote.or_else(|| kind_of(v.get(3)));
    }

    // The group area serves when every peer is reached over shared memory.
    let area = group.map(|a| {
        let a = if anyone_crowded { a.widened() } else { a };
        AreaPath::new(a, rank, everyone_direct, crowded)
    });
    let flags = Arc::new(Flags::new());
    let liveness = match heartbeat {
        Some((socket, period)) => {
            let peers: Vec<(Rank, SocketAddr, Duration)> = liveness::neighbours(rank, size)
                .into_iter()
                .filter_map(|p| {
                    let (a, d) = infos[p].endpoint("hb").and_then(liveness::parse_endpoint)?;
                    Some((p, a, d))
                })
                .collect();
            let beat = peers.iter().map(|p| p.2).fold(period, std::cmp::min);
            let seal = liveness::Seal::new(boot.secret.as_bytes(), liveness::tag(&boot.prefix));
            let peers = peers.into_iter().map(|(p, a, _)| (p, a)).collect();
            let l = Liveness::start(rank, socket, peers, (period, beat), seal, flags.clone())
                .map_err(|e| Error::Io {
                    what: format!("rank {rank}: start the heartbeat thread"),
                    source: e,
                })?;
            Some(l)
        }
        None => None,
    };
    let engine = Engine::new(rank, links, config.timeout, flags.clone()).crowded(crowded);
    let slice_bytes = config.slice_bytes.min(engine.max_message());
    // Every rank in this process: its device group (found by the communicator's identity).
    #[cfg(feature = "cuda")]
    let native = infos
        .iter()
        .all(|i| i.endpoint("proc") == Some(&process_token()[..]))
        .then(|| {
            let mut key = boot.prefix.as_bytes().to_vec();
            key.push(0);
            key.extend_from_slice(boot.secret.as_bytes());
            super::native::DeviceGroup::join(key, size)
        })
        .flatten();
    #[cfg(feature = "cuda")]
    let device_group = native.is_some();
    #[cfg(not(feature = "cuda"))]
    let device_group = false;
    let means = tune::Means {
        nranks: size,
        // A fixture that spreads the ranks over hosts is what the tuner sees.
        area: area.is_some() && hosts.count() == 1,
        direct: area.as_ref().is_some_and(AreaPath::direct),
        slice_bytes,
        hosts: hosts.count(),
        per_host: hosts.largest(),
        local: job_local,
        remote: job_remote,
        device_group,
    };
    let trace = crate::trace::Recorder::new(
        &config,
        rank,
        size,
        crate::trace::comm_tag(&boot.prefix, boot.secret.as_bytes()),
    );
    let engine = engine.with_area(area).with_recorder(trace.clone());
    tracing::debug!(
        rank,
        size,
        ?link_names,
        slice_bytes,
        "communicator {} ready",
        boot.prefix
    );
    let comm = Communicator {
        inner: Arc::new(Inner {
            rank,
            size,
            config,
            topo,
            hosts,
            flags,
            state: Mutex::new(State {
                engine,
                collectives: 0,
                groups: vec![0; size],
                sent: vec![0; size],
                received: vec![0; size],
                splits: 0,
                shrinks: 0,
                cache: Default::default(),
                costs,
                logged: Default::default(),
                decided: std::array::from_fn(|_| None),
                prices: Default::default(),
            }),
            boot,
            background: Background::default(),
            means,
            link_names,
            trace,
            #[cfg(feature = "cuda")]
            native,
            _liveness: liveness,
        }),
    };
    let comm = tuning::finish(comm, then)?;
    // This rank's last store call of the setup: a rank that hosts the store lets go of it
    // only once every rank has said so (`Boot::let_go`).
    store.add(SETUP_DONE, 1)?;
    Ok(comm)
}

/// The counter of ranks that finished their setup, in a communicator's namespace.
const SETUP_DONE: &str = "setup_done";

/// 16 random bytes drawn once per process: whether two ranks share an address space.
fn process_token() -> [u8; 16] {
    static TOKEN: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let mut t = [0u8; 16];
        match Secret::random() {
            Ok(s) => t.copy_from_slice(&s.as_bytes()[..16]),
            // No randomness: the address of this static and the pid still tell processes
            // apart on one host, which is all a shared address space needs.
            Err(_) => {
                t[..8].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
                t[8..].copy_from_slice(&(&TOKEN as *const _ as u64).to_le_bytes());
            }
        }
        t
    })
}

/// The kind of this rank's links to peers on its own host (`same`) or on others: the first
/// such peer's, as its transport names it.
fn link_kind(
    names: &[Option<&'static str>],
    hosts: &Hosts,
    rank: Rank,
    same: bool,
) -> Option<LinkKind> {
    (0..names.len())
        .filter(|&r| r != rank && (hosts.host(r) == hosts.host(rank)) == same)
        .find_map(|r| LinkKind::of(names[r]?))
}

/// How long discovery may wait for NVML: at most [`topo::nvml::WAIT`], and half of what is
/// left before `deadline`, so that a driver that does not answer leaves time for the exchange
/// of topologies that follows.
fn nvml_wait(deadline: Instant) -> Duration {
    topo::nvml::WAIT.min(deadline.saturating_duration_since(Instant::now()) / 2)
}

/// The job's topology: `OXCCL_TOPO_FILE`'s when set, else every rank's own discovery
/// exchanged through the store (one key per rank). Rank 0 writes it to
/// `OXCCL_TOPO_DUMP_FILE` when set.
#[allow(clippy::too_many_arguments)]
fn topology(
    boot: &Boot,
    store: &PrefixStore,
    config: &Config,
    rank: Rank,
    infos: &[PeerInfo],
    rdma: Option<String>,
    deadline: Instant,
    fixture: Option<Topology>,
) -> Result<Topology> {
    let size = infos.len();
    let topo = if let (Some(path), Some(t)) = (&config.topo_file, fixture) {
        if t.nranks() != size {
            return Err(Error::InvalidArgument(format!(
                "rank {rank}: OXCCL_TOPO_FILE {} describes {} ranks, but this communicator has {size}",
                path.display(),
                t.nranks()
            )));
        }
        t
    } else {
        let tcp = config.transports.order().any(|t| t == "tcp");
        let nic = if boot.hub.is_some() || !tcp {
            None
        } else {
            iface::choose_ip(boot.store_addr).ok().and_then(|ip| {
                let ifs = if_addrs::get_if_addrs().ok()?;
                ifs.into_iter().find(|i| i.ip() == ip).map(|i| i.name)
            })
        };
        let me = &infos[rank];
        let (host, mut place) = discover::local(
            std::path::Path::new("/"),
            &me.host,
            &topo::host_name(),
            nic,
            config
                .nvml_library
                .as_deref()
                .map(|l| (l, nvml_wait(deadline))),
        );
        place.rdma = rdma;
        let mine = serde_json::to_vec(&(host, place))
            .map_err(|e| Error::Bootstrap(format!("rank {rank}: topology: {e}")))?;
        store.set(&format!("topo/{rank}"), &mine)?;
        let mut views = Vec::with_capacity(size);
        for (r, info) in infos.iter().enumerate() {
            let bytes = store
                .get(&format!("topo/{r}"), deadline)
                .map_err(|e| joined_late(e, rank, size, r, deadline, config.timeout))?;
            let (host, place): (topo::Host, topo::Place) = serde_json::from_slice(&bytes)
                .ok()
                .filter(|(h, _): &(topo::Host, _)| h.id == info.host)
                .ok_or_else(|| {
                    Error::Bootstrap(format!(
                        "rank {rank}: rank {r} published an unreadable topology"
                    ))
                })?;
            views.push((host, place));
        }
        Topology::assemble(views)
    };
    if rank == 0
        && let Some(path) = &config.topo_dump_file
    {
        std::fs::write(path, topo.to_json()).map_err(|e| {
            Error::InvalidArgument(format!(
                "rank 0: OXCCL_TOPO_DUMP_FILE {}: cannot be written: {e}",
                path.display()
            ))
        })?;
    }
    Ok(topo)
}

/// The transports, the shared-memory group area's handle when shm is among them, and the RDMA
/// device port when rdma is.
type Transports = (Vec<Box<dyn Transport>>, Option<AreaSet>, Option<String>);

/// The allowed transports that can exist here, in preference order.
fn transports(
    boot: &Boot,
    rank: Rank,
    size: usize,
    config: &Config,
    max_message: usize,
) -> Result<Transports> {
    let mut out: Vec<Box<dyn Transport>> = Vec::new();
    let mut areas = None;
    let mut unavailable = Vec::new();
    let mut rdma = None;
    for name in config.transports.order() {
        match name {
            "loopback" => {
                if let Some(hub) = &boot.hub {
                    out.push(Box::new(LoopbackTransport::new(
                        hub.clone(),
                        &boot.prefix,
                        rank,
                        max_message,
                    )));
                }
            }
            "shm" => {
                let shm = ShmTransport::new(ShmConfig {
                    rank,
                    nranks: size,
                    secret: boot.secret.clone(),
                    context: boot.prefix.as_bytes().to_vec(),
                    max_message,
                    slots: SHM_SLOTS,
                })
                .map_err(|e| {
                    transport_error(rank, "create the shared-memory transport".into(), e)
                })?;
                areas = Some(shm.areas());
                out.push(Box::new(shm));
            }
            "tcp" => {
                let bind_ip = if boot.hub.is_some() {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                } else {
                    iface::choose_ip(boot.store_addr)?
                };
                let tcp = TcpTransport::new(TcpConfig {
                    rank,
                    nranks: size,
                    secret: boot.secret.clone(),
                    bind_ip,
                    max_message,
                    context: boot.prefix.as_bytes().to_vec(),
                })
                .map_err(|e| transport_error(rank, "create the TCP transport".into(), e))?;
                out.push(Box::new(tcp));
            }
            "rdma" => {
                let bind_ip = if boot.hub.is_some() {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                } else {
                    iface::choose_ip(boot.store_addr)?
                };
                let hca = config
                    .ib_hca
                    .as_deref()
                    .map(HcaFilter::parse)
                    .transpose()
                    .map_err(Error::InvalidArgument)?;
                match RdmaTransport::new(RdmaConfig {
                    rank,
                    nranks: size,
                    secret: boot.secret.clone(),
                    bind_ip,
                    max_message,
                    context: boot.prefix.as_bytes().to_vec(),
                    hca,
                    gid_index: config.ib_gid_index,
                }) {
                    Ok(t) => {
                        tracing::debug!(rank, "rdma: using {}", t.describe());
                        rdma = Some(t.describe());
                        out.push(Box::new(t));
                    }
                    Err(e) => {
                        tracing::debug!(rank, "rdma is unavailable: {e}");
                        unavailable.push(format!("rdma: {e}"));
                    }
                }
            }
            other => tracing::debug!(
                rank,
                "transport {other} is not built into this version; skipped"
            ),
        }
    }
    if out.is_empty() {
        return Err(Error::Unavailable(format!(
            "rank {rank}: none of the allowed transports ({:?}) is available{}{}",
            config.transports.order().collect::<Vec<_>>(),
            if unavailable.is_empty() { "" } else { ": " },
            unavailable.join("; ")
        )));
    }
    Ok((out, areas, rdma))
}

fn transport_error(rank: Rank, what: String, source: oxccl_transport::TransportError) -> Error {
    Error::Transport { rank, what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rank: Rank, wire: Option<&[u8]>) -> PeerInfo {
        let mut endpoints = vec![("proc".to_string(), vec![1u8; 16])];
        if let Some(w) = wire {
            endpoints.push(("wire".into(), w.to_vec()));
        }
        PeerInfo {
            rank,
            host: "h".into(),
            endpoints,
        }
    }

    #[test]
    fn ranks_of_another_wire_protocol_are_named() {
        let ours = WIRE.to_le_bytes();
        assert!(check_wire(0, &[info(0, Some(&ours)), info(1, Some(&ours))]).is_ok());
        for (theirs, says) in [
            (None, "older than 2"),
            (Some(&[9u8, 0, 0, 0][..]), "is 9"),
            (Some(&[2u8][..]), "is unreadable"),
        ] {
            let e = check_wire(0, &[info(0, Some(&ours)), info(1, theirs)])
                .expect_err("a rank of another protocol")
                .to_string();
            assert!(e.contains("rank 0: rank 1 runs") && e.contains(says), "{e}");
        }
    }
}
