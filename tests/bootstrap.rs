//! The bootstrap: stores (in process and over TCP) from many threads, deadlines that fail with
//! the key's name instead of hanging, strangers turned away by the store server while a real
//! client carries on, unique ids, and rendezvous from every launcher's environment.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use oxccl::Error;
use oxccl::bootstrap::{
    JobSecret, MemStore, PrefixStore, Rendezvous, Secret, ServerLimits, Store, StoreProtocol,
    StoreServer, TcpStore, UniqueId,
};
use oxccl_transport::auth;

const SHORT: Duration = Duration::from_millis(150);
const LONG: Duration = Duration::from_secs(10);

fn soon() -> Instant {
    Instant::now() + LONG
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn tcp_pair() -> (StoreServer, Arc<TcpStore>, Secret) {
    let secret = Secret::random().unwrap();
    let server = StoreServer::bind(localhost(), secret.clone()).unwrap();
    let client = TcpStore::connect(server.local_addr(), &secret, soon()).unwrap();
    (server, Arc::new(client), secret)
}

/// Every log line of this test binary, so tests can check what the server reported.
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        struct W(&'static Mutex<Vec<u8>>);
        impl Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || W(buf))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buf
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).into_owned()
}

/// Several threads set their own key, bump a shared counter and wait for everyone's key.
fn exercise_from_threads(stores: Vec<Arc<dyn Store>>) {
    let n = stores.len();
    let handles: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(rank, store)| {
            thread::spawn(move || {
                // Count in before announcing the key, so that all keys set means all counted.
                let after = store.add("arrived", 1).unwrap();
                assert!((1..=n as i64).contains(&after));
                store
                    .set(
                        &format!("rank/{rank}"),
                        format!("hello from {rank}").as_bytes(),
                    )
                    .unwrap();
                let keys: Vec<String> = (0..n).map(|r| format!("rank/{r}")).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                store.wait(&refs, soon()).unwrap();
                assert!(store.check(&refs).unwrap());
                for peer in 0..n {
                    let v = store.get(&format!("rank/{peer}"), soon()).unwrap();
                    assert_eq!(v, format!("hello from {peer}").as_bytes());
                }
                store.add("arrived", 0).unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), n as i64);
    }
}

#[test]
fn mem_store_serves_many_threads() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    exercise_from_threads(vec![store; 6]);
}

#[test]
fn tcp_store_serves_many_threads_and_connections() {
    let (server, shared, secret) = tcp_pair();
    // Three threads share one client; three more have a connection each.
    let mut stores: Vec<Arc<dyn Store>> = vec![shared.clone(), shared.clone(), shared];
    for _ in 0..3 {
        stores.push(Arc::new(
            TcpStore::connect(server.local_addr(), &secret, soon()).unwrap(),
        ));
    }
    exercise_from_threads(stores);
}

fn counters_and_values(store: &dyn Store) {
    assert_eq!(store.add("c", 5).unwrap(), 5);
    assert_eq!(store.add("c", -7).unwrap(), -2);
    assert_eq!(
        store.get("c", soon()).unwrap(),
        b"-2",
        "counters are decimal text"
    );
    store.set("text", b"not a number").unwrap();
    let err = store.add("text", 1).unwrap_err().to_string();
    assert!(err.contains("\"text\""), "{err}");
    store.set("max", i64::MAX.to_string().as_bytes()).unwrap();
    assert!(store.add("max", 1).is_err());
    store.set("text", b"").unwrap();
    assert_eq!(
        store.get("text", Instant::now()).unwrap(),
        b"",
        "set replaces; a passed deadline still reads"
    );
    assert!(!store.check(&["text", "nope"]).unwrap());
    let big = vec![7u8; 3 << 20];
    store.set("big", &big).unwrap();
    assert_eq!(store.get("big", soon()).unwrap(), big);
}

#[test]
fn counters_and_values_behave_the_same_in_both_stores() {
    counters_and_values(&MemStore::new());
    let (_server, client, _) = tcp_pair();
    counters_and_values(&*client);
}

fn missing_key_times_out(store: &dyn Store) {
    let start = Instant::now();
    let err = store.get("never-set", Instant::now() + SHORT).unwrap_err();
    assert!(start.elapsed() >= SHORT && start.elapsed() < Duration::from_secs(3));
    assert!(matches!(err, Error::Bootstrap(_)), "{err:?}");
    assert!(err.to_string().contains("\"never-set\""), "{err}");

    store.set("here", b"1").unwrap();
    let err = store
        .wait(&["here", "also-missing"], Instant::now() + SHORT)
        .unwrap_err();
    assert!(err.to_string().contains("\"also-missing\""), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn missing_keys_time_out_naming_the_key() {
    missing_key_times_out(&MemStore::new());
    let (_server, client, _) = tcp_pair();
    missing_key_times_out(&*client);
}

fn get_waits_for_a_later_set(store: Arc<dyn Store>) {
    let getter = {
        let store = store.clone();
        thread::spawn(move || store.get("late", soon()))
    };
    let waiter = {
        let store = store.clone();
        thread::spawn(move || store.wait(&["late", "later"], soon()))
    };
    thread::sleep(SHORT);
    assert!(!getter.is_finished() && !waiter.is_finished());
    store.set("late", b"worth it").unwrap();
    assert_eq!(getter.join().unwrap().unwrap(), b"worth it");
    thread::sleep(Duration::from_millis(50));
    assert!(!waiter.is_finished());
    store.set("later", b"").unwrap();
    waiter.join().unwrap().unwrap();
}

#[test]
fn get_issued_before_the_set_returns_when_it_arrives() {
    get_waits_for_a_later_set(Arc::new(MemStore::new()));
    // The TCP store shares one client between the parked get and the set: the set must not
    // queue behind the get.
    let (_server, client, _) = tcp_pair();
    get_waits_for_a_later_set(client);
}

#[test]
fn prefix_stores_are_isolated() {
    let (_server, client, _) = tcp_pair();
    for inner in [Arc::new(MemStore::new()) as Arc<dyn Store>, client] {
        let a = PrefixStore::new(inner.clone(), "split-a".into());
        let b = PrefixStore::new(inner.clone(), "split-b".into());
        a.set("k", b"from a").unwrap();
        b.set("k", b"from b").unwrap();
        assert_eq!(a.get("k", soon()).unwrap(), b"from a");
        assert_eq!(b.get("k", soon()).unwrap(), b"from b");
        assert_eq!(inner.get("split-a/k", soon()).unwrap(), b"from a");
        a.set("only-a", b"").unwrap();
        assert!(a.check(&["only-a"]).unwrap());
        assert!(!b.check(&["only-a"]).unwrap());
        let err = b
            .get("only-a", Instant::now() + SHORT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("split-b/only-a"), "{err}");
        assert_eq!(a.add("n", 2).unwrap(), 2);
        assert_eq!(b.add("n", 1).unwrap(), 1);
        a.wait(&["k", "only-a"], soon()).unwrap();
        assert!(b.wait(&["only-a"], Instant::now() + SHORT).is_err());
    }
}

/// Asserts that the server closes `s` promptly (EOF or reset), reading whatever it sent first.
fn assert_closed_by_server(s: &mut TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!(
                "{what}: connection not closed after {:?}: {e}",
                start.elapsed()
            ),
        }
    }
}

fn still_works(client: &TcpStore, round: &str) {
    client.set(round, round.as_bytes()).unwrap();
    assert_eq!(client.get(round, soon()).unwrap(), round.as_bytes());
}

#[test]
fn strangers_are_dropped_and_clients_carry_on() {
    logs();
    let secret = Secret::random().unwrap();
    let limits = ServerLimits {
        handshake_timeout: Duration::from_millis(300),
        ..ServerLimits::default()
    };
    let server = StoreServer::bind_with(localhost(), secret.clone(), limits).unwrap();
    let addr = server.local_addr();
    let client = TcpStore::connect(addr, &secret, soon()).unwrap();
    still_works(&client, "before");

    // A client busy in a parked get all along.
    let busy = {
        let c = TcpStore::connect(addr, &secret, soon()).unwrap();
        thread::spawn(move || c.get("the-end", soon()))
    };

    let mut peers = Vec::new();
    let mut stranger = |what: &str, act: &dyn Fn(&mut TcpStream)| {
        let mut s = TcpStream::connect(addr).unwrap();
        peers.push((what.to_owned(), s.local_addr().unwrap()));
        act(&mut s);
        assert_closed_by_server(&mut s, what);
        still_works(&client, what);
    };

    stranger("garbage", &|s| {
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap()
    });
    stranger("huge hello", &|s| {
        let mut header = [0u8; auth::HELLO_HEADER];
        header[..auth::MAGIC.len()].copy_from_slice(&auth::MAGIC);
        header[auth::HELLO_HEADER - 2..].copy_from_slice(&u16::MAX.to_le_bytes());
        s.write_all(&header).unwrap();
    });
    stranger("wrong secret", &|s| {
        s.set_read_timeout(Some(LONG)).unwrap();
        let other = Secret::random().unwrap();
        let r = auth::client_handshake(s, &other, b"oxccl-store", b"");
        assert!(
            matches!(r, Err(oxccl_transport::TransportError::Auth(_))),
            "{r:?}"
        );
        // Send a proof anyway: the server must check it and refuse.
        s.write_all(&[0u8; auth::MAC_LEN]).unwrap();
    });
    stranger("wrong secret, then silence", &|s| {
        s.set_read_timeout(Some(LONG)).unwrap();
        let other = Secret::random().unwrap();
        assert!(auth::client_handshake(s, &other, b"oxccl-store", b"").is_err());
    });
    stranger("silent", &|_| {});
    stranger("half a hello", &|s| s.write_all(&auth::MAGIC).unwrap());
    stranger("oversized frame", &|s| {
        s.set_read_timeout(Some(LONG)).unwrap();
        auth::client_handshake(s, &secret, b"oxccl-store", b"").unwrap();
        s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    });
    stranger("garbage request", &|s| {
        s.set_read_timeout(Some(LONG)).unwrap();
        auth::client_handshake(s, &secret, b"oxccl-store", b"").unwrap();
        s.write_all(&[3, 0, 0, 0, 99, 1, 2]).unwrap();
    });

    assert!(!busy.is_finished());
    client.set("the-end", b"done").unwrap();
    assert_eq!(busy.join().unwrap().unwrap(), b"done");
    still_works(&client, "after");

    let logs = log_text();
    for (what, peer) in peers {
        assert!(
            logs.lines()
                .any(|l| l.contains(&peer.to_string()) && l.contains("dropping connection")),
            "no warning naming {what} stranger {peer} in:\n{logs}"
        );
    }
}

#[test]
fn connections_over_the_limit_are_closed_at_once() {
    let secret = Secret::random().unwrap();
    let limits = ServerLimits {
        handshake_timeout: LONG,
        max_connections: 3,
        ..ServerLimits::default()
    };
    let server = StoreServer::bind_with(localhost(), secret.clone(), limits).unwrap();
    let client = TcpStore::connect(server.local_addr(), &secret, soon()).unwrap();
    // Two more clients that got in (connections in their handshake would make room instead).
    let idle: Vec<TcpStore> = (0..2)
        .map(|_| TcpStore::connect(server.local_addr(), &secret, soon()).unwrap())
        .collect();
    // A request each: the store has seen their proofs (not still in the handshake).
    for (i, c) in idle.iter().enumerate() {
        still_works(c, &format!("idle {i}"));
    }
    still_works(&client, "first");
    thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    let mut flood = TcpStream::connect(server.local_addr()).unwrap();
    assert_closed_by_server(&mut flood, "connection over the limit");
    assert!(start.elapsed() < Duration::from_secs(2));
    still_works(&client, "at the limit");
}

#[test]
fn silent_strangers_cannot_keep_clients_out() {
    let secret = Secret::random().unwrap();
    let limits = ServerLimits {
        handshake_timeout: LONG,
        max_unauthenticated: 4,
        ..ServerLimits::default()
    };
    let server = StoreServer::bind_with(localhost(), secret.clone(), limits).unwrap();
    // Strangers that connect and say nothing, far more than the handshake limit.
    let mut silent: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(server.local_addr()).unwrap())
        .collect();
    thread::sleep(Duration::from_millis(50));
    // A client still gets in at once (the oldest silent ones make room), and works.
    let start = Instant::now();
    let client = TcpStore::connect(server.local_addr(), &secret, soon()).unwrap();
    still_works(&client, "among silent strangers");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // The first strangers were dropped; at most the limit of them still waits.
    assert_closed_by_server(&mut silent[0], "the oldest silent stranger");
    let _ = silent.drain(..);
}

#[test]
fn a_client_whose_server_is_dropped_gets_an_error_not_a_hang() {
    let (server, client, _) = tcp_pair();
    still_works(&client, "alive");
    let parked = {
        let c = client.clone();
        thread::spawn(move || c.get("never", Instant::now() + Duration::from_secs(60)))
    };
    thread::sleep(SHORT);
    let start = Instant::now();
    drop(server);
    let err = parked.join().unwrap().unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    assert!(err.to_string().contains("closed the connection"), "{err}");
    let err = client.set("after", b"").unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3), "{err}");
}

#[test]
fn connect_waits_for_a_late_server_and_gives_up_at_the_deadline() {
    let secret = Secret::random().unwrap();
    let addr = {
        let l = TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap()
    };
    let connecting = {
        let secret = secret.clone();
        thread::spawn(move || TcpStore::connect(addr, &secret, soon()))
    };
    thread::sleep(Duration::from_millis(200));
    let _server = StoreServer::bind(addr, secret.clone()).unwrap();
    let client = connecting.join().unwrap().unwrap();
    still_works(&client, "late server");

    let nobody = {
        let l = TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap()
    };
    let start = Instant::now();
    let err = TcpStore::connect(nobody, &secret, Instant::now() + SHORT).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(err.to_string().contains(&nobody.to_string()), "{err}");

    let err = TcpStore::connect(addr, &Secret::random().unwrap(), soon()).unwrap_err();
    assert!(matches!(err, Error::Bootstrap(_)), "{err:?}");
    assert!(err.to_string().contains("authentication"), "{err}");
}

#[test]
fn unique_id_round_trips_and_reaches_its_store() {
    let id = UniqueId::new().unwrap();
    let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
    assert_eq!(back, id);
    assert_eq!(back.store_addr(), id.store_addr());
    assert_eq!(back.secret(), id.secret());
    assert_ne!(id.store_addr().port(), 0);
    let debug = format!("{id:?}");
    assert!(!debug.contains(&id.secret().to_hex()[..16]), "{debug}");
    assert!(debug.contains(&id.store_addr().to_string()), "{debug}");

    let store = back.connect(soon()).unwrap();
    still_works(&store, "unique id");
    let other = UniqueId::new().unwrap();
    assert_ne!(other, id);

    let secret = Secret::random().unwrap();
    for addr in ["[fd00::1%7]:29500", "[::1]:1", "10.1.2.3:65535"] {
        let addr: SocketAddr = addr.parse().unwrap();
        let id = UniqueId::from_parts(addr, &secret);
        let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
        assert_eq!(back.store_addr(), addr);
        assert_eq!(back.secret(), secret);
    }
}

#[test]
fn unique_id_rejects_garbage() {
    let good = *UniqueId::from_parts(
        "127.0.0.1:5000".parse().unwrap(),
        &Secret::random().unwrap(),
    )
    .as_bytes();
    assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
    assert!(UniqueId::from_bytes(&[0xa5u8; 128]).is_err());
    for i in [0, 8, 9, 10, 12, 40, 100, 127] {
        let mut bad = good;
        bad[i] ^= 0x10;
        assert!(
            UniqueId::from_bytes(&bad).is_err(),
            "flipped byte {i} accepted"
        );
    }
    let port0 = UniqueId::from_parts("127.0.0.1:0".parse().unwrap(), &Secret::random().unwrap());
    let err = UniqueId::from_bytes(port0.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(err.contains("port"), "{err}");
}

// ---- rendezvous from the environment ----

/// The variables `pairs`, with `HOME` at a path of its own unless given (reading the
/// environment touches no file: the user key is read or made only when the store is opened).
fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let mut map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    map.entry("HOME".into())
        .or_insert_with(|| "/nonexistent/oxccl-test-home".into());
    move |k| map.get(k).cloned()
}

fn read(pairs: &[(&str, &str)]) -> Rendezvous {
    Rendezvous::from_vars(vars(pairs))
        .unwrap()
        .expect("a launcher should be recognised")
}

fn fails(pairs: &[(&str, &str)], names: &[&str]) {
    let err = Rendezvous::from_vars(vars(pairs)).unwrap_err();
    assert!(matches!(err, Error::Bootstrap(_)), "{err:?}");
    let text = err.to_string();
    for name in names {
        assert!(text.contains(name), "error should name {name}: {text}");
    }
}

const TOKEN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

#[test]
fn rendezvous_from_oxrun() {
    let r = read(&[
        ("OXCCL_RANK", "2"),
        ("OXCCL_WORLD_SIZE", "4"),
        ("OXCCL_LOCAL_RANK", "2"),
        ("OXCCL_LOCAL_WORLD_SIZE", "4"),
        ("OXCCL_STORE", "127.0.0.1:4242"),
        ("OXCCL_TOKEN", TOKEN),
    ]);
    assert_eq!(
        (r.rank, r.world_size, r.local_rank, r.local_world_size),
        (2, 4, Some(2), Some(4))
    );
    assert_eq!(
        (r.store.as_str(), r.host_store, r.source),
        ("127.0.0.1:4242", false, "oxccl")
    );
    assert_eq!(r.secret, JobSecret::Given(Secret::from_hex(TOKEN).unwrap()));
    assert_eq!(r.store_addr().unwrap(), "127.0.0.1:4242".parse().unwrap());
    assert!(!format!("{r:?}").contains(TOKEN));

    let r = read(&[
        ("OXCCL_RANK", "0"),
        ("OXCCL_WORLD_SIZE", "1"),
        ("OXCCL_STORE", "[::1]:7"),
    ]);
    assert_eq!(
        (r.local_rank, r.store.as_str(), r.host_store),
        (None, "[::1]:7", false)
    );
}

#[test]
fn rendezvous_from_torchrun() {
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RUN_ID", "job-1"),
    ];
    let r = read(&base);
    assert_eq!(
        (r.rank, r.world_size, r.local_rank, r.local_world_size),
        (0, 8, Some(0), Some(4))
    );
    assert_eq!(
        (r.store.as_str(), r.host_store, r.source),
        ("node0:29500", true, "torchrun")
    );

    let mut rank5 = base.to_vec();
    rank5[0] = ("RANK", "5");
    rank5[2] = ("LOCAL_RANK", "1");
    let r5 = read(&rank5);
    assert!(!r5.host_store, "only rank 0 hosts the store");
    assert_eq!(
        r5.secret, r.secret,
        "ranks of one job derive the same secret"
    );

    let mut other_job = base.to_vec();
    other_job[6] = ("TORCHELASTIC_RUN_ID", "job-2");
    assert_ne!(
        read(&other_job).secret,
        r.secret,
        "another job derives another secret"
    );

    let mut external = base.to_vec();
    external.push(("OXCCL_STORE", "store-host:1234"));
    let r = read(&external);
    assert_eq!((r.store.as_str(), r.host_store), ("store-host:1234", false));

    let v6 = read(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "fd00::2"),
        ("MASTER_PORT", "80"),
    ]);
    assert_eq!(v6.store, "[fd00::2]:80");
}

#[test]
fn rendezvous_under_torchrun_agent_store_is_a_torch_client() {
    // What torchrun (c10d rendezvous) gives each worker: its agent serves a TCPStore on
    // MASTER_PORT, so no rank may host one there.
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "localhost"),
        ("MASTER_PORT", "38119"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_RUN_ID", "run-7"),
        ("TORCHELASTIC_RESTART_COUNT", "2"),
    ];
    let namespace = StoreProtocol::Torch {
        namespace: "oxccl/run-7/attempt2".into(),
    };
    for rank in ["0", "1"] {
        let mut env = base.to_vec();
        env[0] = ("RANK", rank);
        env[2] = ("LOCAL_RANK", rank);
        let r = read(&env);
        assert_eq!(
            (r.store.as_str(), r.host_store, r.source, &r.protocol),
            ("localhost:38119", false, "torchrun", &namespace),
            "rank {rank}"
        );
        assert_eq!(
            r.secret,
            JobSecret::Published,
            "rank 0 draws the secret in open_store"
        );
    }

    // A token is used as is (and never published).
    let mut token = base.to_vec();
    token.push(("OXCCL_TOKEN", TOKEN));
    assert_eq!(
        read(&token).secret.given(),
        Secret::from_hex(TOKEN).as_ref()
    );

    // Only exactly "True" (what torchrun sets, and what torch itself tests) means the agent
    // store; anything else leaves rank 0 hosting oxccl's store, as before.
    for other in ["False", "true", "1"] {
        let mut env = base.to_vec();
        env[6] = ("TORCHELASTIC_USE_AGENT_STORE", other);
        let r = read(&env);
        assert_eq!(
            (r.host_store, &r.protocol),
            (true, &StoreProtocol::Oxccl),
            "{other}"
        );
        assert!(matches!(r.secret, JobSecret::UserKey { .. }), "{other}");
    }

    // OXCCL_STORE_PROTOCOL=oxccl overrides the agent store: rank 0 hosts oxccl's store.
    let mut forced = base.to_vec();
    forced.push(("OXCCL_STORE_PROTOCOL", "oxccl"));
    let r = read(&forced);
    assert_eq!((r.host_store, &r.protocol), (true, &StoreProtocol::Oxccl));

    // The agent store is torchrun's: other launchers' MASTER_* stay rank 0's oxccl store.
    let r = read(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "9"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ]);
    assert_eq!((r.host_store, &r.protocol), (true, &StoreProtocol::Oxccl));
}

#[test]
fn rendezvous_with_a_torch_store_someone_else_runs() {
    // torch.distributed's own store on rank 0 (init_process_group("env://")), no torchrun
    // agent: OXCCL_STORE_PROTOCOL=torch makes every rank a client of MASTER_ADDR:MASTER_PORT.
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("OXCCL_STORE_PROTOCOL", "torch"),
    ];
    let r = read(&base);
    assert_eq!((r.store.as_str(), r.host_store), ("10.0.0.1:29500", false));
    assert_eq!(
        r.protocol,
        StoreProtocol::Torch {
            namespace: "oxccl/default".into()
        }
    );
    assert_eq!(r.secret, JobSecret::Published);

    // With OXCCL_STORE, under any launcher, and named by a job id.
    let r = read(&[
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_ID", "77"),
        ("OXCCL_STORE", "store:5000"),
        ("OXCCL_STORE_PROTOCOL", "torch"),
    ]);
    assert_eq!(
        (r.store.as_str(), r.host_store, &r.protocol),
        (
            "store:5000",
            false,
            &StoreProtocol::Torch {
                namespace: "oxccl/77".into()
            }
        )
    );
    let r = read(&[
        ("OXCCL_RANK", "0"),
        ("OXCCL_WORLD_SIZE", "1"),
        ("OXCCL_STORE", "127.0.0.1:1"),
        ("OXCCL_STORE_PROTOCOL", "torch"),
    ]);
    assert!(matches!(r.protocol, StoreProtocol::Torch { .. }));

    // Without the variable, OXCCL_STORE is oxccl's store, as before.
    let r = read(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("OXCCL_STORE", "h:1"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ]);
    assert_eq!((r.host_store, &r.protocol), (false, &StoreProtocol::Oxccl));

    let mut wrong = base.to_vec();
    wrong[4] = ("OXCCL_STORE_PROTOCOL", "gloo");
    fails(&wrong, &["OXCCL_STORE_PROTOCOL", "gloo"]);
}

#[test]
fn rendezvous_from_slurm_openmpi_and_pmi() {
    let r = read(&[
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_JOB_ID", "77"),
        ("OXCCL_STORE", "10.0.0.1:5000"),
    ]);
    assert_eq!(
        (r.rank, r.world_size, r.local_rank, r.source),
        (3, 4, Some(1), "slurm")
    );
    assert_eq!((r.store.as_str(), r.host_store), ("10.0.0.1:5000", false));

    let r = read(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "5000"),
    ]);
    assert_eq!((r.store.as_str(), r.host_store), ("10.0.0.1:5000", true));

    let r = read(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OXCCL_STORE", "h:1"),
        ("OXCCL_TOKEN", TOKEN),
    ]);
    assert_eq!(
        (r.rank, r.world_size, r.local_rank, r.local_world_size),
        (1, 2, Some(1), Some(2))
    );
    assert_eq!(
        (r.source, r.secret.given()),
        ("openmpi", Secret::from_hex(TOKEN).as_ref())
    );

    let r = read(&[
        ("PMI_RANK", "0"),
        ("PMI_SIZE", "3"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "9"),
    ]);
    assert_eq!(
        (r.rank, r.world_size, r.local_rank, r.source, r.host_store),
        (0, 3, None, "pmi", true)
    );
}

#[test]
fn rendezvous_precedence() {
    let all = [
        ("OXCCL_RANK", "1"),
        ("OXCCL_WORLD_SIZE", "2"),
        ("OXCCL_STORE", "127.0.0.1:1"),
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "m"),
        ("MASTER_PORT", "2"),
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "6"),
        ("OMPI_COMM_WORLD_RANK", "7"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("PMI_RANK", "9"),
        ("PMI_SIZE", "10"),
    ];
    // Each launcher wins over those below it; removing its variables exposes the next one.
    let mut env = all.to_vec();
    for (source, rank, owned) in [
        ("oxccl", 1, ["OXCCL_RANK", "OXCCL_WORLD_SIZE"]),
        ("torchrun", 3, ["RANK", "WORLD_SIZE"]),
        ("slurm", 5, ["SLURM_PROCID", "SLURM_NTASKS"]),
        (
            "openmpi",
            7,
            ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"],
        ),
        ("pmi", 9, ["PMI_RANK", "PMI_SIZE"]),
    ] {
        let r = read(&env);
        assert_eq!((r.source, r.rank), (source, rank), "with {env:?}");
        env.retain(|(k, _)| !owned.contains(k));
    }
    assert!(Rendezvous::from_vars(vars(&[])).unwrap().is_none());
    assert!(
        Rendezvous::from_vars(vars(&[("MASTER_ADDR", "x"), ("LOCAL_RANK", "0")]))
            .unwrap()
            .is_none()
    );
    assert!(
        Rendezvous::from_vars(vars(&[("RANK", "")]))
            .unwrap()
            .is_none(),
        "empty counts as unset"
    );
}

#[test]
fn rendezvous_errors_name_the_variable() {
    let store = ("OXCCL_STORE", "h:1");
    fails(
        &[("OXCCL_RANK", "0"), ("OXCCL_WORLD_SIZE", "2")],
        &["OXCCL_STORE"],
    );
    fails(&[("OXCCL_WORLD_SIZE", "2"), store], &["OXCCL_RANK"]);
    fails(&[("OXCCL_RANK", "0"), store], &["OXCCL_WORLD_SIZE"]);
    fails(
        &[("OXCCL_RANK", "x"), ("OXCCL_WORLD_SIZE", "2"), store],
        &["OXCCL_RANK", "\"x\""],
    );
    fails(
        &[("OXCCL_RANK", "-1"), ("OXCCL_WORLD_SIZE", "2"), store],
        &["OXCCL_RANK"],
    );
    fails(
        &[("OXCCL_RANK", "2"), ("OXCCL_WORLD_SIZE", "2"), store],
        &["OXCCL_RANK", "OXCCL_WORLD_SIZE"],
    );
    fails(
        &[("OXCCL_RANK", "0"), ("OXCCL_WORLD_SIZE", "0"), store],
        &["OXCCL_WORLD_SIZE"],
    );
    fails(
        &[
            ("OXCCL_RANK", "0"),
            ("OXCCL_WORLD_SIZE", "2"),
            ("OXCCL_LOCAL_RANK", "x"),
            store,
        ],
        &["OXCCL_LOCAL_RANK"],
    );
    fails(
        &[
            ("OXCCL_RANK", "0"),
            ("OXCCL_WORLD_SIZE", "2"),
            ("OXCCL_LOCAL_RANK", "2"),
            ("OXCCL_LOCAL_WORLD_SIZE", "2"),
            store,
        ],
        &["OXCCL_LOCAL_RANK", "OXCCL_LOCAL_WORLD_SIZE"],
    );
    fails(
        &[
            ("OXCCL_RANK", "0"),
            ("OXCCL_WORLD_SIZE", "2"),
            ("OXCCL_LOCAL_WORLD_SIZE", "3"),
            store,
        ],
        &["OXCCL_LOCAL_WORLD_SIZE"],
    );
    for bad_store in ["nohost", "h:", ":5", "h:0", "h:70000", "h:x", "::1::2:5"] {
        fails(
            &[
                ("OXCCL_RANK", "0"),
                ("OXCCL_WORLD_SIZE", "1"),
                ("OXCCL_STORE", bad_store),
            ],
            &["OXCCL_STORE"],
        );
    }
    fails(
        &[
            ("OXCCL_RANK", "0"),
            ("OXCCL_WORLD_SIZE", "1"),
            store,
            ("OXCCL_TOKEN", "abc"),
        ],
        &["OXCCL_TOKEN"],
    );
    fails(
        &[
            ("OXCCL_RANK", "0"),
            ("OXCCL_WORLD_SIZE", "1"),
            store,
            ("OXCCL_TOKEN", &"zz".repeat(32)),
        ],
        &["OXCCL_TOKEN"],
    );

    fails(
        &[("RANK", "0"), ("WORLD_SIZE", "2")],
        &["MASTER_ADDR", "OXCCL_STORE"],
    );
    fails(
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "m")],
        &["MASTER_PORT"],
    );
    fails(
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "m"),
            ("MASTER_PORT", "http"),
        ],
        &["MASTER_PORT"],
    );
    fails(&[("RANK", "0"), store], &["WORLD_SIZE"]);
    fails(
        &[("RANK", "4"), ("WORLD_SIZE", "4"), store],
        &["RANK=4", "WORLD_SIZE=4"],
    );
    fails(
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "?"),
            store,
        ],
        &["LOCAL_RANK"],
    );
    fails(
        &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
        &["slurm", "OXCCL_STORE", "MASTER_ADDR"],
    );
    fails(
        &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "two"), store],
        &["SLURM_NTASKS"],
    );
    fails(
        &[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "x"),
            store,
        ],
        &["SLURM_LOCALID"],
    );
    fails(
        &[("OMPI_COMM_WORLD_RANK", "0"), store],
        &["OMPI_COMM_WORLD_SIZE"],
    );
    fails(
        &[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            store,
        ],
        &["OMPI_COMM_WORLD_RANK"],
    );
    fails(
        &[("PMI_RANK", "0"), ("PMI_SIZE", "1")],
        &["pmi", "OXCCL_STORE"],
    );
    fails(
        &[("PMI_RANK", "0"), ("PMI_SIZE", "1.5"), store],
        &["PMI_SIZE"],
    );
}

#[test]
fn rendezvous_opens_the_store_it_hosts() {
    let port = {
        let l = TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap().port()
    };
    let port = port.to_string();
    let env = |rank: &'static str| {
        read(&[
            ("RANK", rank),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
            ("OXCCL_TOKEN", TOKEN),
        ])
    };
    let r1 = env("1");
    let joiner = thread::spawn(move || {
        let opened = r1.open_store(soon()).unwrap();
        assert!(opened.server.is_none());
        opened.store.get("hello", soon()).unwrap()
    });
    let opened = env("0").open_store(soon()).unwrap();
    // It listens on the store's address only, not on every interface.
    let listening = opened
        .server
        .as_ref()
        .expect("rank 0 hosts the store")
        .local_addr();
    assert_eq!(listening, format!("127.0.0.1:{port}").parse().unwrap());
    assert_eq!(opened.secret, Secret::from_hex(TOKEN).unwrap());
    opened.store.set("hello", b"rank 0 here").unwrap();
    assert_eq!(joiner.join().unwrap(), b"rank 0 here");
}

/// A host name that resolves to loopback here may name this host's real address elsewhere
/// (Debian's 127.0.1.1), so the store then listens on every interface.
#[test]
fn a_store_named_by_a_loopback_host_name_listens_everywhere() {
    let port = {
        let l = TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap().port()
    };
    let port = port.to_string();
    let r = read(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "localhost"),
        ("MASTER_PORT", &port),
        ("OXCCL_TOKEN", TOKEN),
    ]);
    let opened = r.open_store(soon()).unwrap();
    let listening = opened
        .server
        .as_ref()
        .expect("rank 0 hosts the store")
        .local_addr();
    assert!(listening.ip().is_unspecified(), "{listening}");
    opened.store.set("k", b"v").unwrap();
}

#[test]
fn ranks_that_set_get_and_leave_never_strand_a_waiter() {
    // Each round, ranks set their key, read everyone's, and disconnect; a rank's last set can
    // reach the server together with its disconnect, and must still wake the others at once.
    for round in 0..100 {
        let (_server, client, secret) = tcp_pair();
        let start = Instant::now();
        let ranks: Vec<_> = (0..4)
            .map(|r| {
                let c = TcpStore::connect(client.addr(), &secret, soon()).unwrap();
                thread::spawn(move || {
                    c.set(&format!("k{r}"), b"v").unwrap();
                    for p in 0..4 {
                        c.get(&format!("k{p}"), soon()).unwrap();
                    }
                })
            })
            .collect();
        for h in ranks {
            h.join().unwrap();
        }
        let took = start.elapsed();
        assert!(took < Duration::from_secs(3), "round {round} took {took:?}");
    }
}

#[test]
fn a_set_sent_just_before_hanging_up_wakes_waiters() {
    let (server, client, secret) = tcp_pair();
    let getter = {
        let c = client.clone();
        thread::spawn(move || c.get("parting-gift", soon()))
    };
    thread::sleep(SHORT);
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    raw.set_read_timeout(Some(LONG)).unwrap();
    auth::client_handshake(&mut raw, &secret, b"oxccl-store", b"").unwrap();
    let key = b"parting-gift";
    let mut frame = Vec::new();
    frame.extend_from_slice(&((1 + 4 + key.len() + 2) as u32).to_le_bytes());
    frame.push(1); // SET
    frame.extend_from_slice(&(key.len() as u32).to_le_bytes());
    frame.extend_from_slice(key);
    frame.extend_from_slice(b"ok");
    let start = Instant::now();
    raw.write_all(&frame).unwrap();
    drop(raw);
    assert_eq!(getter.join().unwrap().unwrap(), b"ok");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
}

/// `OXCCL_TOKEN_FILE`: the secret from a file only this user may read; a file others can read
/// or write, a wrong content, a missing file or both variables at once are refused, naming
/// the variable and the file.
#[test]
fn the_secret_can_come_from_a_private_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("oxccl-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let mode =
        |m: u32| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m)).unwrap();
    mode(0o600);
    let path = file.to_str().unwrap();
    let base = [
        ("OXCCL_RANK", "0"),
        ("OXCCL_WORLD_SIZE", "1"),
        ("OXCCL_STORE", "127.0.0.1:4242"),
    ];
    let with = |extra: &[(&'static str, &str)]| -> Vec<(&str, String)> {
        base.iter()
            .map(|&(k, v)| (k, v.to_owned()))
            .chain(extra.iter().map(|&(k, v)| (k, v.to_owned())))
            .collect()
    };
    let pairs = with(&[("OXCCL_TOKEN_FILE", path)]);
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(read(&refs).secret.given(), Secret::from_hex(TOKEN).as_ref());
    // Readable by the group, or by everyone: refused.
    for m in [0o640, 0o604, 0o620] {
        mode(m);
        fails(&refs, &["OXCCL_TOKEN_FILE", path, "chmod 600"]);
    }
    mode(0o400);
    assert_eq!(read(&refs).secret.given(), Secret::from_hex(TOKEN).as_ref());
    // Another user's file (only root can hand one over; elsewhere this part is skipped).
    if std::os::unix::fs::chown(&file, Some(65534), None).is_ok() {
        fails(&refs, &["OXCCL_TOKEN_FILE", "belongs to uid 65534"]);
        let me = std::fs::metadata(&dir).map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.uid()
        });
        std::os::unix::fs::chown(&file, me.ok(), None).unwrap();
    }
    // Not a secret, not a file, or said twice.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&file, "not hex").unwrap();
    fails(&refs, &["OXCCL_TOKEN_FILE", "64 hex digits"]);
    std::fs::write(&file, "0".repeat(4096)).unwrap();
    fails(&refs, &["OXCCL_TOKEN_FILE", "1 KiB"]);
    let gone = dir.join("missing");
    let pairs = with(&[("OXCCL_TOKEN_FILE", gone.to_str().unwrap())]);
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    fails(&refs, &["OXCCL_TOKEN_FILE", "missing"]);
    let pairs = with(&[("OXCCL_TOKEN_FILE", dir.to_str().unwrap())]);
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    fails(&refs, &["OXCCL_TOKEN_FILE", "regular file"]);
    let pairs = with(&[("OXCCL_TOKEN_FILE", path), ("OXCCL_TOKEN", TOKEN)]);
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    fails(&refs, &["OXCCL_TOKEN_FILE", "OXCCL_TOKEN"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a token, a job that hosts oxccl's store takes its secret from this user's key: made
/// on first use (0600 in a 0700 directory), the same for every rank that starts at once, and
/// refused when others may read it. Two ranks with the same key meet; a rank with another key
/// (a host that does not share the home directory) fails at once naming its key file; a
/// stranger who knows every public fact of the job (what the secret used to be derived from)
/// cannot join.
#[test]
fn without_a_token_the_secret_comes_from_the_users_key() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = std::env::temp_dir().join(format!("oxccl-userkey-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let key = dir.join("a").join("oxccl").join("key");

    // Eight ranks starting at once on a fresh home all end up with one key.
    let keys: Vec<Secret> = (0..8)
        .map(|_| {
            let key = key.clone();
            thread::spawn(move || oxccl::bootstrap::user_key(&key).unwrap())
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(keys.iter().all(|k| *k == keys[0]));
    assert_eq!(oxccl::bootstrap::user_key(&key).unwrap(), keys[0]);
    let meta = std::fs::metadata(&key).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(key.parent().unwrap()).unwrap().mode() & 0o077,
        0
    );
    let leftovers: Vec<_> = std::fs::read_dir(key.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["key"], "no temporary files left behind");
    // A key others may read protects nothing: refused, naming the file.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = oxccl::bootstrap::user_key(&key).unwrap_err().to_string();
    assert!(
        err.contains("user key")
            && err.contains(&key.display().to_string())
            && err.contains("chmod 600"),
        "{err}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();

    let port = {
        let l = TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap().port()
    };
    let port = port.to_string();
    let config_a = dir.join("a");
    let config_b = dir.join("b");
    let env = |rank: &'static str, config: &std::path::Path| {
        read(&[
            ("RANK", rank),
            ("WORLD_SIZE", "3"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
            ("XDG_CONFIG_HOME", config.to_str().unwrap()),
        ])
    };
    let r0 = env("0", &config_a);
    match &r0.secret {
        JobSecret::UserKey { file, .. } => assert_eq!(file, &key),
        other => panic!("{other:?}"),
    }
    let job_secret = r0.secret.resolve().unwrap().unwrap();
    assert_ne!(job_secret, keys[0], "the key itself never goes on the wire");
    let opened = r0.open_store(soon()).unwrap();
    assert_eq!(opened.secret, job_secret);
    // Another rank with the same key (same host, or a shared home) joins.
    let r1 = env("1", &config_a).open_store(soon()).unwrap();
    r1.store.set("hello", b"1").unwrap();
    assert_eq!(opened.store.get("hello", soon()).unwrap(), b"1");
    // A rank with a key of its own fails at once, and says why.
    let start = Instant::now();
    let err = env("2", &config_b)
        .open_store(soon())
        .unwrap_err()
        .to_string();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(
        err.contains("rank 2")
            && err.contains(&config_b.join("oxccl").join("key").display().to_string())
            && err.contains("OXCCL_TOKEN"),
        "{err}"
    );
    // The public facts alone, as the secret used to be derived, do not open the store.
    let material = format!("oxccl job\0store=127.0.0.1:{port}\0world_size=3");
    let stranger = TcpStore::connect(opened.addr, &Secret::derive(material.as_bytes()), soon());
    assert!(stranger.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
