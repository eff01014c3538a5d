//! oxccl as a client of PyTorch's c10d `TCPStore` (issue 13): the protocol against a real
//! torch server (both of its backends), ranks that meet through it as they do under torchrun
//! with `TORCHELASTIC_USE_AGENT_STORE=True`, torchrun itself running an oxccl program, and a
//! fake server that answers garbage.
//!
//! torch comes from the Python at `OXCCL_PYTHON`, else `~/.cache/oxccl/torch-venv/bin/python`.
//! Without it the tests that need it print `skipped: <reason>` and pass, unless
//! `OXCCL_REQUIRE_TORCH=1` (as in CI), which makes them fail.

mod util;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use oxccl::bootstrap::{Rendezvous, Store, StoreProtocol, TorchStore};
use oxccl::config::TransportFilter;
use oxccl::{Communicator, Config, Error, ReduceOp};

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

// ---- torch ----

/// The Python that has torch, or why there is none (a failure when torch is required).
fn python() -> Option<PathBuf> {
    let path = match std::env::var_os("OXCCL_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/oxccl/torch-venv/bin/python")
        }
    };
    let why = match Command::new(&path)
        .args(["-c", "import torch.distributed as d; d.TCPStore"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(out) if out.status.success() => return Some(path),
        Ok(out) => format!(
            "{} has no torch.distributed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => format!("cannot run {}: {e}", path.display()),
    };
    assert!(
        std::env::var("OXCCL_REQUIRE_TORCH").as_deref() != Ok("1"),
        "OXCCL_REQUIRE_TORCH=1 but {why}"
    );
    println!("skipped: {why}");
    None
}

/// A `torch.distributed.TCPStore` server in a Python process, which also runs commands on the
/// store through torch's own client, one per line on its stdin: `set KEY VALUE`, `get KEY`,
/// `add KEY N`, `check KEY`. It lives until its stdin closes.
struct TorchServer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    port: u16,
}

const SERVER: &str = r#"
import sys
import torch.distributed as d
store = d.TCPStore(host_name="127.0.0.1", port=0, is_master=True,
                   wait_for_workers=False, use_libuv=sys.argv[1] == "libuv")
print(store.port, flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "set":
        store.set(args[0], args[1])
        print("ok", flush=True)
    elif cmd == "get":
        print(store.get(args[0]).decode(), flush=True)
    elif cmd == "add":
        print(store.add(args[0], int(args[1])), flush=True)
    elif cmd == "check":
        print(store.check([args[0]]), flush=True)
"#;

impl TorchServer {
    /// Starts a server with `backend` `"libuv"` (torch's default) or `"classic"`.
    fn start(python: &PathBuf, backend: &str) -> TorchServer {
        let mut child = Command::new(python)
            .args(["-c", SERVER, backend])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the port");
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("python printed {line:?} instead of the store's port"));
        TorchServer {
            child,
            stdin,
            stdout,
            port,
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Runs one command through torch's client and returns its printed answer.
    fn torch(&mut self, command: &str) -> String {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{command}").expect("send a command to python");
        stdin.flush().expect("flush");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("python's answer");
        line.trim().to_owned()
    }
}

impl Drop for TorchServer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bootstrap_error(e: Error) -> String {
    assert!(matches!(e, Error::Bootstrap(_)), "{e:?}");
    e.to_string()
}

/// Every operation of the `Store` trait, and keys crossing between torch's client and ours.
fn speaks_tcpstore(backend: &str) {
    let Some(py) = python() else { return };
    let mut server = TorchServer::start(&py, backend);
    let addr = server.addr();
    let store = Arc::new(TorchStore::connect(addr, soon()).unwrap());

    // Round trips, binary and empty values included.
    store.set("a", b"hello").unwrap();
    assert_eq!(store.get("a", soon()).unwrap(), b"hello");
    let binary: Vec<u8> = (0..=255).collect();
    store.set("bin", &binary).unwrap();
    assert_eq!(store.get("bin", soon()).unwrap(), binary);
    store.set("empty", b"").unwrap();
    assert_eq!(store.get("empty", soon()).unwrap(), b"");
    store.set("a", b"again").unwrap();
    assert_eq!(store.get("a", soon()).unwrap(), b"again");

    assert_eq!(store.add("n", 5).unwrap(), 5);
    assert_eq!(store.add("n", -7).unwrap(), -2);
    assert_eq!(store.get("n", soon()).unwrap(), b"-2");
    assert!(store.check(&["a", "n"]).unwrap());
    assert!(!store.check(&["a", "nobody"]).unwrap());
    store.wait(&["a", "n", "empty"], soon()).unwrap();

    // Keys cross between the two clients in both directions.
    assert_eq!(server.torch("get a"), "again");
    assert_eq!(server.torch("set from_py 42"), "ok");
    assert_eq!(store.get("from_py", soon()).unwrap(), b"42");
    assert_eq!(store.add("from_py", 8).unwrap(), 50);
    assert_eq!(server.torch("add n 2"), "0");
    assert_eq!(server.torch("check from_py"), "True");

    // A wait parked in one thread does not hold up a set from another through the same client,
    // and wakes up when torch's client sets the key.
    let waiter = {
        let store = store.clone();
        thread::spawn(move || store.get("later", soon()))
    };
    thread::sleep(Duration::from_millis(200));
    store.set("unrelated", b"x").unwrap();
    assert_eq!(server.torch("set later ready"), "ok");
    assert_eq!(waiter.join().unwrap().unwrap(), b"ready");

    // A missing key fails at the deadline, naming the key and the store.
    let t = Instant::now();
    let err = bootstrap_error(
        store
            .get("missing", Instant::now() + Duration::from_millis(300))
            .unwrap_err(),
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(
        err.contains("\"missing\"") && err.contains(&addr.to_string()),
        "{err}"
    );
    let err = bootstrap_error(
        store
            .wait(
                &["a", "gone", "n"],
                Instant::now() + Duration::from_millis(100),
            )
            .unwrap_err(),
    );
    assert!(err.contains("\"gone\""), "{err}");
    // ... and the connection it used is still in step.
    assert_eq!(store.get("a", soon()).unwrap(), b"again");
    // A deadline already passed still returns a value that is there.
    assert_eq!(store.get("a", Instant::now()).unwrap(), b"again");

    // An add to a value that is not a counter: the server drops the connection; the error says
    // why, and the store goes on working.
    let err = bootstrap_error(store.add("a", 1).unwrap_err());
    assert!(err.contains("\"a\"") && err.contains("counter"), "{err}");
    assert_eq!(store.get("n", soon()).unwrap(), b"0");

    // What the server would refuse is refused here, before sending.
    let long = "k".repeat(9000);
    assert!(matches!(
        store.set(&long, b"v"),
        Err(Error::InvalidArgument(_))
    ));
    let big = vec![0u8; (8 << 20) + 1];
    assert!(matches!(
        store.set("big", &big),
        Err(Error::InvalidArgument(_))
    ));
    let ok = vec![7u8; 8 << 20];
    store.set("big", &ok).unwrap();
    assert_eq!(store.get("big", soon()).unwrap().len(), ok.len());
}

#[test]
fn speaks_tcpstore_libuv() {
    speaks_tcpstore("libuv");
}

#[test]
fn speaks_tcpstore_classic() {
    speaks_tcpstore("classic");
}

#[test]
fn a_dead_store_is_an_error_not_a_hang() {
    let Some(py) = python() else { return };
    let server = TorchServer::start(&py, "libuv");
    let store = TorchStore::connect(server.addr(), soon()).unwrap();
    store.set("k", b"v").unwrap();
    drop(server);
    let t = Instant::now();
    let err = store.set("k", b"w").unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(err.contains("\"k\""), "{err}");
    assert!(store.get("k", soon()).is_err());
}

// ---- ranks meeting through a torch store ----

/// The variables torchrun gives rank `rank` of `n` whose agent serves the store at `port`.
fn torchrun_vars(rank: usize, n: usize, port: u16, run: &str) -> Rendezvous {
    let vars: HashMap<&str, String> = [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", n.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", n.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        ("TORCHELASTIC_RUN_ID", run.into()),
        ("TORCHELASTIC_RESTART_COUNT", "0".into()),
    ]
    .into_iter()
    .collect();
    Rendezvous::from_vars(|k| vars.get(k).cloned())
        .unwrap()
        .expect("torchrun's variables")
}

/// `n` ranks (threads) of one job meet through the torch store, all-reduce, and check the sum.
fn all_reduce_through(server: &TorchServer, n: usize, run: &str, config: Config) {
    let count = 10_000;
    let results: Vec<Vec<f32>> = thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|rank| {
                let rv = torchrun_vars(rank, n, server.port, run);
                assert!(!rv.host_store && matches!(rv.protocol, StoreProtocol::Torch { .. }));
                let config = config.clone();
                s.spawn(move || {
                    let comm = Communicator::init_from(&rv, config).unwrap();
                    assert_eq!((comm.rank(), comm.size()), (rank, n));
                    let mut buf: Vec<f32> =
                        (0..count).map(|i| (rank * 1000 + i % 97) as f32).collect();
                    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                    buf
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, got) in results.iter().enumerate() {
        for (i, &x) in got.iter().enumerate() {
            let want: usize = (0..n).map(|r| r * 1000 + i % 97).sum();
            assert_eq!(x, want as f32, "rank {rank} element {i} of {n} ranks");
        }
    }
}

#[test]
fn ranks_meet_through_a_torch_store_as_under_torchrun() {
    let Some(py) = python() else { return };
    let mut server = TorchServer::start(&py, "libuv");
    let quick = Config::default().timeout(Duration::from_secs(30));

    all_reduce_through(&server, 2, "job-a", quick.clone());
    // The secret was drawn by rank 0 and published under the job's first generation.
    let secret = server.torch("get oxccl/job-a/attempt0/1/secret");
    assert_eq!(secret.len(), 64, "{secret}");
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()), "{secret}");

    // A second communicator of the same job is a new generation: it never reads the first's
    // keys, and gets a secret of its own.
    all_reduce_through(&server, 2, "job-a", quick.clone());
    let second = server.torch("get oxccl/job-a/attempt0/2/secret");
    assert_ne!(second, secret);

    // Three ranks, over TCP links authenticated with the published secret.
    let tcp = quick.transports(TransportFilter::only(&["tcp"]));
    all_reduce_through(&server, 3, "job-b", tcp);
}

/// torchrun itself (its agent hosts the store on MASTER_PORT) running two ranks of the
/// `allreduce` example, which calls `Communicator::init(Config::from_env()?)` unchanged.
#[test]
fn torchrun_runs_an_oxccl_program() {
    let Some(py) = python() else { return };
    let torchrun = py.with_file_name("torchrun");
    if !torchrun.exists() {
        assert!(
            std::env::var("OXCCL_REQUIRE_TORCH").as_deref() != Ok("1"),
            "OXCCL_REQUIRE_TORCH=1 but {} is missing",
            torchrun.display()
        );
        println!("skipped: no {}", torchrun.display());
        return;
    }
    let example = util::procs::example("allreduce");
    let mut cmd = Command::new(&torchrun);
    cmd.args(["--standalone", "--nproc-per-node", "2", "--no-python"])
        .arg(&example)
        .env("OXCCL_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("OXCCL_") && k != "OXCCL_TIMEOUT" {
            cmd.env_remove(k);
        }
    }
    for k in [
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_RANK",
    ] {
        cmd.env_remove(k);
    }
    let mut child = cmd.spawn().expect("start torchrun");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut out = String::new();
    let reader = thread::spawn(move || {
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let end = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for torchrun") {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("torchrun did not finish in 120 s");
        }
        thread::sleep(Duration::from_millis(50));
    };
    let out = reader.join().unwrap();
    let err = err_reader.join().unwrap();
    assert!(status.success(), "torchrun: {status}\n{out}\n{err}");
    for rank in 0..2 {
        let line = format!("rank {rank} of 2: ");
        assert!(
            out.lines()
                .any(|l| l.starts_with(&line) && l.ends_with("correct")),
            "no correct all-reduce from rank {rank}:\n{out}\n{err}"
        );
    }
}

// ---- a server that answers garbage ----

/// What a fake store does after its last reply.
#[derive(Clone, Copy)]
enum Then {
    /// Closes the connection.
    Close,
    /// Keeps it open without answering.
    Silent,
    /// Reads one more request and answers it one zero byte every 100 ms, forever.
    Trickle,
}

/// A fake store that passes the handshake (echoes the ping's nonce) unless `handshake` says
/// otherwise (an empty one closes the connection), then answers the i-th request it reads
/// with `replies[i]`, then does what `then` says.
fn fake_server(handshake: Option<Vec<u8>>, replies: Vec<Vec<u8>>, then: Then) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        let mut hello = [0u8; 10];
        if s.read_exact(&mut hello).is_err() {
            return;
        }
        let answer = handshake.unwrap_or_else(|| hello[6..10].to_vec());
        if answer.is_empty() || s.write_all(&answer).is_err() {
            return;
        }
        for reply in replies {
            let mut buf = [0u8; 4096];
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if s.write_all(&reply).is_err() {
                return;
            }
        }
        match then {
            Then::Close => {}
            Then::Silent => {
                // Until the client goes away.
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink);
            }
            Then::Trickle => {
                let mut request = [0u8; 4096];
                if s.read(&mut request).is_ok() {
                    while s.write_all(&[0]).is_ok() {
                        thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
    });
    addr
}

fn within(limit: Duration, f: impl FnOnce() -> Error) -> String {
    let t = Instant::now();
    let e = f();
    assert!(t.elapsed() < limit, "took {:?}: {e}", t.elapsed());
    e.to_string()
}

#[test]
fn garbage_at_the_handshake_is_refused() {
    let short = Duration::from_secs(5);

    // Nonsense instead of the nonce (what oxccl's own store, or any other service, would send).
    let addr = fake_server(Some(b"OXCC".to_vec()), vec![], Then::Silent);
    let err = within(short, || TorchStore::connect(addr, soon()).unwrap_err());
    assert!(
        err.contains(&addr.to_string()) && err.contains("TCPStore"),
        "{err}"
    );

    // Closed at once.
    let addr = fake_server(Some(vec![]), vec![], Then::Close);
    let err = within(short, || TorchStore::connect(addr, soon()).unwrap_err());
    assert!(
        err.contains("closed the connection during the handshake"),
        "{err}"
    );

    // Never answers: the deadline ends it.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let err = within(short, || {
        TorchStore::connect(addr, Instant::now() + Duration::from_millis(300)).unwrap_err()
    });
    assert!(err.contains("no answer to the handshake in time"), "{err}");
}

#[test]
fn garbage_answers_are_errors_not_panics_or_allocations() {
    let short = Duration::from_secs(5);
    let connect = |replies: Vec<Vec<u8>>| {
        TorchStore::connect(fake_server(None, replies, Then::Silent), soon())
    };

    // A value "of 2^64 - 1 bytes": refused before anything is allocated for it.
    let store = connect(vec![vec![0], u64::MAX.to_le_bytes().to_vec()]).unwrap();
    let err = within(short, || store.get("key", soon()).unwrap_err());
    assert!(
        err.contains("\"key\"") && err.contains("exceeds the limit"),
        "{err}"
    );

    // Just under the limit, then the connection ends: a clean end-of-stream error.
    let mut len = ((16u64 << 20) - 1).to_le_bytes().to_vec();
    len.extend_from_slice(b"only this");
    let store =
        TorchStore::connect(fake_server(None, vec![vec![0], len], Then::Close), soon()).unwrap();
    let err = within(short, || store.get("key", soon()).unwrap_err());
    assert!(
        err.contains("\"key\"") && err.contains("closed the connection"),
        "{err}"
    );

    // A wait answered with something that is not STOP_WAITING.
    let store = connect(vec![vec![0x42]]).unwrap();
    let err = within(short, || store.wait(&["w"], soon()).unwrap_err());
    assert!(
        err.contains("\"w\"") && err.contains("answered a wait with 66"),
        "{err}"
    );

    // A check answered with nonsense.
    let store = connect(vec![vec![9]]).unwrap();
    let err = within(short, || store.check(&["c"]).unwrap_err());
    assert!(err.contains("answered a check with 9"), "{err}");

    // An add answered with 3 of its 8 bytes, then silence: the request's deadline ends it.
    let store = connect(vec![vec![1, 2, 3]])
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    let err = within(short, || store.add("counter", 1).unwrap_err());
    assert!(
        err.contains("\"counter\"") && err.contains("in time"),
        "{err}"
    );

    // A set whose ping comes back wrong.
    let store = connect(vec![vec![0xde, 0xad, 0xbe, 0xef]]).unwrap();
    let err = within(short, || store.set("s", b"v").unwrap_err());
    assert!(err.contains("\"s\"") && err.contains("ping"), "{err}");

    // A wait that is never answered, nor is its cancel: bounded all the same.
    let store = connect(vec![]).unwrap();
    let err = within(Duration::from_secs(8), || {
        store
            .get("never", Instant::now() + Duration::from_millis(200))
            .unwrap_err()
    });
    assert!(err.contains("\"never\""), "{err}");
}

/// A server that passes the handshake, then answers each request one byte every 100 ms,
/// forever: with a timeout per read, a request would last as long as the bytes kept coming.
#[test]
fn a_trickling_server_cannot_stretch_a_request_past_its_deadline() {
    let addr = fake_server(None, vec![], Then::Trickle);
    let store = TorchStore::connect(addr, soon())
        .unwrap()
        .with_timeout(Duration::from_millis(500));
    // 8 bytes take 0.8 s at this pace, past the 0.5 s the add has (with a timeout per read,
    // the add succeeded after 0.8 s).
    let err = within(Duration::from_secs(2), || {
        store.add("counter", 1).unwrap_err()
    });
    assert!(
        err.contains("\"counter\"") && err.contains("in time"),
        "{err}"
    );
}

/// A store that goes silent once a rank has connected (its host wedged): creation fails
/// within the communicator's timeout, not the store client's default of 300 s (the add of
/// the rank's generation waited 300 s before).
#[test]
fn a_store_that_goes_silent_fails_creation_within_its_timeout() {
    let addr = fake_server(None, vec![], Then::Silent);
    let rv = torchrun_vars(0, 2, addr.port(), "silent");
    let config = Config::default().timeout(Duration::from_secs(2));
    let err = within(Duration::from_secs(6), || {
        Communicator::init_from(&rv, config)
            .map(|c| c.size())
            .expect_err("no store")
    });
    assert!(
        err.contains("generation") && err.contains("in time"),
        "{err}"
    );
}
