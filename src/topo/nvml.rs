//! NVLink and peer-to-peer reachability of this host's NVIDIA GPUs, from NVML
//! (`libnvidia-ml.so.1`) loaded at run time where it is present, as NCCL reads them: for every
//! GPU, each NVLink that is up and carries peer-to-peer traffic, with the PCI device at its far
//! end; for every pair of GPUs, whether one may read the other's memory peer to peer.
//!
//! Nothing here fails: a library that is missing or lacks a function, an init that fails, a GPU
//! that NVML does not know — each leaves that much unknown ([`None`]), and discovery goes on.
//! A process asks once per library and set of GPUs and keeps the answer; the library stays
//! loaded (NCCL never unloads it either: unloading a driver library that may have started
//! threads is not worth the risk).
//!
//! The asking runs on a thread of its own, and a caller waits for it only so long
//! ([`query`]'s `within`): NVML's calls have no deadline (a wedged driver can hold `nvmlInit`
//! forever), and a communicator's creation must not. Past that, the GPUs' reach is unknown for
//! this process, and the thread is left to finish or not.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// `nvmlReturn_t`.
type Ret = c_int;
/// `nvmlDevice_t`: an opaque handle.
type Device = *mut c_void;

const SUCCESS: Ret = 0;
/// `NVML_FEATURE_ENABLED`.
const ENABLED: c_uint = 1;
/// `NVML_NVLINK_CAP_P2P_SUPPORTED`.
const CAP_P2P: c_uint = 0;
/// `NVML_P2P_CAPS_INDEX_READ`.
const P2P_READ: c_uint = 0;
/// `NVML_P2P_STATUS_OK`.
const P2P_OK: c_uint = 0;
/// `NVML_NVLINK_MAX_LINKS` of current NVML (18, Hopper); a GPU with fewer links answers an
/// error for the others, which are skipped.
const MAX_LINKS: c_uint = 18;

/// `nvmlPciInfo_t` as the unversioned `nvmlDeviceGetNvLinkRemotePciInfo` fills it (the layout
/// NCCL uses), with spare room after it in case a library writes a longer form.
#[repr(C)]
struct PciInfo {
    bus_id: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    reserved: [c_uint; 4],
    spare: [u8; 64],
}

type InitFn = unsafe extern "C" fn() -> Ret;
type ByBusIdFn = unsafe extern "C" fn(*const c_char, *mut Device) -> Ret;
type LinkStateFn = unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> Ret;
type LinkCapFn = unsafe extern "C" fn(Device, c_uint, c_uint, *mut c_uint) -> Ret;
type LinkRemoteFn = unsafe extern "C" fn(Device, c_uint, *mut PciInfo) -> Ret;
type P2pFn = unsafe extern "C" fn(Device, Device, c_uint, *mut c_uint) -> Ret;

/// What NVML says of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reach {
    /// The PCI bus id at the far end of each active peer-to-peer NVLink (sysfs form,
    /// `0000:3b:00.0`), one entry per link, in link order.
    pub nvlinks: Vec<String>,
    /// The other GPUs of the query (by bus id) this one may read peer to peer.
    pub p2p: Vec<String>,
}

/// The symbols a query uses. Those NCCL also treats as optional may be missing.
struct Api {
    init: InitFn,
    shutdown: InitFn,
    by_bus_id: ByBusIdFn,
    link_state: Option<LinkStateFn>,
    link_cap: Option<LinkCapFn>,
    link_remote: Option<LinkRemoteFn>,
    p2p: Option<P2pFn>,
}

impl Api {
    /// Loads `library` (a path, or a name the dynamic loader searches for) and its symbols.
    fn load(library: &Path) -> Option<Api> {
        // SAFETY: loading runs the library's initialisers; the library is the system's NVML
        // (or one the user named in OXCCL_NVML_LIBRARY), as NCCL and every CUDA tool load it.
        let lib = unsafe { libloading::Library::new(library) }.ok()?;
        // SAFETY: each type is the C signature nvml.h declares for that symbol.
        let api = unsafe {
            let f = |names: &[&str]| {
                names
                    .iter()
                    .find_map(|n| lib.get::<*const c_void>(n.as_bytes()).ok().map(|s| *s))
            };
            let init = f(&["nvmlInit_v2", "nvmlInit"])?;
            let shutdown = f(&["nvmlShutdown"])?;
            let by_bus_id = f(&[
                "nvmlDeviceGetHandleByPciBusId_v2",
                "nvmlDeviceGetHandleByPciBusId",
            ])?;
            Api {
                init: std::mem::transmute::<*const c_void, InitFn>(init),
                shutdown: std::mem::transmute::<*const c_void, InitFn>(shutdown),
                by_bus_id: std::mem::transmute::<*const c_void, ByBusIdFn>(by_bus_id),
                link_state: f(&["nvmlDeviceGetNvLinkState"])
                    .map(|p| std::mem::transmute::<*const c_void, LinkStateFn>(p)),
                link_cap: f(&["nvmlDeviceGetNvLinkCapability"])
                    .map(|p| std::mem::transmute::<*const c_void, LinkCapFn>(p)),
                link_remote: f(&["nvmlDeviceGetNvLinkRemotePciInfo"])
                    .map(|p| std::mem::transmute::<*const c_void, LinkRemoteFn>(p)),
                p2p: f(&["nvmlDeviceGetP2PStatus"])
                    .map(|p| std::mem::transmute::<*const c_void, P2pFn>(p)),
            }
        };
        // The functions above point into the library: it stays loaded for the process.
        std::mem::forget(lib);
        Some(api)
    }
}

/// The longest a communicator's creation waits for NVML's answer (less where half of what is
/// left of its deadline is shorter): `nvmlInit` takes a second or two where the driver is not
/// kept loaded.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// What [`ask`] found: one entry per bus, `None` for a GPU NVML does not know; `None` where
/// NVML cannot be loaded or initialised.
type Answer = Option<Vec<Option<Reach>>>;

/// Where one question's answer lands.
#[derive(Default)]
struct Slot {
    state: Mutex<State>,
    ready: Condvar,
}

#[derive(Default)]
enum State {
    /// The asking thread has not answered yet.
    #[default]
    Asking,
    /// A caller waited its time out: later callers take the reach for unknown at once (until
    /// the thread answers after all).
    Late,
    Answered(Answer),
}

/// The questions so far, by library and GPU list. A process asks NVML once per library and
/// set of GPUs (the hardware does not change under it), however many communicators it creates:
/// `nvmlInit` can take a second where the driver is not kept loaded. Distinct keys come from
/// distinct configurations, so the list stays as short as those.
static ASKED: Mutex<Vec<Question>> = Mutex::new(Vec::new());

/// A library, the GPUs asked about, and where the answer lands.
type Question = (PathBuf, Vec<String>, Arc<Slot>);

/// Asks the NVML at `library` about the GPUs at `buses` (sysfs bus ids), once per process,
/// waiting at most `within` for the answer (see the module's doc). `None` where NVML cannot
/// be loaded or initialised or did not answer in time; else one entry per bus, `None` for a
/// GPU NVML does not know.
pub(crate) fn query(library: &Path, buses: &[String], within: Duration) -> Answer {
    let slot = {
        let mut asked = ASKED.lock().unwrap_or_else(|e| e.into_inner());
        match asked.iter().find(|(l, b, _)| l == library && b == buses) {
            Some((_, _, slot)) => slot.clone(),
            None => {
                let slot = Arc::new(Slot::default());
                asked.push((library.to_owned(), buses.to_vec(), slot.clone()));
                let (lib, gpus, answer) = (library.to_owned(), buses.to_vec(), slot.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("oxccl-nvml".into())
                        .spawn(move || {
                            // A panic in there (a library answering nonsense) is an unknown
                            // reach, settled at once, not a question left asking.
                            let found =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    ask(&lib, &gpus)
                                }))
                                .unwrap_or(None);
                            *answer.state.lock().unwrap_or_else(|e| e.into_inner()) =
                                State::Answered(found);
                            answer.ready.notify_all();
                        });
                if let Err(e) = spawned {
                    tracing::warn!("NVML not asked: cannot start a thread: {e}");
                    *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = State::Answered(None);
                }
                slot
            }
        }
    };
    let state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
    let (mut state, _) = slot
        .ready
        .wait_timeout_while(state, within, |s| matches!(s, State::Asking))
        .unwrap_or_else(|e| e.into_inner());
    match &*state {
        State::Answered(answer) => answer.clone(),
        State::Late => None,
        State::Asking => {
            tracing::warn!(
                "NVML ({}) did not answer within {within:?}: the GPUs' NVLinks and \
                 peer-to-peer reach are unknown to this process",
                library.display()
            );
            *state = State::Late;
            // Callers waiting with a longer time stop waiting too.
            slot.ready.notify_all();
            None
        }
    }
}

/// [`query`]'s work: load, init, ask, shut down.
fn ask(library: &Path, buses: &[String]) -> Answer {
    let api = Api::load(library)?;
    // SAFETY: a plain call of a loaded NVML function; every call below happens between this
    // successful init and the shutdown at the end, as NVML requires.
    if unsafe { (api.init)() } != SUCCESS {
        return None;
    }
    let handles: Vec<Option<Device>> = buses
        .iter()
        .map(|b| {
            let id = CString::new(b.as_str()).ok()?;
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: `id` is a NUL-terminated string and `dev` a place for one handle.
            let ok = unsafe { (api.by_bus_id)(id.as_ptr(), &mut dev) } == SUCCESS;
            (ok && !dev.is_null()).then_some(dev)
        })
        .collect();
    let reach = handles
        .iter()
        .map(|&h| {
            let dev = h?;
            let mut r = Reach {
                nvlinks: nvlinks(&api, dev),
                ..Reach::default()
            };
            if let Some(p2p) = api.p2p {
                for (other, &oh) in buses.iter().zip(&handles) {
                    let Some(odev) = oh.filter(|&o| o != dev) else {
                        continue;
                    };
                    let mut status: c_uint = c_uint::MAX;
                    // SAFETY: two handles NVML gave, a valid index, a place for the status.
                    let ret = unsafe { p2p(dev, odev, P2P_READ, &mut status) };
                    if ret == SUCCESS && status == P2P_OK {
                        r.p2p.push(other.clone());
                    }
                }
            }
            Some(r)
        })
        .collect();
    // SAFETY: pairs with the init above.
    unsafe { (api.shutdown)() };
    Some(reach)
}

/// The far ends of `dev`'s active NVLinks that carry peer-to-peer traffic.
fn nvlinks(api: &Api, dev: Device) -> Vec<String> {
    let (Some(state), Some(remote)) = (api.link_state, api.link_remote) else {
        return Vec::new();
    };
    let mut ends = Vec::new();
    for link in 0..MAX_LINKS {
        let mut active: c_uint = 0;
        // SAFETY: a handle NVML gave, a link number, a place for the answer.
        if unsafe { state(dev, link, &mut active) } != SUCCESS || active != ENABLED {
            continue;
        }
        if let Some(cap) = api.link_cap {
            let mut p2p: c_uint = 0;
            // SAFETY: as above.
            if unsafe { cap(dev, link, CAP_P2P, &mut p2p) } != SUCCESS || p2p == 0 {
                continue;
            }
        }
        let mut info = PciInfo {
            bus_id: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_subsystem_id: 0,
            reserved: [0; 4],
            spare: [0; 64],
        };
        // SAFETY: as above; `info` is larger than the structure NVML fills.
        if unsafe { remote(dev, link, &mut info) } != SUCCESS {
            continue;
        }
        // The last byte stays 0 whatever NVML wrote before it, so the string ends in bounds.
        info.bus_id[15] = 0;
        // SAFETY: `bus_id` is NUL-terminated within its 16 bytes (just above).
        let text = unsafe { CStr::from_ptr(info.bus_id.as_ptr()) }.to_string_lossy();
        let end = bus_id(&text).unwrap_or_else(|| {
            format!("{:04x}:{:02x}:{:02x}.0", info.domain, info.bus, info.device)
        });
        ends.push(end);
    }
    ends
}

/// A PCI bus id in sysfs form: lower case, a 4-digit domain where it fits (NVML writes
/// `00000000:3B:00.0` or `0000:3B:00.0`; sysfs names `0000:3b:00.0`). `None` if it does not
/// parse.
pub(crate) fn bus_id(text: &str) -> Option<String> {
    let (domain, rest) = text.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    let (domain, bus, dev, func) = (hex(domain)?, hex(bus)?, hex(dev)?, hex(func)?);
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_take_the_sysfs_form() {
        assert_eq!(bus_id("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(bus_id("0000:3b:00.1").as_deref(), Some("0000:3b:00.1"));
        assert_eq!(bus_id("00000001:C1:1F.0").as_deref(), Some("0001:c1:1f.0"));
        assert_eq!(bus_id("garbage"), None);
        assert_eq!(bus_id("0000:zz:00.0"), None);
    }

    #[test]
    fn a_missing_library_is_unknown_not_an_error() {
        let q = query(
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            &["0000:3b:00.0".into()],
            WAIT,
        );
        assert!(q.is_none());
    }
}
