//! Owning wrappers around the verbs objects a link needs: the device (context and protection
//! domain, shared by every link of a rank), registered memory, and a queue pair with its
//! completion queue and completion channel. Each frees what it holds when dropped, in the
//! order verbs requires.

use std::ffi::{CStr, c_int, c_void};
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;
use std::sync::Arc;

use crate::device::{Choice, LinkLayer};
use crate::sys::{self, Gid, IbvCompChannel, IbvContext, IbvCq, IbvMr, IbvPd, IbvQp, Verbs};

/// An error from a verbs call: what was being done and the OS error.
fn os_error(what: &str, code: Option<i32>) -> String {
    let e = match code {
        Some(c) => std::io::Error::from_raw_os_error(c),
        None => std::io::Error::last_os_error(),
    };
    format!("{what}: {e}")
}

/// An open device port: context, protection domain, and the addressing facts peers need.
pub(crate) struct Device {
    pub v: &'static Verbs,
    ctx: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub choice: Choice,
    pub gid: Gid,
    pub lid: u16,
    /// The port's active MTU, as verbs' enum (1 = 256 bytes … 5 = 4096).
    pub mtu: u32,
}

// SAFETY: verbs objects may be used from any thread (libibverbs locks internally); the Device
// is only read after opening.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{} gid index {}",
            self.choice.port.device, self.choice.port.port, self.choice.gid_index
        )
    }
}

impl Device {
    /// Opens the chosen port's device and allocates a protection domain.
    pub fn open(choice: Choice) -> Result<Arc<Device>, String> {
        let v = sys::verbs()?;
        let name = &choice.port.device;
        let mut n: c_int = 0;
        // SAFETY: plain libibverbs calls; the list is freed below, after the context (which
        // does not borrow it) is opened.
        let ctx = unsafe {
            let list = (v.get_device_list)(&mut n);
            if list.is_null() {
                return Err(os_error("rdma: list the RDMA devices", None));
            }
            let mut found = ptr::null_mut();
            for i in 0..n.max(0) as usize {
                let d = *list.add(i);
                let dn = (v.get_device_name)(d);
                if !dn.is_null() && CStr::from_ptr(dn).to_bytes() == name.as_bytes() {
                    found = d;
                    break;
                }
            }
            let ctx = if found.is_null() {
                ptr::null_mut()
            } else {
                (v.open_device)(found)
            };
            let err = std::io::Error::last_os_error();
            (v.free_device_list)(list);
            if found.is_null() {
                return Err(format!(
                    "rdma: sysfs lists {name} but libibverbs does not (is its provider, e.g. ibverbs-providers, installed?)"
                ));
            }
            if ctx.is_null() {
                return Err(format!("rdma: open {name}: {err}"));
            }
            ctx
        };
        let port = choice.port.port;
        let mut attr = [0u64; 32];
        // SAFETY: the buffer is larger than any version's ibv_port_attr.
        let rc = unsafe { (v.query_port)(ctx, port, attr.as_mut_ptr().cast()) };
        let close = |msg: String| {
            // SAFETY: ctx was opened above and nothing else holds it.
            unsafe { (v.close_device)(ctx) };
            msg
        };
        if rc != 0 {
            return Err(close(os_error(
                &format!("rdma: query {name} port {port}"),
                Some(rc),
            )));
        }
        let bytes: &[u8] = bytemuck_bytes(&attr);
        let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap());
        let state = u32_at(sys::offset::PORT_ATTR_STATE);
        let mtu = u32_at(sys::offset::PORT_ATTR_ACTIVE_MTU);
        let lid = u16::from_ne_bytes(
            bytes[sys::offset::PORT_ATTR_LID..sys::offset::PORT_ATTR_LID + 2]
                .try_into()
                .unwrap(),
        );
        let ll = bytes[sys::offset::PORT_ATTR_LINK_LAYER];
        if state != sys::IBV_PORT_ACTIVE {
            return Err(close(format!(
                "rdma: {name} port {port} is not active (state {state})"
            )));
        }
        let want = match choice.port.link_layer {
            LinkLayer::Ethernet => sys::IBV_LINK_LAYER_ETHERNET,
            LinkLayer::InfiniBand => sys::IBV_LINK_LAYER_INFINIBAND,
        };
        // Link layer 0 ("unspecified") is InfiniBand for old providers.
        if ll != want && !(ll == 0 && want == sys::IBV_LINK_LAYER_INFINIBAND) {
            return Err(close(format!(
                "rdma: {name} port {port}: verbs says link layer {ll}, sysfs says {:?}",
                choice.port.link_layer
            )));
        }
        let mut gid = Gid::default();
        // SAFETY: gid is a valid union ibv_gid.
        let rc = unsafe { (v.query_gid)(ctx, port, choice.gid_index as c_int, &mut gid) };
        if rc != 0 {
            return Err(close(os_error(
                &format!("rdma: {name} port {port}: read GID {}", choice.gid_index),
                None,
            )));
        }
        if gid.0 == [0; 16] && choice.port.link_layer == LinkLayer::Ethernet {
            return Err(close(format!(
                "rdma: {name} port {port}: GID {} is empty",
                choice.gid_index
            )));
        }
        // SAFETY: ctx is open.
        let pd = unsafe { (v.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(close(os_error(
                &format!("rdma: {name}: allocate a protection domain"),
                None,
            )));
        }
        Ok(Arc::new(Device {
            v,
            ctx,
            pd,
            choice,
            gid,
            lid,
            mtu: mtu.clamp(1, 5),
        }))
    }

    pub fn ctx(&self) -> *mut IbvContext {
        self.ctx
    }

    pub fn is_roce(&self) -> bool {
        self.choice.port.link_layer == LinkLayer::Ethernet
    }
}

fn bytemuck_bytes(a: &[u64; 32]) -> &[u8] {
    // SAFETY: u64s are plain bytes; the slice covers exactly the array.
    unsafe { std::slice::from_raw_parts(a.as_ptr().cast(), size_of_val(a)) }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every object made from the PD (memory regions, QPs) holds an Arc to this
        // device and is gone before it.
        unsafe {
            (self.v.dealloc_pd)(self.pd);
            (self.v.close_device)(self.ctx);
        }
    }
}

/// A registration of memory with the device: dropping it deregisters (never unmaps).
pub(crate) struct Mr {
    dev: Arc<Device>,
    mr: *mut IbvMr,
    pub lkey: u32,
    pub rkey: u32,
}

// SAFETY: verbs handles are thread-safe; the memory is its owner's (see `new`).
unsafe impl Send for Mr {}

impl Mr {
    /// Registers `len` bytes at `ptr` with `access` (`what` names them in the error).
    ///
    /// # Safety
    ///
    /// The memory is mapped for `len` bytes until the registration is dropped.
    unsafe fn new(
        dev: &Arc<Device>,
        ptr: *mut u8,
        len: usize,
        access: c_int,
        what: &str,
    ) -> Result<Mr, String> {
        // SAFETY: the caller vouches for the memory.
        let mr = unsafe { (dev.v.reg_mr)(dev.pd, ptr.cast::<c_void>(), len, access) };
        if mr.is_null() {
            return Err(os_error(
                &format!(
                    "rdma: register {what} ({len} bytes at {ptr:p}) with {dev:?} (is `ulimit -l` \
                     large enough?)"
                ),
                None,
            ));
        }
        // SAFETY: a live ibv_mr holds its keys at these offsets (checked by tests/layout.rs).
        let (lkey, rkey) = unsafe {
            (
                ptr::read((mr as *const u8).add(sys::offset::MR_LKEY) as *const u32),
                ptr::read((mr as *const u8).add(sys::offset::MR_RKEY) as *const u32),
            )
        };
        Ok(Mr {
            dev: dev.clone(),
            mr,
            lkey,
            rkey,
        })
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the registration is ours; its owner made sure no work request still uses it
        // (the QPs are destroyed first, or its writes completed).
        unsafe { (self.dev.v.dereg_mr)(self.mr) };
    }
}

/// An anonymous private mapping, unmapped when dropped.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is owned by the mapping.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and nothing refers to it any more.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// Page-aligned anonymous memory, registered with the device.
pub(crate) struct Region {
    // Dropped in this order: the registration before the mapping.
    pub reg: Mr,
    map: Mapping,
}

impl Region {
    /// Maps `len` bytes and registers them for local writes and, if `remote_write`, for the
    /// peer's RDMA WRITEs.
    pub fn new(dev: &Arc<Device>, len: usize, remote_write: bool) -> Result<Region, String> {
        let len = len.max(1).next_multiple_of(rustix::param::page_size());
        // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .map_err(|e| format!("rdma: map {len} bytes: {e}"))? as *mut u8;
        let map = Mapping { ptr, len };
        let mut access = sys::IBV_ACCESS_LOCAL_WRITE;
        if remote_write {
            access |= sys::IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY: the mapping outlives the registration (dropped after it).
        let reg = unsafe { Mr::new(dev, ptr, len, access, "a link buffer") }?;
        Ok(Region { reg, map })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.map.ptr
    }
}

/// A registration of memory the caller owns (for sends straight from it).
pub(crate) struct UserRegion {
    pub reg: Mr,
    /// The registered bytes.
    start: usize,
    len: usize,
}

impl UserRegion {
    /// Registers `len` bytes at `ptr` for the device to read (local access only: nothing
    /// remote may read or write it).
    ///
    /// # Safety
    ///
    /// The memory is mapped and readable for `len` bytes until the registration is dropped.
    pub unsafe fn new(dev: &Arc<Device>, ptr: *const u8, len: usize) -> Result<UserRegion, String> {
        // SAFETY: the caller vouches for the memory; no access flag: the device only reads it
        // for this process's own work requests.
        let reg = unsafe { Mr::new(dev, ptr.cast_mut(), len, 0, "a caller's buffer") }?;
        Ok(UserRegion {
            reg,
            start: ptr as usize,
            len,
        })
    }

    /// Whether `len` bytes at `ptr` lie inside.
    pub fn holds(&self, ptr: *const u8, len: usize) -> bool {
        let p = ptr as usize;
        p >= self.start
            && p.checked_add(len)
                .is_some_and(|e| e <= self.start + self.len)
    }
}

/// Queue depths of one link's queue pair.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Depths {
    pub send: u32,
    pub recv: u32,
}

/// A reliable-connected queue pair with its own completion queue and completion channel.
pub(crate) struct Queue {
    pub dev: Arc<Device>,
    channel: *mut IbvCompChannel,
    pub cq: *mut IbvCq,
    pub qp: *mut IbvQp,
    pub qpn: u32,
    pub fd: RawFd,
}

// SAFETY: as for Device.
unsafe impl Send for Queue {}

impl Queue {
    /// Creates the channel (non-blocking), the CQ and an RC QP, and moves the QP to INIT.
    pub fn new(dev: &Arc<Device>, depths: Depths) -> Result<Queue, String> {
        let v = dev.v;
        let name = format!("{dev:?}");
        // SAFETY: plain verbs calls on the open context; each object is owned by the Queue
        // as soon as it exists, so an early return frees what was made.
        unsafe {
            let channel = (v.create_comp_channel)(dev.ctx());
            if channel.is_null() {
                return Err(os_error(
                    &format!("rdma: {name}: create a completion channel"),
                    None,
                ));
            }
            let mut q = Queue {
                dev: dev.clone(),
                channel,
                cq: ptr::null_mut(),
                qp: ptr::null_mut(),
                qpn: 0,
                fd: ptr::read(
                    (channel as *const u8).add(sys::offset::COMP_CHANNEL_FD) as *const c_int
                ),
            };
            let fd = BorrowedFd::borrow_raw(q.fd);
            let fl = rustix::fs::fcntl_getfl(fd)
                .and_then(|fl| rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NONBLOCK));
            if let Err(e) = fl {
                return Err(format!(
                    "rdma: {name}: make the completion channel non-blocking: {e}"
                ));
            }
            let cqe = (depths.send + depths.recv + 16) as c_int;
            q.cq = (v.create_cq)(dev.ctx(), cqe, ptr::null_mut(), channel, 0);
            if q.cq.is_null() {
                return Err(os_error(
                    &format!("rdma: {name}: create a completion queue of {cqe}"),
                    None,
                ));
            }
            let mut init = sys::IbvQpInitAttr {
                qp_context: ptr::null_mut(),
                send_cq: q.cq,
                recv_cq: q.cq,
                srq: ptr::null_mut(),
                cap: sys::IbvQpCap {
                    max_send_wr: depths.send,
                    max_recv_wr: depths.recv,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: sys::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            q.qp = (v.create_qp)(dev.pd, &mut init);
            if q.qp.is_null() {
                return Err(os_error(
                    &format!("rdma: {name}: create a queue pair"),
                    None,
                ));
            }
            q.qpn = ptr::read((q.qp as *const u8).add(sys::offset::QP_NUM) as *const u32);
            let mut a = sys::IbvQpAttr {
                qp_state: sys::IBV_QPS_INIT,
                pkey_index: 0,
                port_num: dev.choice.port.port,
                qp_access_flags: (sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE)
                    as u32,
                ..Default::default()
            };
            let rc = (v.modify_qp)(
                q.qp,
                &mut a,
                sys::IBV_QP_STATE
                    | sys::IBV_QP_PKEY_INDEX
                    | sys::IBV_QP_PORT
                    | sys::IBV_QP_ACCESS_FLAGS,
            );
            if rc != 0 {
                return Err(os_error(
                    &format!("rdma: {name}: queue pair to INIT"),
                    Some(rc),
                ));
            }
            Ok(q)
        }
    }

    /// Moves the QP to RTR then RTS, aimed at the peer's QP.
    pub fn connect(&mut self, remote: &Remote, local_psn: u32) -> Result<(), String> {
        let v = self.dev.v;
        let dev = &self.dev;
        let mut a = sys::IbvQpAttr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: dev.mtu.min(remote.mtu).max(1),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.port_num = dev.choice.port.port;
        a.ah_attr.dlid = remote.lid;
        if dev.is_roce() || remote.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = Gid(remote.gid);
            a.ah_attr.grh.sgid_index = dev.choice.gid_index;
            a.ah_attr.grh.hop_limit = 255;
        }
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: the QP is live; the attribute struct has verbs.h's layout.
        let rc = unsafe { (v.modify_qp)(self.qp, &mut a, mask) };
        if rc != 0 {
            return Err(os_error("rdma: queue pair to RTR", Some(rc)));
        }
        let mut a = sys::IbvQpAttr {
            qp_state: sys::IBV_QPS_RTS,
            sq_psn: local_psn,
            // 4.096 µs × 2^14 ≈ 67 ms per try, 7 tries: a dead peer's QP errors in about 0.5 s.
            timeout: 14,
            retry_cnt: 7,
            // 7: retry forever when the peer has no receive posted (it reposts as it polls).
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: as above.
        let rc = unsafe { (v.modify_qp)(self.qp, &mut a, mask) };
        if rc != 0 {
            return Err(os_error("rdma: queue pair to RTS", Some(rc)));
        }
        Ok(())
    }

    /// Moves the QP to the error state: outstanding work is flushed and the peer's next
    /// operations fail.
    pub fn fail(&mut self) {
        let mut a = sys::IbvQpAttr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        // SAFETY: the QP is live.
        unsafe { (self.dev.v.modify_qp)(self.qp, &mut a, sys::IBV_QP_STATE) };
    }

    /// Takes every pending completion-channel event without blocking, and acknowledges them;
    /// how many there were.
    pub fn drain_events(&mut self) -> u32 {
        let mut n = 0u32;
        loop {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: the channel is live and non-blocking.
            if unsafe { (self.dev.v.get_cq_event)(self.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            n += 1;
        }
        if n > 0 {
            // SAFETY: n events of our only CQ were taken above.
            unsafe { (self.dev.v.ack_cq_events)(self.cq, n) };
        }
        n
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.drain_events();
        // SAFETY: objects made in `new`, destroyed in reverse order of their dependence.
        unsafe {
            if !self.qp.is_null() {
                (self.dev.v.destroy_qp)(self.qp);
            }
            if !self.cq.is_null() {
                (self.dev.v.destroy_cq)(self.cq);
            }
            (self.dev.v.destroy_comp_channel)(self.channel);
        }
    }
}

/// What a peer's side of one link told this side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// Its GID (RoCE, or InfiniBand across subnets).
    pub gid: [u8; 16],
    /// Whether packets need a global route header (its port is RoCE).
    pub global: bool,
    /// Its LID (InfiniBand).
    pub lid: u16,
    /// Its QP number.
    pub qpn: u32,
    /// The first packet sequence number it sends with.
    pub psn: u32,
    /// Its port's MTU (verbs' enum).
    pub mtu: u32,
    /// Its receive ring: address, key and length.
    pub ring_addr: u64,
    /// The ring's remote key.
    pub ring_rkey: u32,
    /// The ring's length in bytes.
    pub ring_len: u64,
    /// The ring's placement unit in bytes.
    pub slot: u32,
}

/// The connection message's magic and version.
const MAGIC: &[u8; 4] = b"OXR1";
/// Bytes in an encoded [`Remote`].
pub const REMOTE_LEN: usize = 4 + 16 + 1 + 2 + 4 + 4 + 1 + 8 + 4 + 8 + 4;

impl Remote {
    /// The fixed-size little-endian form sent over the authenticated side connection.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REMOTE_LEN);
        b.extend(MAGIC);
        b.extend(self.gid);
        b.push(self.global as u8);
        b.extend(self.lid.to_le_bytes());
        b.extend(self.qpn.to_le_bytes());
        b.extend(self.psn.to_le_bytes());
        b.push(self.mtu as u8);
        b.extend(self.ring_addr.to_le_bytes());
        b.extend(self.ring_rkey.to_le_bytes());
        b.extend(self.ring_len.to_le_bytes());
        b.extend(self.slot.to_le_bytes());
        b
    }

    /// Parses [`Remote::encode`]'s form; `None` for anything else (wrong length, magic,
    /// out-of-range numbers).
    pub fn decode(b: &[u8]) -> Option<Remote> {
        if b.len() != REMOTE_LEN || &b[..4] != MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let r = Remote {
            gid: b[4..20].try_into().unwrap(),
            global: match b[20] {
                0 => false,
                1 => true,
                _ => return None,
            },
            lid: u16::from_le_bytes([b[21], b[22]]),
            qpn: u32_at(23),
            psn: u32_at(27),
            mtu: b[31] as u32,
            ring_addr: u64_at(32),
            ring_rkey: u32_at(40),
            ring_len: u64_at(44),
            slot: u32_at(52),
        };
        let ok = r.qpn < 1 << 24
            && r.psn < 1 << 24
            && (1..=5).contains(&r.mtu)
            && r.slot >= 64
            && r.slot.is_multiple_of(64)
            && r.ring_len.is_multiple_of(u64::from(r.slot))
            && r.ring_addr.checked_add(r.ring_len).is_some();
        ok.then_some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_round_trips_and_garbage_is_refused() {
        let r = Remote {
            gid: [7; 16],
            global: true,
            lid: 0x1234,
            qpn: 0x11,
            psn: 0xabcdef,
            mtu: 3,
            ring_addr: 0x7f00_0000_1000,
            ring_rkey: 99,
            ring_len: 8 << 20,
            slot: 4096,
        };
        let e = r.encode();
        assert_eq!(e.len(), REMOTE_LEN);
        assert_eq!(Remote::decode(&e), Some(r));
        for cut in 0..e.len() {
            assert_eq!(Remote::decode(&e[..cut]), None);
        }
        let mut bad = e.clone();
        bad[0] ^= 1;
        assert_eq!(Remote::decode(&bad), None);
        let mut bad = e.clone();
        bad[31] = 6;
        assert_eq!(Remote::decode(&bad), None);
        let mut bad = e.clone();
        bad[26] = 1; // qpn ≥ 2^24
        assert_eq!(Remote::decode(&bad), None);
        let mut bad = e.clone();
        bad[20] = 2;
        assert_eq!(Remote::decode(&bad), None);
        let mut bad = e.clone();
        bad[52] = 1; // a slot that is not a multiple of 64
        assert_eq!(Remote::decode(&bad), None);
        let mut bad = e;
        bad[32..40].copy_from_slice(&u64::MAX.to_le_bytes()); // a ring past the address space
        assert_eq!(Remote::decode(&bad), None);
    }
}
