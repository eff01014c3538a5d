//! Choosing the local IP address that other ranks connect to: `OXCCL_SOCKET_IFNAME` (NCCL's
//! `NCCL_SOCKET_IFNAME` syntax), else the address that routes toward the store, else the first
//! usable interface. It only looks at the host's interfaces and routing; it must not send any
//! packet.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

use crate::{Error, Result};

/// The environment variable that restricts the interfaces oxccl uses.
pub const SOCKET_IFNAME: &str = "OXCCL_SOCKET_IFNAME";

/// Interfaces skipped when nothing is configured (NCCL's default `^docker,lo`).
const DEFAULT_SPEC: &str = "^docker,lo";

/// The local address the kernel would use to reach `dest`: a UDP socket is "connected" to it,
/// which picks a route and a source address without sending anything.
pub fn local_ip_toward(dest: SocketAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match dest {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any)?;
    socket.connect(dest)?;
    Ok(socket.local_addr()?.ip())
}

/// The addresses of the interfaces that are up and match `spec`, as `(interface, address)`,
/// IPv4 addresses first, then IPv6 (link-local IPv6 addresses are skipped: they need a scope
/// to be reachable).
///
/// `spec` is NCCL_SOCKET_IFNAME syntax: comma-separated interface-name prefixes (`eth,ib`); a
/// leading `^` excludes the listed interfaces instead (`^docker,lo`); a leading `=` (after any
/// `^`) makes the names exact instead of prefixes (`=eth0`, `^=eth0`).
pub fn interface_ips(spec: &str) -> io::Result<Vec<(String, IpAddr)>> {
    let all = if_addrs::get_if_addrs()?
        .into_iter()
        .filter(|i| {
            matches!(
                i.oper_status,
                if_addrs::IfOperStatus::Up | if_addrs::IfOperStatus::Unknown
            )
        })
        .map(|i| {
            let ip = i.ip();
            (i.name, ip)
        })
        .collect::<Vec<_>>();
    Ok(select(&IfSpec::parse(spec), all))
}

/// The address this rank advertises for data connections:
///
/// 1. with `OXCCL_SOCKET_IFNAME` set, the first address of a matching interface (an error when
///    none matches);
/// 2. else, when the store's address is known, the local address that routes to it;
/// 3. else the first address of an interface that is up and not loopback (nor docker);
/// 4. else the IPv4 loopback address.
pub fn choose_ip(store: Option<SocketAddr>) -> Result<IpAddr> {
    let spec =
        crate::config::with_env(|get| Ok(get(SOCKET_IFNAME)))?.filter(|s| !s.trim().is_empty());
    choose_ip_with(spec.as_deref(), store)
}

/// [`choose_ip`] with the `OXCCL_SOCKET_IFNAME` value passed in.
fn choose_ip_with(spec: Option<&str>, store: Option<SocketAddr>) -> Result<IpAddr> {
    let list = |spec: &str| {
        interface_ips(spec).map_err(|source| Error::Io {
            what: "list the network interfaces".into(),
            source,
        })
    };
    if let Some(spec) = spec {
        return match list(spec)?.first() {
            Some((_, ip)) => Ok(*ip),
            None => {
                let up: Vec<String> = list("")?
                    .into_iter()
                    .map(|(n, ip)| format!("{n} ({ip})"))
                    .collect();
                Err(Error::Bootstrap(format!(
                    "{SOCKET_IFNAME}={spec:?} matches no interface that is up; interfaces: {}",
                    if up.is_empty() {
                        "none".to_owned()
                    } else {
                        up.join(", ")
                    }
                )))
            }
        };
    }
    if let Some(store) = store {
        match local_ip_toward(store) {
            Ok(ip) if !ip.is_unspecified() => return Ok(ip),
            Ok(_) => {}
            Err(e) => tracing::debug!(%store, "no route to the store: {e}"),
        }
    }
    let first = list(DEFAULT_SPEC)?
        .into_iter()
        .find(|(_, ip)| !ip.is_loopback());
    Ok(first.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |(_, ip)| ip))
}

/// A parsed NCCL_SOCKET_IFNAME value.
#[derive(Debug, PartialEq, Eq)]
struct IfSpec {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfSpec {
    fn parse(spec: &str) -> IfSpec {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names = s
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        IfSpec {
            exclude,
            exact,
            names,
        }
    }

    fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        // An empty inclusion list means "any interface".
        if self.exclude {
            !listed
        } else {
            listed || self.names.is_empty()
        }
    }
}

fn select(spec: &IfSpec, all: Vec<(String, IpAddr)>) -> Vec<(String, IpAddr)> {
    let mut out: Vec<(String, IpAddr)> = all
        .into_iter()
        .filter(|(name, ip)| spec.matches(name) && !is_ipv6_link_local(ip))
        .collect();
    out.sort_by_key(|(_, ip)| ip.is_ipv6());
    out
}

fn is_ipv6_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake() -> Vec<(String, IpAddr)> {
        [
            ("lo", "127.0.0.1"),
            ("eth0", "fd00::2"),
            ("eth0", "fe80::1"),
            ("eth0", "192.0.2.2"),
            ("eth10", "10.0.0.1"),
            ("docker0", "172.17.0.1"),
            ("ib0", "10.1.0.1"),
        ]
        .iter()
        .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()))
        .collect()
    }

    fn names(spec: &str) -> Vec<String> {
        select(&IfSpec::parse(spec), fake())
            .into_iter()
            .map(|(n, ip)| format!("{n}={ip}"))
            .collect()
    }

    #[test]
    fn prefixes_exclusions_and_exact_names() {
        assert_eq!(
            names("eth"),
            ["eth0=192.0.2.2", "eth10=10.0.0.1", "eth0=fd00::2"]
        );
        assert_eq!(names("=eth0"), ["eth0=192.0.2.2", "eth0=fd00::2"]);
        assert_eq!(names("ib,lo"), ["lo=127.0.0.1", "ib0=10.1.0.1"]);
        assert_eq!(
            names("^docker,lo"),
            [
                "eth0=192.0.2.2",
                "eth10=10.0.0.1",
                "ib0=10.1.0.1",
                "eth0=fd00::2"
            ]
        );
        assert_eq!(
            names("^=eth0,lo,docker0"),
            ["eth10=10.0.0.1", "ib0=10.1.0.1"]
        );
        assert!(names("wlan").is_empty());
        assert_eq!(names("").len(), 6);
    }

    #[test]
    fn loopback_is_always_reachable() {
        let ip = local_ip_toward("127.0.0.1:9".parse().unwrap()).unwrap();
        assert!(ip.is_loopback());
        let ip = choose_ip_with(None, Some("127.0.0.1:9".parse().unwrap())).unwrap();
        assert!(ip.is_loopback());
        let ip = choose_ip_with(Some("lo"), None).unwrap();
        assert!(ip.is_loopback());
        let err = choose_ip_with(Some("=no-such-interface"), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("OXCCL_SOCKET_IFNAME") && err.contains("no-such-interface"),
            "{err}"
        );
        assert!(choose_ip_with(None, None).is_ok());
    }
}
