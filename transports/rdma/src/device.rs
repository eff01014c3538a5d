//! Which RDMA device, port and GID a rank uses: what sysfs says about every port
//! (`/sys/class/infiniband/<dev>/ports/<n>/…`), `OXCCL_IB_HCA`'s filter (NCCL_IB_HCA's syntax)
//! and `OXCCL_IB_GID_INDEX`, with NCCL's default of a RoCE v2 GID holding an IPv4 address.
//!
//! Everything here reads files under a root directory, so tests describe machines as fixture
//! trees; nothing touches libibverbs.

use std::fs;
use std::path::Path;

/// What a port's link layer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID.
    InfiniBand,
    /// RoCE: addressed by GID (a global route header on every packet).
    Ethernet,
}

/// The RoCE version (or IB) a GID table entry is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// `IB/RoCE v1`.
    V1,
    /// `RoCE v2` (UDP/IP encapsulation: routable).
    V2,
    /// Anything sysfs did not name.
    Unknown,
}

/// One non-zero entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index in the table (what the QP's `sgid_index` names).
    pub index: u8,
    /// The 16 bytes.
    pub gid: [u8; 16],
    /// The RoCE version.
    pub kind: GidKind,
}

impl GidEntry {
    /// Whether the GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
    pub fn is_ipv4(&self) -> bool {
        self.gid[..10].iter().all(|&b| b == 0) && self.gid[10] == 0xff && self.gid[11] == 0xff
    }

    /// Whether the GID is an IPv6 link-local address (`fe80::/10`).
    pub fn is_link_local(&self) -> bool {
        self.gid[0] == 0xfe && self.gid[1] & 0xc0 == 0x80
    }
}

/// One port of one RDMA device, as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    /// The device (`mlx5_0`, `rxe0`).
    pub device: String,
    /// The port number (from 1).
    pub port: u8,
    /// Whether the port is ACTIVE.
    pub active: bool,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// The non-zero GID table entries.
    pub gids: Vec<GidEntry>,
    /// The device's NUMA node, when sysfs knows it.
    pub numa_node: Option<i32>,
    /// The network interface under the port (RoCE), from its GID entries.
    pub netdev: Option<String>,
    /// The link rate as sysfs words it (`100 Gb/sec (4X EDR)`).
    pub rate: Option<String>,
}

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Every port of every device under `root` (normally `/`), sorted by device then port.
pub fn discover(root: &Path) -> Vec<Port> {
    let class = root.join("sys/class/infiniband");
    let Ok(devs) = fs::read_dir(&class) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for dev in devs.flatten() {
        let device = dev.file_name().to_string_lossy().into_owned();
        let dir = class.join(&device);
        let numa_node = read(&dir.join("device/numa_node"))
            .and_then(|s| s.parse().ok())
            .filter(|&n: &i32| n >= 0);
        let Ok(ports) = fs::read_dir(dir.join("ports")) else {
            continue;
        };
        for p in ports.flatten() {
            let Some(port) = p.file_name().to_str().and_then(|s| s.parse::<u8>().ok()) else {
                continue;
            };
            let pd = p.path();
            // "4: ACTIVE"
            let active = read(&pd.join("state")).is_some_and(|s| s.ends_with("ACTIVE"));
            let link_layer = match read(&pd.join("link_layer")).as_deref() {
                Some("Ethernet") => LinkLayer::Ethernet,
                _ => LinkLayer::InfiniBand,
            };
            let mut gids = Vec::new();
            let mut netdev = None;
            if let Ok(entries) = fs::read_dir(pd.join("gids")) {
                for g in entries.flatten() {
                    let Some(index) = g.file_name().to_str().and_then(|s| s.parse::<u8>().ok())
                    else {
                        continue;
                    };
                    let Some(gid) = read(&g.path()).and_then(|s| parse_gid(&s)) else {
                        continue;
                    };
                    if gid == [0; 16] {
                        continue;
                    }
                    let kind = match read(&pd.join(format!("gid_attrs/types/{index}"))).as_deref() {
                        Some("RoCE v2") => GidKind::V2,
                        Some("IB/RoCE v1") => GidKind::V1,
                        _ => GidKind::Unknown,
                    };
                    if netdev.is_none() {
                        netdev = read(&pd.join(format!("gid_attrs/ndevs/{index}")))
                            .filter(|s| !s.is_empty());
                    }
                    gids.push(GidEntry { index, gid, kind });
                }
            }
            gids.sort_by_key(|g| g.index);
            out.push(Port {
                device: device.clone(),
                port,
                active,
                link_layer,
                gids,
                numa_node,
                netdev,
                rate: read(&pd.join("rate")),
            });
        }
    }
    out.sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
    out
}

/// Parses sysfs's GID form, eight groups of four hex digits (`fe80:0000:…`).
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        if g.is_empty() || g.len() > 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(out)
}

/// `OXCCL_IB_HCA`, parsed: NCCL_IB_HCA's syntax. A list of `device[:port]`, comma-separated;
/// a leading `^` excludes the listed ones instead of keeping only them; a leading `=` (after
/// any `^`) makes names match exactly instead of as prefixes (`mlx5` keeps `mlx5_0`,
/// `mlx5_1`, …; `=mlx5_1` keeps only `mlx5_1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    items: Vec<(String, Option<u8>)>,
}

impl HcaFilter {
    /// Parses the variable's value; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<HcaFilter, String> {
        let mut rest = s.trim();
        let mut exclude = false;
        let mut exact = false;
        loop {
            if let Some(r) = rest.strip_prefix('^') {
                exclude = true;
                rest = r;
            } else if let Some(r) = rest.strip_prefix('=') {
                exact = true;
                rest = r;
            } else {
                break;
            }
        }
        let mut items = Vec::new();
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let port = p.parse::<u8>().ok().filter(|&p| p >= 1).ok_or_else(|| {
                        format!("OXCCL_IB_HCA={s:?}: {p:?} is not a port number (1 to 255)")
                    })?;
                    (n, Some(port))
                }
                None => (item, None),
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            {
                return Err(format!("OXCCL_IB_HCA={s:?}: {name:?} is not a device name"));
            }
            items.push((name.to_string(), port));
        }
        if items.is_empty() {
            return Err(format!("OXCCL_IB_HCA={s:?} names no device"));
        }
        Ok(HcaFilter {
            exclude,
            exact,
            items,
        })
    }

    /// Whether port `port` of `device` passes the filter.
    pub fn allows(&self, device: &str, port: u8) -> bool {
        let listed = self.items.iter().any(|(name, p)| {
            let name_ok = if self.exact {
                device == name
            } else {
                device.starts_with(name.as_str())
            };
            name_ok && p.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }
}

/// Which GID entry of a RoCE port to use when `OXCCL_IB_GID_INDEX` is not set, in the order
/// NCCL's defaults give (`NCCL_IB_ADDR_FAMILY` AF_INET, `NCCL_IB_ROCE_VERSION_NUM` 2): the
/// address family first (an IPv4-mapped address before IPv6), then RoCE v2 before v1, then an
/// address that is not link-local before one that is; the lowest index among equals. (Where
/// the table has no IPv4 entry NCCL keeps index 0; this takes the best IPv6 one instead.)
pub fn default_gid(gids: &[GidEntry]) -> Option<&GidEntry> {
    gids.iter().max_by_key(|g| {
        (
            g.is_ipv4(),
            g.kind == GidKind::V2,
            !g.is_link_local(),
            std::cmp::Reverse(g.index),
        )
    })
}

/// What a rank uses: one port, and for RoCE one GID index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The port.
    pub port: Port,
    /// The GID index (RoCE; for InfiniBand the packets go by LID and this is 0).
    pub gid_index: u8,
}

/// The first active port that passes `filter`, with its GID index (`gid_index` if given,
/// checked to exist in the table, else [`default_gid`]). The error says what was found.
pub fn choose(
    ports: &[Port],
    filter: Option<&HcaFilter>,
    gid_index: Option<u8>,
) -> Result<Choice, String> {
    if ports.is_empty() {
        return Err("no RDMA device (/sys/class/infiniband is empty or missing)".into());
    }
    let seen = || {
        ports
            .iter()
            .map(|p| {
                format!(
                    "{}:{} ({}{})",
                    p.device,
                    p.port,
                    if p.active { "active" } else { "down" },
                    match p.link_layer {
                        LinkLayer::Ethernet => ", RoCE",
                        LinkLayer::InfiniBand => ", InfiniBand",
                    }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let port = ports
        .iter()
        .filter(|p| filter.is_none_or(|f| f.allows(&p.device, p.port)))
        .find(|p| p.active)
        .ok_or_else(|| match filter {
            Some(_) => format!("no active port passes OXCCL_IB_HCA (ports: {})", seen()),
            None => format!("no active port (ports: {})", seen()),
        })?;
    let gid_index = match (port.link_layer, gid_index) {
        (_, Some(i)) => {
            if port.link_layer == LinkLayer::Ethernet && !port.gids.iter().any(|g| g.index == i) {
                return Err(format!(
                    "OXCCL_IB_GID_INDEX={i}: {}:{} has no such GID (non-zero entries: {:?})",
                    port.device,
                    port.port,
                    port.gids.iter().map(|g| g.index).collect::<Vec<_>>()
                ));
            }
            i
        }
        (LinkLayer::InfiniBand, None) => 0,
        (LinkLayer::Ethernet, None) => default_gid(&port.gids)
            .ok_or_else(|| {
                format!(
                    "{}:{} is RoCE but has no GID (is its network interface up with an address?)",
                    port.device, port.port
                )
            })?
            .index,
    };
    Ok(Choice {
        port: port.clone(),
        gid_index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(root: &Path, dev: &str, port: u8, state: &str, ll: &str, gids: &[(u8, &str, &str)]) {
        let pd = root.join(format!("sys/class/infiniband/{dev}/ports/{port}"));
        fs::create_dir_all(pd.join("gids")).unwrap();
        fs::create_dir_all(pd.join("gid_attrs/types")).unwrap();
        fs::create_dir_all(pd.join("gid_attrs/ndevs")).unwrap();
        fs::create_dir_all(root.join(format!("sys/class/infiniband/{dev}/device"))).unwrap();
        fs::write(
            root.join(format!("sys/class/infiniband/{dev}/device/numa_node")),
            "1\n",
        )
        .unwrap();
        fs::write(pd.join("state"), format!("{state}\n")).unwrap();
        fs::write(pd.join("link_layer"), format!("{ll}\n")).unwrap();
        fs::write(pd.join("rate"), "100 Gb/sec (4X EDR)\n").unwrap();
        for i in 0..4u8 {
            fs::write(
                pd.join(format!("gids/{i}")),
                "0000:0000:0000:0000:0000:0000:0000:0000\n",
            )
            .unwrap();
        }
        for (i, g, t) in gids {
            fs::write(pd.join(format!("gids/{i}")), format!("{g}\n")).unwrap();
            fs::write(pd.join(format!("gid_attrs/types/{i}")), format!("{t}\n")).unwrap();
            fs::write(pd.join(format!("gid_attrs/ndevs/{i}")), "eth0\n").unwrap();
        }
    }

    const LL: &str = "fe80:0000:0000:0000:5054:00ff:fe12:3456";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:c0a8:4d01";
    const V6: &str = "2001:0db8:0000:0000:0000:0000:0000:0001";

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("oxccl-rdma-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn discovery_reads_ports_gids_and_their_kinds() {
        let root = tmp("discover");
        fixture(
            &root,
            "rxe0",
            1,
            "4: ACTIVE",
            "Ethernet",
            &[
                (0, LL, "IB/RoCE v1"),
                (1, LL, "RoCE v2"),
                (2, V4, "IB/RoCE v1"),
                (3, V4, "RoCE v2"),
            ],
        );
        fixture(
            &root,
            "mlx5_0",
            1,
            "1: DOWN",
            "InfiniBand",
            &[(0, LL, "IB/RoCE v1")],
        );
        let ports = discover(&root);
        assert_eq!(ports.len(), 2);
        assert_eq!(
            (ports[0].device.as_str(), ports[0].active),
            ("mlx5_0", false)
        );
        let rxe = &ports[1];
        assert_eq!(rxe.link_layer, LinkLayer::Ethernet);
        assert!(rxe.active);
        assert_eq!(rxe.numa_node, Some(1));
        assert_eq!(rxe.netdev.as_deref(), Some("eth0"));
        assert_eq!(rxe.gids.len(), 4);
        assert_eq!(rxe.gids[3].kind, GidKind::V2);
        assert_eq!(rxe.gids[3].gid[12..], [192, 168, 77, 1]);
        assert!(rxe.gids[3].is_ipv4() && !rxe.gids[0].is_ipv4() && rxe.gids[0].is_link_local());
        // The default GID: RoCE v2 with IPv4, as NCCL picks; the down device is passed over.
        let c = choose(&ports, None, None).unwrap();
        assert_eq!((c.port.device.as_str(), c.gid_index), ("rxe0", 3));
        // A forced index must exist.
        assert_eq!(choose(&ports, None, Some(1)).unwrap().gid_index, 1);
        let e = choose(&ports, None, Some(9)).unwrap_err();
        assert!(
            e.contains("OXCCL_IB_GID_INDEX=9") && e.contains("[0, 1, 2, 3]"),
            "{e}"
        );
        // Nothing passes the filter: the error lists what exists.
        let f = HcaFilter::parse("=mlx5_0").unwrap();
        let e = choose(&ports, Some(&f), None).unwrap_err();
        assert!(
            e.contains("mlx5_0:1 (down, InfiniBand)") && e.contains("rxe0:1 (active, RoCE)"),
            "{e}"
        );
        assert!(
            choose(&[], None, None)
                .unwrap_err()
                .contains("no RDMA device")
        );
        assert!(discover(&root.join("nothing")).is_empty());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn default_gid_prefers_ipv4_then_v2_then_global() {
        let g = |index, s: &str, kind| GidEntry {
            index,
            gid: parse_gid(s).unwrap(),
            kind,
        };
        let table = [
            g(0, LL, GidKind::V1),
            g(1, LL, GidKind::V2),
            g(2, V6, GidKind::V2),
        ];
        assert_eq!(default_gid(&table).unwrap().index, 2);
        // The family before the version, as NCCL: IPv4 on RoCE v1 before link-local v2.
        let table = [g(0, V4, GidKind::V1), g(1, LL, GidKind::V2)];
        assert_eq!(default_gid(&table).unwrap().index, 0);
        let table = [
            g(0, V4, GidKind::V1),
            g(1, V6, GidKind::V2),
            g(2, V4, GidKind::V2),
        ];
        assert_eq!(default_gid(&table).unwrap().index, 2);
        let table = [
            g(0, V6, GidKind::V2),
            g(5, V4, GidKind::V2),
            g(7, V4, GidKind::V2),
        ];
        assert_eq!(default_gid(&table).unwrap().index, 5);
        assert_eq!(default_gid(&[]), None);
    }

    #[test]
    fn hca_filter_has_nccls_syntax() {
        let f = HcaFilter::parse("mlx5").unwrap();
        assert!(f.allows("mlx5_0", 1) && f.allows("mlx5_12", 2) && !f.allows("rxe0", 1));
        let f = HcaFilter::parse("=mlx5_1").unwrap();
        assert!(f.allows("mlx5_1", 1) && !f.allows("mlx5_10", 1) && !f.allows("mlx5_0", 1));
        let f = HcaFilter::parse("mlx5_0:1,mlx5_1:2").unwrap();
        assert!(f.allows("mlx5_0", 1) && !f.allows("mlx5_0", 2) && f.allows("mlx5_1", 2));
        let f = HcaFilter::parse("^mlx5_1").unwrap();
        assert!(f.allows("mlx5_0", 1) && !f.allows("mlx5_1", 1) && !f.allows("mlx5_10", 1));
        let f = HcaFilter::parse("^=mlx5_1").unwrap();
        assert!(f.allows("mlx5_10", 1) && !f.allows("mlx5_1", 1));
        assert_eq!(HcaFilter::parse("=^mlx5_1").unwrap(), f);
        let f = HcaFilter::parse(" rxe0 , ").unwrap();
        assert!(f.allows("rxe0", 1));
        for bad in ["", "^", "mlx5_0:0", "mlx5_0:x", "mlx5_0:256", "a b", ":1"] {
            let e = HcaFilter::parse(bad).unwrap_err();
            assert!(e.contains("OXCCL_IB_HCA"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn gid_parsing_rejects_garbage() {
        assert_eq!(parse_gid(V4).unwrap()[10..], [0xff, 0xff, 192, 168, 77, 1]);
        for bad in [
            "",
            "fe80::1",
            "0:0:0:0:0:0:0:g",
            "00000:0:0:0:0:0:0:0",
            "0:0:0:0:0:0:0:0:0",
        ] {
            assert_eq!(parse_gid(bad), None, "{bad:?}");
        }
    }
}
