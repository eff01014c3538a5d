//! Rendezvous from a launcher's environment: oxrun's `OXCCL_*` variables, torchrun, Slurm,
//! Open MPI and PMI. Reading is pure over a variable lookup (so every launcher is testable);
//! it must not open sockets — [`Rendezvous::open_store`] does that when asked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use std::path::{Path, PathBuf};

use super::{PrefixStore, Secret, Store, StoreServer, TcpStore, TorchStore, client};
use crate::{Error, Result};

/// Where this rank stands in its job and how to reach the job's store, as read from the
/// environment a launcher set up.
///
/// Variables are read in this order of precedence (the first launcher whose rank variable is
/// set wins; empty values count as unset):
///
/// | source      | rank, world size, local rank (local world size)                         | store                    |
/// |-------------|--------------------------------------------------------------------------|--------------------------|
/// | `oxccl`     | OXCCL_RANK, OXCCL_WORLD_SIZE, OXCCL_LOCAL_RANK (OXCCL_LOCAL_WORLD_SIZE)  | OXCCL_STORE, hosted by the launcher (oxrun) |
/// | `torchrun`  | RANK, WORLD_SIZE, LOCAL_RANK (LOCAL_WORLD_SIZE)                          | see below                |
/// | `slurm`     | SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID                                | see below                |
/// | `openmpi`   | OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (OMPI_COMM_WORLD_LOCAL_SIZE)    | see below                |
/// | `pmi`       | PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (MPI_LOCALNRANKS)                    | see below                |
///
/// For the other launchers the store is at `OXCCL_STORE` when set (`host:port`; a store someone
/// else already runs, as oxrun does), else at `MASTER_ADDR:MASTER_PORT`; with neither, reading
/// fails and says to set them. Who hosts it, and which protocol it speaks
/// ([`StoreProtocol`]):
///
/// | case (first that applies)                                           | protocol | hosted by             |
/// |----------------------------------------------------------------------|----------|-----------------------|
/// | `OXCCL_STORE_PROTOCOL=torch`                                         | torch    | someone else (torch)  |
/// | `OXCCL_STORE` set                                                    | oxccl    | someone else (oxrun)  |
/// | torchrun, `TORCHELASTIC_USE_AGENT_STORE=True`, MASTER_ADDR/PORT      | torch    | torchrun's agent      |
/// | otherwise, MASTER_ADDR/PORT                                          | oxccl    | rank 0 (`host_store`) |
///
/// `OXCCL_STORE_PROTOCOL` is `oxccl` (oxccl's own authenticated store) or `torch` (a PyTorch
/// c10d `TCPStore` that someone else runs — torchrun's agent, or `torch.distributed`'s store
/// on rank 0 after `init_process_group("env://")` — of which every rank is only a client);
/// unset, it is `torch` exactly in the agent-store case above, so that oxccl runs unchanged
/// under torchrun, whose agent already listens on `MASTER_PORT`. Set it to `oxccl` to make
/// rank 0 host oxccl's store anyway.
///
/// The job secret, which authenticates every connection of the job (to the store and between
/// ranks), comes from the first of these that applies ([`JobSecret`]):
///
/// | case | secret | who cannot join or read the job |
/// |------|--------|---------------------------------|
/// | `OXCCL_TOKEN` (64 hex digits) or `OXCCL_TOKEN_FILE` (see [`token_file`]) | as given | whoever the channel that carried it keeps out (oxrun passes a fresh random one in its children's environment, which only the user and root can read) |
/// | a torch store | rank 0 draws a random one and publishes it in the store | nobody who can reach the torch store: the trust torch itself places in it (anyone who reaches it can rewrite the job's rendezvous) |
/// | otherwise (rank 0 hosts oxccl's store) | HMAC of this user's key ([`user_key`], a random key in `~/.config/oxccl/key` made on first use, mode 0600) and the job's public facts (store address, world size, SLURM_JOB_ID, TORCHELASTIC_RUN_ID, OMPI_MCA_ess_base_jobid) | other users (of this host, or of any host that cannot read the user's home), remote strangers; not the user's own processes, nor root |
///
/// In the last case every host of the job needs the same key file: a shared home directory
/// (the usual cluster set-up) gives that; elsewhere copy the file or set `OXCCL_TOKEN`. A rank
/// whose key differs from the store's fails at once, naming its key file.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    /// This process's rank, `< world_size`.
    pub rank: usize,
    /// Number of ranks in the job.
    pub world_size: usize,
    /// Rank among the ranks on this host, when the launcher says.
    pub local_rank: Option<usize>,
    /// Number of ranks on this host, when the launcher says.
    pub local_world_size: Option<usize>,
    /// The store's address as `host:port` (IPv6 literals in brackets); see
    /// [`Rendezvous::store_addr`] to resolve it.
    pub store: String,
    /// Which protocol the store speaks, and for a torch store, where oxccl's keys live in it.
    pub protocol: StoreProtocol,
    /// Where the job secret comes from (see above); [`Rendezvous::open_store`] returns the
    /// secret itself.
    pub secret: JobSecret,
    /// Whether this rank must host the store itself (rank 0, when no launcher hosts it; never
    /// for a torch store).
    pub host_store: bool,
    /// Which launcher's variables were read: `"oxccl"`, `"torchrun"`, `"slurm"`, `"openmpi"`
    /// or `"pmi"`.
    pub source: &'static str,
}

/// Where a job's secret comes from (see [`Rendezvous`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSecret {
    /// Given by `OXCCL_TOKEN` or `OXCCL_TOKEN_FILE`.
    Given(Secret),
    /// Drawn by rank 0 and published in the job's torch store.
    Published,
    /// Derived from this user's key in `file` ([`user_key`], made on first use) and the job's
    /// public facts `job` ([`Secret::keyed`]).
    UserKey {
        /// The key file: `$XDG_CONFIG_HOME/oxccl/key`, or `$HOME/.config/oxccl/key`.
        file: std::path::PathBuf,
        /// The job's public facts.
        job: String,
    },
}

impl JobSecret {
    /// The secret when it was given.
    pub fn given(&self) -> Option<&Secret> {
        match self {
            JobSecret::Given(s) => Some(s),
            _ => None,
        }
    }

    /// The secret, reading (or on first use making) the user's key for
    /// [`JobSecret::UserKey`]; `None` for [`JobSecret::Published`].
    pub fn resolve(&self) -> Result<Option<Secret>> {
        match self {
            JobSecret::Given(s) => Ok(Some(s.clone())),
            JobSecret::Published => Ok(None),
            JobSecret::UserKey { file, job } => Ok(Some(user_key(file)?.keyed(job.as_bytes()))),
        }
    }
}

/// The protocol of a job's store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreProtocol {
    /// oxccl's own authenticated store ([`StoreServer`], [`TcpStore`]), hosted by the launcher
    /// (oxrun) or by rank 0.
    Oxccl,
    /// A PyTorch c10d `TCPStore` that someone else hosts ([`TorchStore`]). The store is shared
    /// with torch, so oxccl's keys live under `namespace` (`oxccl/<job id>`, and
    /// `/attempt<TORCHELASTIC_RESTART_COUNT>` under torchrun; the job id is the first of
    /// TORCHELASTIC_RUN_ID, SLURM_JOB_ID, OMPI_MCA_ess_base_jobid that is set, else `default`).
    Torch {
        /// Prefix of every key oxccl uses in the store.
        namespace: String,
    },
}

/// The job's store, opened by [`Rendezvous::open_store`].
pub struct OpenedStore {
    /// The store, for a torch store already inside oxccl's namespace in it.
    pub store: Arc<dyn Store>,
    /// The store's address.
    pub addr: SocketAddr,
    /// The job secret, which authenticates the links between ranks.
    pub secret: Secret,
    /// The store server this rank hosts, if any: keep it alive as long as the job needs the
    /// store.
    pub server: Option<StoreServer>,
}

impl std::fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedStore")
            .field("addr", &self.addr)
            .field("hosting", &self.server.is_some())
            .finish_non_exhaustive()
    }
}

/// One launcher's variable names.
struct Launcher {
    source: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: Option<&'static str>,
}

const OXCCL: Launcher = Launcher {
    source: "oxccl",
    rank: "OXCCL_RANK",
    size: "OXCCL_WORLD_SIZE",
    local_rank: "OXCCL_LOCAL_RANK",
    local_size: Some("OXCCL_LOCAL_WORLD_SIZE"),
};

const OTHERS: [Launcher; 4] = [
    Launcher {
        source: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Launcher {
        source: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
    Launcher {
        source: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Launcher {
        source: "pmi",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: Some("MPI_LOCALNRANKS"),
    },
];

const JOB_IDS: [&str; 3] = [
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "OMPI_MCA_ess_base_jobid",
];

fn bad(msg: String) -> Error {
    Error::Bootstrap(msg)
}

/// The secret in the file at `path` (`OXCCL_TOKEN_FILE`): 64 hex digits (surrounding white
/// space allowed), in a regular file of at most 1 KiB that belongs to this user and that no one
/// else may read or write (mode `0600` or stricter) — a secret others can read protects nothing.
pub fn token_file(path: &Path) -> Result<Secret> {
    private_secret(path, "OXCCL_TOKEN_FILE")
}

/// This user's key at `path` (see [`Rendezvous`]), made on first use: 32 random bytes as hex in
/// a new file of mode 0600 (its directories 0700), published with `link(2)` so that ranks
/// starting at once on a host (or on hosts sharing the home directory, NFS included) all end
/// up with the first one made. Then read under the checks of [`token_file`].
pub fn user_key(path: &Path) -> Result<Secret> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let what = "the user key";
    match std::fs::symlink_metadata(path) {
        Ok(_) => return private_secret(path, what),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(format!("{what} {}: {e}", path.display()))),
    }
    let made = (|| -> std::io::Result<bool> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let key = Secret::random().map_err(std::io::Error::other)?;
        // The temporary file's name must say nothing of the key: a nonce of its own.
        let nonce = Secret::random().map_err(std::io::Error::other)?;
        let nonce = &nonce.to_hex()[..16];
        let tmp = dir.join(format!(".key.{}.{nonce}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        let written = file
            .write_all(format!("{}\n", key.to_hex()).as_bytes())
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match written {
            Ok(()) => Ok(true),
            // Another rank made it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    })();
    let made = made.map_err(|e| {
        bad(format!(
            "cannot make {what} {} ({e}); without OXCCL_TOKEN or OXCCL_TOKEN_FILE the job \
             secret is derived from it",
            path.display()
        ))
    })?;
    if made {
        tracing::info!(file = %path.display(), "made this user's oxccl key");
    }
    private_secret(path, what)
}

/// 64 hex digits from a private file; `what` names it in errors.
fn private_secret(path: &Path, what: &str) -> Result<Secret> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let name = path.display();
    let bad = |why: String| bad(format!("{what} {name}: {why}"));
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    // The opened file's own metadata: what is read is what was checked.
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(bad(format!(
            "belongs to uid {}, not to this user (uid {me})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "mode {:o} lets others read or write it (chmod 600)",
            meta.mode() & 0o777
        )));
    }
    let mut text = String::new();
    file.take(1025)
        .read_to_string(&mut text)
        .map_err(|e| bad(e.to_string()))?;
    if text.len() > 1024 {
        return Err(bad("longer than 1 KiB".into()));
    }
    Secret::from_hex(text.trim()).ok_or_else(|| bad("does not hold 64 hex digits".into()))
}

/// Where this user's key lives: `$XDG_CONFIG_HOME/oxccl/key` when that is an absolute path
/// (the XDG rule), else `$HOME/.config/oxccl/key`.
fn user_key_path(var: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf> {
    let absolute = |name: &str| var(name).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(config) = absolute("XDG_CONFIG_HOME") {
        return Ok(config.join("oxccl").join("key"));
    }
    match absolute("HOME") {
        Some(home) => Ok(home.join(".config").join("oxccl").join("key")),
        None => Err(bad(format!(
            "no job secret: OXCCL_TOKEN and OXCCL_TOKEN_FILE are unset, and HOME ({:?}) is not \
             an absolute path to keep this user's key under",
            var("HOME").unwrap_or_default()
        ))),
    }
}

impl Rendezvous {
    /// Reads the process environment; `Ok(None)` when no launcher's variables are set (a
    /// single process, or a job that will pass a [`super::UniqueId`] instead).
    pub fn from_env() -> Result<Option<Rendezvous>> {
        crate::config::with_env(|get| Rendezvous::from_vars(get))
    }

    /// Like [`Rendezvous::from_env`] over any lookup of variables (for tests and embedders).
    /// Malformed numbers, a rank not below the world size, or missing pieces fail with
    /// [`Error::Bootstrap`] naming the variable.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Rendezvous>> {
        let var = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let oxccl_store = var("OXCCL_STORE");
        let protocol_var = var("OXCCL_STORE_PROTOCOL");
        let torch_wanted = match protocol_var.as_deref() {
            None => None,
            Some("torch") => Some(true),
            Some("oxccl") => Some(false),
            Some(other) => {
                return Err(bad(format!(
                    "OXCCL_STORE_PROTOCOL={other:?} is neither \"oxccl\" (oxccl's own store) nor \
                     \"torch\" (a PyTorch TCPStore someone else runs)"
                )));
            }
        };

        // (launcher, store address, whether rank 0 hosts it, whether it is a torch store)
        let (launcher, store, host_store_if_rank0, torch) = if var(OXCCL.rank).is_some()
            || var(OXCCL.size).is_some()
        {
            let store = oxccl_store.ok_or_else(|| {
                bad(
                    "OXCCL_RANK is set but OXCCL_STORE (host:port of the job's store) is not"
                        .into(),
                )
            })?;
            let torch = torch_wanted.unwrap_or(false);
            (&OXCCL, parse_store("OXCCL_STORE", &store)?, false, torch)
        } else {
            let Some(launcher) = OTHERS.iter().find(|l| var(l.rank).is_some()) else {
                return Ok(None);
            };
            match (oxccl_store, var("MASTER_ADDR"), var("MASTER_PORT")) {
                (Some(s), _, _) => {
                    let torch = torch_wanted.unwrap_or(false);
                    (launcher, parse_store("OXCCL_STORE", &s)?, false, torch)
                }
                (None, Some(addr), Some(port)) => {
                    let port = parse_port("MASTER_PORT", &port)?;
                    // torchrun's agent already listens on MASTER_PORT and says so (torch's own
                    // env:// rendezvous tests for exactly "True").
                    let agent_store = launcher.source == "torchrun"
                        && var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True");
                    let torch = torch_wanted.unwrap_or(agent_store);
                    (launcher, join_host_port(&addr, port), !torch, torch)
                }
                (None, Some(_), None) => {
                    return Err(bad(format!(
                        "{} launch: MASTER_ADDR is set but MASTER_PORT is not",
                        launcher.source
                    )));
                }
                (None, None, _) => {
                    return Err(bad(format!(
                        "{} launch ({} is set) but no store address: set MASTER_ADDR and \
                             MASTER_PORT (rank 0 then hosts the store there) or OXCCL_STORE=host:port \
                             (a store that is already running)",
                        launcher.source, launcher.rank
                    )));
                }
            }
        };

        let l = launcher;
        let rank = number(l.rank, var(l.rank))?;
        let world_size = number(l.size, var(l.size))?;
        if world_size == 0 {
            return Err(bad(format!("{} is 0", l.size)));
        }
        if rank >= world_size {
            return Err(bad(format!(
                "{}={rank} is not below {}={world_size}",
                l.rank, l.size
            )));
        }
        let local_rank = var(l.local_rank)
            .map(|v| number(l.local_rank, Some(v)))
            .transpose()?;
        let local_world_size = match l.local_size {
            Some(name) => var(name).map(|v| number(name, Some(v))).transpose()?,
            None => None,
        };
        if let (Some(lr), Some(ls)) = (local_rank, local_world_size)
            && lr >= ls
        {
            let size_name = l.local_size.unwrap_or("local world size");
            return Err(bad(format!(
                "{}={lr} is not below {size_name}={ls}",
                l.local_rank
            )));
        }
        if local_world_size.is_some_and(|ls| ls == 0 || ls > world_size) {
            let size_name = l.local_size.unwrap_or("local world size");
            return Err(bad(format!(
                "{size_name}={} is not between 1 and {}={world_size}",
                local_world_size.unwrap_or(0),
                l.size
            )));
        }

        let protocol = if torch {
            let job = JOB_IDS
                .iter()
                .find_map(|name| var(name))
                .unwrap_or_else(|| "default".into());
            let namespace = match var("TORCHELASTIC_RESTART_COUNT") {
                Some(attempt) => format!("oxccl/{job}/attempt{attempt}"),
                None => format!("oxccl/{job}"),
            };
            StoreProtocol::Torch { namespace }
        } else {
            StoreProtocol::Oxccl
        };

        let secret = match (var("OXCCL_TOKEN"), var("OXCCL_TOKEN_FILE")) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "OXCCL_TOKEN and OXCCL_TOKEN_FILE are both set: say the secret once".into(),
                ));
            }
            (Some(hex), None) => JobSecret::Given(
                Secret::from_hex(&hex)
                    .ok_or_else(|| bad("OXCCL_TOKEN is not 64 hex digits".into()))?,
            ),
            (None, Some(path)) => JobSecret::Given(token_file(Path::new(&path))?),
            // Rank 0 draws it when the store is opened.
            (None, None) if torch => JobSecret::Published,
            (None, None) => {
                let mut job = format!("oxccl job\0store={store}\0world_size={world_size}");
                for name in JOB_IDS {
                    if let Some(id) = var(name) {
                        job.push_str(&format!("\0{name}={id}"));
                    }
                }
                JobSecret::UserKey {
                    file: user_key_path(&var)?,
                    job,
                }
            }
        };

        Ok(Some(Rendezvous {
            rank,
            world_size,
            local_rank,
            local_world_size,
            store,
            protocol,
            secret,
            host_store: host_store_if_rank0 && rank == 0,
            source: l.source,
        }))
    }

    /// Resolves [`Rendezvous::store`] to a socket address (the first one the resolver gives).
    pub fn store_addr(&self) -> Result<SocketAddr> {
        let mut addrs = self.store.to_socket_addrs().map_err(|source| Error::Io {
            what: format!(
                "resolve the store address {:?} ({} launch)",
                self.store, self.source
            ),
            source,
        })?;
        addrs.next().ok_or_else(|| {
            bad(format!(
                "the store address {:?} resolves to no address",
                self.store
            ))
        })
    }

    /// Connects to the job's store, first starting it when this rank hosts it
    /// ([`Rendezvous::host_store`]: it then listens on the store's own address — on every
    /// interface only when that address is not one of this host's, as behind NAT).
    ///
    /// For a torch store ([`StoreProtocol::Torch`]) every rank is a client. Each call is one
    /// more generation of the job in the store (a counter per rank, so the k-th call on every
    /// rank meets the k-th on the others, never keys an earlier communicator left there), and
    /// the returned store is scoped to `namespace/<generation>`. Without a given secret, rank 0
    /// then draws the job secret and sets it at key `secret` there, and the other ranks wait
    /// for it until `deadline`. Requests without a deadline of their own (set, add, check)
    /// are bounded by the time from now to `deadline` (the communicator's timeout, at
    /// creation), at least a second.
    pub fn open_store(&self, deadline: Instant) -> Result<OpenedStore> {
        let addr = self.store_addr()?;
        let bound = deadline
            .saturating_duration_since(Instant::now())
            .max(std::time::Duration::from_secs(1));
        match &self.protocol {
            StoreProtocol::Oxccl => {
                let secret = self.secret.resolve()?.ok_or_else(|| {
                    bad("oxccl's store needs a secret, and the rendezvous has none".into())
                })?;
                let server = if self.host_store {
                    // A name (not an address) that resolves to loopback here may resolve to
                    // this host's real address elsewhere (Debian's 127.0.1.1 for the host
                    // name), so only a literal loopback address keeps the store on loopback.
                    let literal = self.store.parse::<SocketAddr>().is_ok();
                    Some(StoreServer::bind(
                        store_bind_addr(addr, literal),
                        secret.clone(),
                    )?)
                } else {
                    None
                };
                let store = TcpStore::connect(addr, &secret, deadline)
                    .map(|s| s.with_timeout(bound))
                    .map_err(|e| match (&self.secret, e) {
                        (JobSecret::UserKey { file, .. }, Error::Bootstrap(m))
                            if m.contains(client::NOT_OUR_SECRET) =>
                        {
                            bad(format!(
                                "rank {}: {m}: this rank's secret comes from its user key {} — \
                             every host of the job needs the same key file (a shared home \
                             directory, or copy it), or set OXCCL_TOKEN or OXCCL_TOKEN_FILE on \
                             every rank",
                                self.rank,
                                file.display()
                            ))
                        }
                        (_, e) => e,
                    })?;
                Ok(OpenedStore {
                    store: Arc::new(store),
                    addr,
                    secret,
                    server,
                })
            }
            StoreProtocol::Torch { namespace } => {
                let client: Arc<dyn Store> =
                    Arc::new(TorchStore::connect(addr, deadline)?.with_timeout(bound));
                let generation = client.add(&format!("{namespace}/generation/{}", self.rank), 1)?;
                let store = PrefixStore::new(client, format!("{namespace}/{generation}"));
                let secret = match self.secret.resolve()? {
                    Some(s) => s,
                    None if self.rank == 0 => {
                        let s = Secret::random().map_err(|e| {
                            bad(format!(
                                "rank 0: draw the job secret for the torch store: {e}"
                            ))
                        })?;
                        store.set("secret", s.to_hex().as_bytes())?;
                        s
                    }
                    None => {
                        let hex = store.get("secret", deadline)?;
                        std::str::from_utf8(&hex)
                            .ok()
                            .and_then(Secret::from_hex)
                            .ok_or_else(|| {
                                bad(format!(
                                    "torch store at {addr}: key {:?} holds no secret (64 hex \
                                     digits) from rank 0",
                                    format!("{}/secret", store.prefix())
                                ))
                            })?
                    }
                };
                tracing::debug!(
                    rank = self.rank,
                    %addr,
                    prefix = store.prefix(),
                    "joined the job through a torch TCPStore"
                );
                Ok(OpenedStore {
                    store: Arc::new(store),
                    addr,
                    secret,
                    server: None,
                })
            }
        }
    }
}

fn number(name: &str, value: Option<String>) -> Result<usize> {
    let v = value.ok_or_else(|| bad(format!("{name} is not set")))?;
    v.parse::<usize>()
        .map_err(|_| bad(format!("{name}={v:?} is not a non-negative integer")))
}

fn parse_port(name: &str, v: &str) -> Result<u16> {
    match v.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(bad(format!("{name}={v:?} is not a port number (1-65535)"))),
    }
}

/// Checks a `host:port` (or `[v6]:port`) value and returns it normalised.
fn parse_store(name: &str, v: &str) -> Result<String> {
    let Some((host, port)) = v.rsplit_once(':') else {
        return Err(bad(format!("{name}={v:?} is not host:port")));
    };
    let port = parse_port(name, port)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || (host.contains(':') && host.parse::<Ipv6Addr>().is_err()) {
        return Err(bad(format!(
            "{name}={v:?} is not host:port (IPv6 addresses go in brackets)"
        )));
    }
    Ok(join_host_port(host, port))
}

fn join_host_port(host: &str, port: u16) -> String {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Where the store this rank hosts listens: its own address when that is one of this host's
/// interfaces' (or a loopback address given as such, `literal`), so that nobody reaches it
/// through another interface; every interface, at the same port, otherwise (a NAT or virtual
/// address that routes here, or a host name that resolves to loopback only here).
fn store_bind_addr(addr: SocketAddr, literal: bool) -> SocketAddr {
    let ip = addr.ip();
    let local = if ip.is_loopback() {
        literal
    } else {
        if_addrs::get_if_addrs().is_ok_and(|ifs| ifs.iter().any(|i| i.ip() == ip))
    };
    if local {
        return addr;
    }
    tracing::debug!(
        "the store address {addr} is not (only) this host's: the store listens on every \
         interface at port {}",
        addr.port()
    );
    let any = match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(any, addr.port())
}
