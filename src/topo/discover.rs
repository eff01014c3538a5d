//! What this process sees of its host: NUMA nodes with their cores and memory, its CPU binding,
//! the caches, the NICs (addresses, speed, NUMA node, RDMA devices on them) and the GPUs (PCI
//! bus id, NUMA node; NVLinks and peer-to-peer reachability from NVML where it is present), read
//! from `/sys` and `/proc` under a root that tests point at a fixture tree. Anything unreadable is
//! left out or marked unknown: discovery never fails.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::{Cache, Gpu, Host, Nic, NumaNode, NvLink, Place, cpulist, nvml};

/// This host's hardware and this process's place on it, read under `root` ("/" in real use);
/// `id` and `name` are the host identity and host name, `nic` the interface TCP uses, `nvml`
/// the NVML library to ask about NVIDIA GPUs and how long to wait for its answer (`None`: do
/// not load it).
pub(crate) fn local(
    root: &Path,
    id: &str,
    name: &str,
    nic: Option<String>,
    nvml: Option<(&Path, Duration)>,
) -> (Host, Place) {
    let numa = numa_nodes(root);
    let cpus = allowed_cpus(root);
    let mut nodes: Vec<u32> = numa
        .iter()
        .filter(|n| {
            let theirs = cpulist::parse(&n.cpus);
            cpulist::parse(&cpus).iter().any(|c| theirs.contains(c))
        })
        .map(|n| n.id)
        .collect();
    nodes.dedup();
    let host = Host {
        id: id.to_owned(),
        name: name.to_owned(),
        numa,
        caches: caches(root),
        nics: nics(root),
        gpus: gpus(root, nvml),
    };
    let place = Place {
        host: 0,
        pid: std::process::id(),
        cpus,
        numa: nodes,
        nic,
        rdma: None,
        kernel: super::kernel_id(),
    };
    (host, place)
}

fn read(root: &Path, path: &str) -> Option<String> {
    fs::read_to_string(root.join(path.trim_start_matches('/')))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Names in a directory, sorted (empty when it cannot be read).
fn entries(root: &Path, path: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root.join(path.trim_start_matches('/')))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort_by_key(|n| natural(n));
    names
}

/// Sort key that orders `node2` before `node10`.
fn natural(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, num) = name.split_at(name.len() - digits);
    (stem.to_owned(), num.parse().unwrap_or(0))
}

/// The NUMA nodes; one node holding every online CPU and all memory where the kernel shows
/// none.
fn numa_nodes(root: &Path) -> Vec<NumaNode> {
    let mut nodes: Vec<NumaNode> = entries(root, "/sys/devices/system/node")
        .into_iter()
        .filter_map(|e| {
            let id: u32 = e.strip_prefix("node")?.parse().ok()?;
            let dir = format!("/sys/devices/system/node/{e}");
            let cpus = read(root, &format!("{dir}/cpulist")).unwrap_or_default();
            let memory_bytes = read(root, &format!("{dir}/meminfo"))
                .and_then(|m| kib_after(&m, "MemTotal:"))
                .unwrap_or(0);
            Some(NumaNode {
                id,
                cpus,
                memory_bytes,
            })
        })
        .collect();
    if nodes.is_empty() {
        nodes.push(NumaNode {
            id: 0,
            cpus: read(root, "/sys/devices/system/cpu/online").unwrap_or_default(),
            memory_bytes: read(root, "/proc/meminfo")
                .and_then(|m| kib_after(&m, "MemTotal:"))
                .unwrap_or(0),
        });
    }
    nodes
}

/// The `N kB` figure after `key` in a meminfo text, in bytes.
fn kib_after(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.contains(key))?;
    let after = line.split(key).nth(1)?;
    let kib: u64 = after.split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The CPUs this thread may run on (Linux cpulist syntax).
fn allowed_cpus(root: &Path) -> String {
    ["/proc/thread-self/status", "/proc/self/status"]
        .iter()
        .find_map(|p| {
            let status = read(root, p)?;
            let line = status
                .lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))?;
            Some(line["Cpus_allowed_list:".len()..].trim().to_owned())
        })
        .unwrap_or_default()
}

/// The caches CPU 0 sees, smallest level first.
fn caches(root: &Path) -> Vec<Cache> {
    let base = "/sys/devices/system/cpu/cpu0/cache";
    entries(root, base)
        .into_iter()
        .filter(|e| e.starts_with("index"))
        .filter_map(|e| {
            let dir = format!("{base}/{e}");
            let level: u8 = read(root, &format!("{dir}/level"))?.parse().ok()?;
            let kind = read(root, &format!("{dir}/type")).unwrap_or_default();
            let bytes = size_bytes(&read(root, &format!("{dir}/size"))?)?;
            let shared_by = read(root, &format!("{dir}/shared_cpu_list"))
                .map(|l| cpulist::parse(&l).len() as u32)
                .unwrap_or(1);
            Some(Cache {
                level,
                kind,
                bytes,
                shared_by,
            })
        })
        .collect()
}

/// `48K`, `2048K`, `32M` as bytes.
fn size_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().ok()?;
    let mult = match unit.trim() {
        "" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// A NUMA node from a sysfs `numa_node` file (-1 and missing mean unknown).
fn numa_of(root: &Path, path: &str) -> Option<i32> {
    read(root, path)?.parse().ok().filter(|&n: &i32| n >= 0)
}

/// The network interfaces but loopback, with their speed, NUMA node, addresses (from the
/// kernel, only when `root` is the real one) and the RDMA devices that sit on them.
fn nics(root: &Path) -> Vec<Nic> {
    let real = root == Path::new("/");
    let addrs = if real {
        if_addrs::get_if_addrs().unwrap_or_default()
    } else {
        Vec::new()
    };
    // RDMA devices name their network device in `parent` (rxe, siw) or share its PCI device.
    let rdma: Vec<(String, Option<String>, Option<String>)> =
        entries(root, "/sys/class/infiniband")
            .into_iter()
            .map(|d| {
                let parent = read(root, &format!("/sys/class/infiniband/{d}/parent"));
                let device =
                    fs::canonicalize(root.join(format!("sys/class/infiniband/{d}/device")))
                        .ok()
                        .map(|p| p.display().to_string());
                (d, parent, device)
            })
            .collect();
    entries(root, "/sys/class/net")
        .into_iter()
        .filter(|n| n != "lo")
        .map(|name| {
            let dir = format!("/sys/class/net/{name}");
            let speed_mbps = read(root, &format!("{dir}/speed"))
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&s| s > 0)
                .map(|s| s as u64);
            let device = fs::canonicalize(root.join(format!("sys/class/net/{name}/device")))
                .ok()
                .map(|p| p.display().to_string());
            let on_it = rdma
                .iter()
                .filter(|(_, parent, dev)| {
                    parent.as_deref() == Some(name.as_str()) || (dev.is_some() && *dev == device)
                })
                .map(|(d, _, _)| d.clone())
                .collect();
            let mut addresses: Vec<String> = addrs
                .iter()
                .filter(|a| a.name == name)
                .map(|a| a.ip().to_string())
                .collect();
            addresses.sort();
            Nic {
                numa: numa_of(root, &format!("{dir}/device/numa_node")),
                name,
                addresses,
                speed_mbps,
                rdma: on_it,
            }
        })
        .collect()
}

/// PCI display and 3D controllers (class 0x0300, 0x0302) of NVIDIA (0x10de) and AMD (0x1002);
/// for the NVIDIA ones, what the NVML library at `nvml` says of their NVLinks and peer-to-peer
/// reachability within the time given with it (loaded only when there is an NVIDIA GPU).
fn gpus(root: &Path, nvml: Option<(&Path, Duration)>) -> Vec<Gpu> {
    let mut gpus: Vec<Gpu> = entries(root, "/sys/bus/pci/devices")
        .into_iter()
        .filter_map(|bus| {
            let dir = format!("/sys/bus/pci/devices/{bus}");
            let class = read(root, &format!("{dir}/class"))?;
            let vendor = read(root, &format!("{dir}/vendor"))?;
            let display = class.starts_with("0x0300") || class.starts_with("0x0302");
            let gpu_vendor = vendor == "0x10de" || vendor == "0x1002";
            (display && gpu_vendor).then(|| Gpu {
                device: read(root, &format!("{dir}/device")).unwrap_or_default(),
                numa: numa_of(root, &format!("{dir}/numa_node")),
                pci: bus,
                vendor,
                nvlinks: Vec::new(),
                p2p: None,
            })
        })
        .collect();
    let nvidia: Vec<String> = gpus
        .iter()
        .filter(|g| g.vendor == "0x10de")
        .map(|g| g.pci.clone())
        .collect();
    let Some(reach) = nvml
        .filter(|_| !nvidia.is_empty())
        .and_then(|(lib, within)| nvml::query(lib, &nvidia, within))
    else {
        return gpus;
    };
    let known: Vec<String> = gpus.iter().map(|g| g.pci.clone()).collect();
    for (bus, r) in nvidia.iter().zip(reach) {
        let Some(r) = r else { continue };
        let Some(g) = gpus.iter_mut().find(|g| &g.pci == bus) else {
            continue;
        };
        for end in r.nvlinks {
            match g.nvlinks.iter_mut().find(|l| l.peer == end) {
                Some(l) => l.links += 1,
                None => g.nvlinks.push(NvLink {
                    kind: link_end_kind(root, &end, &known),
                    peer: end,
                    links: 1,
                }),
            }
        }
        g.p2p = Some(r.p2p);
    }
    gpus
}

/// What sits at the far end of an NVLink: `gpu` (one of this host's), `nvswitch` (a PCI bridge
/// of class 0x0680, as NVSwitches show themselves), `cpu` (an IBM NPU, vendor 0x1014) or `other`.
fn link_end_kind(root: &Path, bus: &str, gpus: &[String]) -> String {
    if gpus.iter().any(|g| g == bus) {
        return "gpu".into();
    }
    let dir = format!("/sys/bus/pci/devices/{bus}");
    let class = read(root, &format!("{dir}/class")).unwrap_or_default();
    let vendor = read(root, &format!("{dir}/vendor")).unwrap_or_default();
    match (class.starts_with("0x0680"), vendor.as_str()) {
        (true, "0x1014") => "cpu".into(),
        (true, _) => "nvswitch".into(),
        _ => "other".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Writes `text` at `path` under `root`, making the directories.
    fn put(root: &Path, path: &str, text: &str) {
        let p = root.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    /// A sysfs/procfs fixture: a two-socket host with a GPU, a NIC with an RDMA device and a
    /// virtual one without a PCI device.
    fn fixture() -> PathBuf {
        let root = std::env::temp_dir().join(format!("oxccl-topo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let put = |path: &str, text: &str| put(&root, path, text);
        put("sys/devices/system/node/node0/cpulist", "0-3\n");
        put(
            "sys/devices/system/node/node0/meminfo",
            "Node 0 MemTotal:       1024 kB\nNode 0 MemFree: 5 kB\n",
        );
        put("sys/devices/system/node/node1/cpulist", "4-7\n");
        put(
            "sys/devices/system/node/node1/meminfo",
            "Node 1 MemTotal:       2048 kB\n",
        );
        put("sys/devices/system/node/possible", "0-1\n");
        put(
            "proc/thread-self/status",
            "Name: x\nCpus_allowed_list:\t2-5\n",
        );
        for (i, level, kind, size, shared) in [
            (0, "1", "Data", "48K", "0"),
            (1, "1", "Instruction", "32K", "0"),
            (2, "2", "Unified", "2048K", "0"),
            (3, "3", "Unified", "32M", "0-3"),
        ] {
            let d = format!("sys/devices/system/cpu/cpu0/cache/index{i}");
            put(&format!("{d}/level"), level);
            put(&format!("{d}/type"), kind);
            put(&format!("{d}/size"), size);
            put(&format!("{d}/shared_cpu_list"), shared);
        }
        put("sys/bus/pci/devices/0000:3b:00.0/class", "0x030200\n");
        put("sys/bus/pci/devices/0000:3b:00.0/vendor", "0x10de\n");
        put("sys/bus/pci/devices/0000:3b:00.0/device", "0x2330\n");
        put("sys/bus/pci/devices/0000:3b:00.0/numa_node", "1\n");
        put("sys/bus/pci/devices/0000:5e:00.0/class", "0x020000\n");
        put("sys/bus/pci/devices/0000:5e:00.0/vendor", "0x15b3\n");
        put("sys/bus/pci/devices/0000:5e:00.0/numa_node", "0\n");
        // A NIC on the Mellanox device, and its RDMA device on the same PCI device.
        let nic_dev = root.join("sys/bus/pci/devices/0000:5e:00.0");
        fs::create_dir_all(root.join("sys/class/net/ib0")).unwrap();
        std::os::unix::fs::symlink(&nic_dev, root.join("sys/class/net/ib0/device")).unwrap();
        put("sys/class/net/ib0/speed", "100000\n");
        fs::create_dir_all(root.join("sys/class/infiniband/mlx5_0")).unwrap();
        std::os::unix::fs::symlink(&nic_dev, root.join("sys/class/infiniband/mlx5_0/device"))
            .unwrap();
        // A virtual NIC (no device, unknown speed) carrying a Soft-RoCE device.
        put("sys/class/net/veth0/speed", "-1\n");
        put("sys/class/infiniband/rxe0/parent", "veth0\n");
        put("sys/class/net/lo/speed", "0\n");
        root
    }

    #[test]
    fn reads_numa_binding_caches_nics_and_gpus_from_a_fixture_tree() {
        let root = fixture();
        let (host, place) = local(&root, "id7", "node7", Some("ib0".into()), None);
        fs::remove_dir_all(&root).unwrap();
        assert_eq!((host.id.as_str(), host.name.as_str()), ("id7", "node7"));
        assert_eq!(host.numa.len(), 2);
        assert_eq!(
            (
                host.numa[1].id,
                host.numa[1].cpus.as_str(),
                host.numa[1].memory_bytes
            ),
            (1, "4-7", 2048 * 1024)
        );
        assert_eq!(place.cpus, "2-5");
        assert_eq!(place.numa, vec![0, 1]);
        assert_eq!(place.nic.as_deref(), Some("ib0"));
        let c: Vec<(u8, &str, u64, u32)> = host
            .caches
            .iter()
            .map(|c| (c.level, c.kind.as_str(), c.bytes, c.shared_by))
            .collect();
        assert_eq!(
            c,
            vec![
                (1, "Data", 48 << 10, 1),
                (1, "Instruction", 32 << 10, 1),
                (2, "Unified", 2 << 20, 1),
                (3, "Unified", 32 << 20, 4)
            ]
        );
        let nics: Vec<String> = host
            .nics
            .iter()
            .map(|n| format!("{} {:?} {:?} {:?}", n.name, n.speed_mbps, n.numa, n.rdma))
            .collect();
        assert_eq!(
            nics,
            [
                r#"ib0 Some(100000) Some(0) ["mlx5_0"]"#,
                r#"veth0 None None ["rxe0"]"#
            ]
        );
        assert_eq!(host.gpus.len(), 1);
        assert_eq!(
            (
                host.gpus[0].pci.as_str(),
                host.gpus[0].device.as_str(),
                host.gpus[0].numa
            ),
            ("0000:3b:00.0", "0x2330", Some(1))
        );
    }

    /// Builds `tests/data/fake_nvml.c` (a made-up host's NVML) into a shared library.
    fn fake_nvml(dir: &Path) -> PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fake_nvml.c");
        let lib = dir.join("libnvidia-ml-fake.so.1");
        let out = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("cc (the linker Rust uses) runs");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    }

    #[test]
    fn nvlinks_and_peer_to_peer_reachability_come_from_nvml() {
        let root = std::env::temp_dir().join(format!("oxccl-nvml-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let put = |path: &str, text: &str| put(&root, path, text);
        // The host fake_nvml.c describes, plus an AMD GPU and an NVIDIA one NVML does not know.
        for (bus, class, vendor) in [
            ("0000:05:00.0", "0x068000", "0x10de"),
            ("0000:1a:00.0", "0x030200", "0x10de"),
            ("0000:1b:00.0", "0x030200", "0x10de"),
            ("0000:3c:00.0", "0x030200", "0x10de"),
            ("0000:3d:00.0", "0x030200", "0x10de"),
            ("0000:c1:00.0", "0x030000", "0x1002"),
            ("0000:e1:00.0", "0x030200", "0x10de"),
        ] {
            let d = format!("sys/bus/pci/devices/{bus}");
            put(&format!("{d}/class"), class);
            put(&format!("{d}/vendor"), vendor);
            put(&format!("{d}/device"), "0x2330");
            put(&format!("{d}/numa_node"), "0");
        }
        let lib = fake_nvml(&root);
        let gpus = gpus(&root, Some((&lib, nvml::WAIT)));
        let got: Vec<String> = gpus
            .iter()
            .map(|g| {
                let links: Vec<String> = g
                    .nvlinks
                    .iter()
                    .map(|l| format!("{} {} x{}", l.peer, l.kind, l.links))
                    .collect();
                format!("{} | {} | {:?}", g.pci, links.join(", "), g.p2p)
            })
            .collect();
        assert_eq!(
            got,
            [
                r#"0000:1a:00.0 | 0000:1b:00.0 gpu x3 | Some(["0000:1b:00.0", "0000:3c:00.0"])"#,
                r#"0000:1b:00.0 | 0000:1a:00.0 gpu x3 | Some(["0000:1a:00.0"])"#,
                r#"0000:3c:00.0 | 0000:05:00.0 nvswitch x4 | Some(["0000:3d:00.0"])"#,
                r#"0000:3d:00.0 | 0000:05:00.0 nvswitch x4 | Some(["0000:3c:00.0"])"#,
                "0000:c1:00.0 |  | None",
                "0000:e1:00.0 |  | None",
            ]
        );
        // Every init was paired with a shutdown.
        // SAFETY: the library built above; `fake_nvml_inits` is `int (void)`.
        let open = unsafe {
            let l = libloading::Library::new(&lib).unwrap();
            let f: libloading::Symbol<unsafe extern "C" fn() -> std::ffi::c_int> =
                l.get(b"fake_nvml_inits").unwrap();
            f()
        };
        assert_eq!(open, 0);
        // Without NVML (none asked for, or none there) the GPUs are found and nothing more.
        for nvml in [None, Some(root.join("missing.so"))] {
            let plain = super::gpus(&root, nvml.as_deref().map(|l| (l, nvml::WAIT)));
            assert_eq!(plain.len(), 6);
            assert!(
                plain
                    .iter()
                    .all(|g| g.nvlinks.is_empty() && g.p2p.is_none())
            );
        }
        fs::remove_dir_all(&root).unwrap();
    }

    /// NVML's calls have no deadline: a driver that does not answer leaves the GPUs' reach
    /// unknown after the wait, at once for later communicators, and known once it answers.
    #[test]
    fn an_nvml_that_does_not_answer_in_time_leaves_the_reach_unknown() {
        let root = std::env::temp_dir().join(format!("oxccl-nvml-hang-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for bus in ["0000:1a:00.0", "0000:1b:00.0"] {
            let d = format!("sys/bus/pci/devices/{bus}");
            put(&root, &format!("{d}/class"), "0x030200");
            put(&root, &format!("{d}/vendor"), "0x10de");
        }
        // A library of its own: the process keeps its answers per library path.
        let lib = fake_nvml(&root);
        // Held while the test runs, so that the query loads this instance, hang and all.
        // SAFETY: the library built above; `fake_nvml_hang` is `void (unsigned)`.
        let held = unsafe {
            let l = libloading::Library::new(&lib).unwrap();
            let f: libloading::Symbol<unsafe extern "C" fn(std::ffi::c_uint)> =
                l.get(b"fake_nvml_hang").unwrap();
            f(5000);
            l
        };
        let unknown = |g: &Vec<Gpu>| g.len() == 2 && g.iter().all(|g| g.p2p.is_none());
        let wait = Duration::from_millis(200);
        let start = std::time::Instant::now();
        let first = gpus(&root, Some((&lib, wait)));
        let took = start.elapsed();
        assert!(unknown(&first), "{first:?}");
        // Loose bounds: a loaded machine may start the thread or this one late.
        assert!(
            took + Duration::from_millis(5) >= wait && took < Duration::from_secs(4),
            "{took:?}"
        );
        // Later callers do not wait again while the question hangs.
        let start = std::time::Instant::now();
        let second = gpus(&root, Some((&lib, Duration::from_secs(5))));
        assert!(unknown(&second), "{second:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
        // Once the driver answers (after its 5 s), the answer is there.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let mut later = gpus(&root, Some((&lib, wait)));
        while unknown(&later) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
            later = gpus(&root, Some((&lib, wait)));
        }
        let p2p: Vec<_> = later.iter().map(|g| g.p2p.clone()).collect();
        assert_eq!(
            p2p,
            [
                Some(vec!["0000:1b:00.0".to_owned()]),
                Some(vec!["0000:1a:00.0".to_owned()])
            ]
        );
        drop(held);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_missing_tree_gives_empty_but_valid_data() {
        let root = Path::new("/nonexistent-oxccl-root");
        let (host, place) = local(root, "h", "h", None, None);
        assert_eq!(host.numa.len(), 1);
        assert!(host.nics.is_empty() && host.gpus.is_empty() && host.caches.is_empty());
        assert_eq!(place.cpus, "");
    }

    #[test]
    fn the_real_machine_has_a_numa_node_and_a_binding() {
        let (host, place) = local(
            Path::new("/"),
            "x",
            "x",
            None,
            Some((Path::new("libnvidia-ml.so.1"), nvml::WAIT)),
        );
        assert!(!host.numa.is_empty());
        assert!(!cpulist::parse(&place.cpus).is_empty(), "{place:?}");
        assert!(!place.numa.is_empty(), "{host:?} {place:?}");
    }

    #[test]
    fn sizes_and_natural_order() {
        assert_eq!(size_bytes("48K"), Some(48 << 10));
        assert_eq!(size_bytes("32M"), Some(32 << 20));
        assert_eq!(size_bytes("7"), Some(7));
        assert_eq!(size_bytes("7X"), None);
        let mut v = vec!["node10", "node2", "node1"];
        v.sort_by_key(|n| natural(n));
        assert_eq!(v, ["node1", "node2", "node10"]);
    }
}
