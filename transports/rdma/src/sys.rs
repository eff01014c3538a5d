//! The slice of libibverbs this transport uses: the structures it builds or reads, with the
//! layouts of rdma-core's `<infiniband/verbs.h>` on 64-bit Linux (checked against the real
//! header by `tests/layout.rs` wherever the header is installed), and the functions, looked up
//! in `libibverbs.so.1` at run time.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are `static inline`
//! in the header: they call through the context's operation table, and so does this module
//! ([`Verbs::post_send`] and friends).

#![allow(missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_SEND_SIGNALED: c_uint = 2;
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = 129;
pub const IBV_WC_WITH_IMM: c_uint = 2;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 8;
pub const IBV_QP_PKEY_INDEX: c_int = 16;
pub const IBV_QP_PORT: c_int = 32;
pub const IBV_QP_AV: c_int = 128;
pub const IBV_QP_PATH_MTU: c_int = 256;
pub const IBV_QP_TIMEOUT: c_int = 512;
pub const IBV_QP_RETRY_CNT: c_int = 1024;
pub const IBV_QP_RNR_RETRY: c_int = 2048;
pub const IBV_QP_RQ_PSN: c_int = 4096;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 8192;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 32768;
pub const IBV_QP_SQ_PSN: c_int = 65536;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 131072;
pub const IBV_QP_DEST_QPN: c_int = 1048576;
pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// Byte offsets into structures this module only reads a field or two of.
pub mod offset {
    pub const CONTEXT_POLL_CQ: usize = 96;
    pub const CONTEXT_REQ_NOTIFY_CQ: usize = 104;
    pub const CONTEXT_POST_SEND: usize = 208;
    pub const CONTEXT_POST_RECV: usize = 216;
    pub const PORT_ATTR_STATE: usize = 0;
    pub const PORT_ATTR_ACTIVE_MTU: usize = 8;
    pub const PORT_ATTR_LID: usize = 34;
    pub const PORT_ATTR_LINK_LAYER: usize = 46;
    pub const MR_LKEY: usize = 36;
    pub const MR_RKEY: usize = 40;
    pub const QP_NUM: usize = 52;
    pub const COMP_CHANNEL_FD: usize = 8;
}

/// Opaque handles.
#[repr(C)]
pub struct IbvDevice {
    _p: [u8; 0],
}
#[repr(C)]
pub struct IbvContext {
    _p: [u8; 0],
}
#[repr(C)]
pub struct IbvPd {
    _p: [u8; 0],
}
#[repr(C)]
pub struct IbvMr {
    _p: [u8; 0],
}
#[repr(C)]
pub struct IbvCompChannel {
    _p: [u8; 0],
}
/// Starts with its context, which is all this module reads.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}
/// Starts with its context.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
}

/// `union ibv_gid` (its 64-bit view makes it 8-aligned).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gid(pub [u8; 16]);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`, with the RDMA member of its `wr` union spelled out.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// Network byte order.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub _rest: [u8; 76],
}

#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvGlobalRoute {
    pub dgid: Gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpAttr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

const _: () = {
    assert!(size_of::<IbvSendWr>() == 128);
    assert!(std::mem::offset_of!(IbvSendWr, imm_data) == 36);
    assert!(std::mem::offset_of!(IbvSendWr, remote_addr) == 40);
    assert!(std::mem::offset_of!(IbvSendWr, rkey) == 48);
    assert!(size_of::<IbvRecvWr>() == 32);
    assert!(size_of::<IbvSge>() == 16);
    assert!(size_of::<IbvWc>() == 48);
    assert!(std::mem::offset_of!(IbvWc, imm_data) == 24);
    assert!(std::mem::offset_of!(IbvWc, wc_flags) == 36);
    assert!(size_of::<IbvQpCap>() == 20);
    assert!(size_of::<IbvQpInitAttr>() == 64);
    assert!(std::mem::offset_of!(IbvQpInitAttr, qp_type) == 52);
    assert!(size_of::<IbvGlobalRoute>() == 24);
    assert!(size_of::<IbvAhAttr>() == 32);
    assert!(std::mem::offset_of!(IbvAhAttr, port_num) == 30);
    assert!(size_of::<IbvQpAttr>() == 144);
    assert!(std::mem::offset_of!(IbvQpAttr, ah_attr) == 56);
    assert!(std::mem::offset_of!(IbvQpAttr, pkey_index) == 120);
    assert!(std::mem::offset_of!(IbvQpAttr, rnr_retry) == 132);
};

/// Every layout fact this module relies on, by the C expression that gives it, for
/// `tests/layout.rs` to compare with a program compiled against the real header.
#[doc(hidden)]
pub fn layout_facts() -> Vec<(&'static str, i64)> {
    use std::mem::offset_of;
    vec![
        (
            "offsetof(struct ibv_context, ops.poll_cq)",
            offset::CONTEXT_POLL_CQ as i64,
        ),
        (
            "offsetof(struct ibv_context, ops.req_notify_cq)",
            offset::CONTEXT_REQ_NOTIFY_CQ as i64,
        ),
        (
            "offsetof(struct ibv_context, ops.post_send)",
            offset::CONTEXT_POST_SEND as i64,
        ),
        (
            "offsetof(struct ibv_context, ops.post_recv)",
            offset::CONTEXT_POST_RECV as i64,
        ),
        (
            "offsetof(struct ibv_port_attr, state)",
            offset::PORT_ATTR_STATE as i64,
        ),
        (
            "offsetof(struct ibv_port_attr, active_mtu)",
            offset::PORT_ATTR_ACTIVE_MTU as i64,
        ),
        (
            "offsetof(struct ibv_port_attr, lid)",
            offset::PORT_ATTR_LID as i64,
        ),
        (
            "offsetof(struct ibv_port_attr, link_layer)",
            offset::PORT_ATTR_LINK_LAYER as i64,
        ),
        ("offsetof(struct ibv_mr, lkey)", offset::MR_LKEY as i64),
        ("offsetof(struct ibv_mr, rkey)", offset::MR_RKEY as i64),
        ("offsetof(struct ibv_qp, qp_num)", offset::QP_NUM as i64),
        (
            "offsetof(struct ibv_comp_channel, fd)",
            offset::COMP_CHANNEL_FD as i64,
        ),
        ("offsetof(struct ibv_cq, context)", 0),
        ("offsetof(struct ibv_qp, context)", 0),
        ("sizeof(union ibv_gid)", size_of::<Gid>() as i64),
        ("sizeof(struct ibv_sge)", size_of::<IbvSge>() as i64),
        ("sizeof(struct ibv_send_wr)", size_of::<IbvSendWr>() as i64),
        (
            "offsetof(struct ibv_send_wr, next)",
            offset_of!(IbvSendWr, next) as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, sg_list)",
            offset_of!(IbvSendWr, sg_list) as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, num_sge)",
            offset_of!(IbvSendWr, num_sge) as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, opcode)",
            offset_of!(IbvSendWr, opcode) as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, send_flags)",
            offset_of!(IbvSendWr, send_flags) as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, imm_data)",
            offset_of!(IbvSendWr, imm_data) as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(IbvSendWr, remote_addr) as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            offset_of!(IbvSendWr, rkey) as i64,
        ),
        ("sizeof(struct ibv_recv_wr)", size_of::<IbvRecvWr>() as i64),
        (
            "offsetof(struct ibv_recv_wr, num_sge)",
            offset_of!(IbvRecvWr, num_sge) as i64,
        ),
        ("sizeof(struct ibv_wc)", size_of::<IbvWc>() as i64),
        (
            "offsetof(struct ibv_wc, status)",
            offset_of!(IbvWc, status) as i64,
        ),
        (
            "offsetof(struct ibv_wc, opcode)",
            offset_of!(IbvWc, opcode) as i64,
        ),
        (
            "offsetof(struct ibv_wc, byte_len)",
            offset_of!(IbvWc, byte_len) as i64,
        ),
        (
            "offsetof(struct ibv_wc, imm_data)",
            offset_of!(IbvWc, imm_data) as i64,
        ),
        (
            "offsetof(struct ibv_wc, wc_flags)",
            offset_of!(IbvWc, wc_flags) as i64,
        ),
        ("sizeof(struct ibv_qp_cap)", size_of::<IbvQpCap>() as i64),
        (
            "sizeof(struct ibv_qp_init_attr)",
            size_of::<IbvQpInitAttr>() as i64,
        ),
        (
            "offsetof(struct ibv_qp_init_attr, cap)",
            offset_of!(IbvQpInitAttr, cap) as i64,
        ),
        (
            "offsetof(struct ibv_qp_init_attr, qp_type)",
            offset_of!(IbvQpInitAttr, qp_type) as i64,
        ),
        (
            "offsetof(struct ibv_qp_init_attr, sq_sig_all)",
            offset_of!(IbvQpInitAttr, sq_sig_all) as i64,
        ),
        (
            "sizeof(struct ibv_global_route)",
            size_of::<IbvGlobalRoute>() as i64,
        ),
        (
            "offsetof(struct ibv_global_route, sgid_index)",
            offset_of!(IbvGlobalRoute, sgid_index) as i64,
        ),
        (
            "offsetof(struct ibv_global_route, hop_limit)",
            offset_of!(IbvGlobalRoute, hop_limit) as i64,
        ),
        ("sizeof(struct ibv_ah_attr)", size_of::<IbvAhAttr>() as i64),
        (
            "offsetof(struct ibv_ah_attr, dlid)",
            offset_of!(IbvAhAttr, dlid) as i64,
        ),
        (
            "offsetof(struct ibv_ah_attr, is_global)",
            offset_of!(IbvAhAttr, is_global) as i64,
        ),
        (
            "offsetof(struct ibv_ah_attr, port_num)",
            offset_of!(IbvAhAttr, port_num) as i64,
        ),
        ("sizeof(struct ibv_qp_attr)", size_of::<IbvQpAttr>() as i64),
        (
            "offsetof(struct ibv_qp_attr, path_mtu)",
            offset_of!(IbvQpAttr, path_mtu) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, rq_psn)",
            offset_of!(IbvQpAttr, rq_psn) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, sq_psn)",
            offset_of!(IbvQpAttr, sq_psn) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, dest_qp_num)",
            offset_of!(IbvQpAttr, dest_qp_num) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, qp_access_flags)",
            offset_of!(IbvQpAttr, qp_access_flags) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, ah_attr)",
            offset_of!(IbvQpAttr, ah_attr) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, pkey_index)",
            offset_of!(IbvQpAttr, pkey_index) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, max_rd_atomic)",
            offset_of!(IbvQpAttr, max_rd_atomic) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, max_dest_rd_atomic)",
            offset_of!(IbvQpAttr, max_dest_rd_atomic) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, min_rnr_timer)",
            offset_of!(IbvQpAttr, min_rnr_timer) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, port_num)",
            offset_of!(IbvQpAttr, port_num) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, timeout)",
            offset_of!(IbvQpAttr, timeout) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, retry_cnt)",
            offset_of!(IbvQpAttr, retry_cnt) as i64,
        ),
        (
            "offsetof(struct ibv_qp_attr, rnr_retry)",
            offset_of!(IbvQpAttr, rnr_retry) as i64,
        ),
        ("IBV_QPT_RC", IBV_QPT_RC as i64),
        ("IBV_QPS_INIT", IBV_QPS_INIT as i64),
        ("IBV_QPS_RTR", IBV_QPS_RTR as i64),
        ("IBV_QPS_RTS", IBV_QPS_RTS as i64),
        ("IBV_QPS_ERR", IBV_QPS_ERR as i64),
        (
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            IBV_WR_RDMA_WRITE_WITH_IMM as i64,
        ),
        ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as i64),
        ("IBV_WC_SUCCESS", IBV_WC_SUCCESS as i64),
        ("IBV_WC_WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR as i64),
        ("IBV_WC_RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR as i64),
        ("IBV_WC_RNR_RETRY_EXC_ERR", IBV_WC_RNR_RETRY_EXC_ERR as i64),
        ("IBV_WC_RDMA_WRITE", IBV_WC_RDMA_WRITE as i64),
        (
            "IBV_WC_RECV_RDMA_WITH_IMM",
            IBV_WC_RECV_RDMA_WITH_IMM as i64,
        ),
        ("IBV_WC_WITH_IMM", IBV_WC_WITH_IMM as i64),
        ("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as i64),
        ("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE as i64),
        ("IBV_QP_STATE", IBV_QP_STATE as i64),
        ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as i64),
        ("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as i64),
        ("IBV_QP_PORT", IBV_QP_PORT as i64),
        ("IBV_QP_AV", IBV_QP_AV as i64),
        ("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as i64),
        ("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as i64),
        ("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as i64),
        ("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as i64),
        ("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as i64),
        ("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as i64),
        ("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as i64),
        ("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as i64),
        (
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            IBV_QP_MAX_DEST_RD_ATOMIC as i64,
        ),
        ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as i64),
        ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as i64),
        (
            "IBV_LINK_LAYER_INFINIBAND",
            IBV_LINK_LAYER_INFINIBAND as i64,
        ),
        ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as i64),
    ]
}

type PollCq = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
type ReqNotifyCq = unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int;
type PostSend = unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// The functions of `libibverbs.so.1`, looked up once per process.
#[allow(clippy::type_complexity)]
pub struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut IbvDevice,
    pub free_device_list: unsafe extern "C" fn(*mut *mut IbvDevice),
    pub get_device_name: unsafe extern "C" fn(*mut IbvDevice) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut IbvDevice) -> *mut IbvContext,
    pub close_device: unsafe extern "C" fn(*mut IbvContext) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut IbvContext, u8, *mut c_void) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut Gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvPd,
    pub dealloc_pd: unsafe extern "C" fn(*mut IbvPd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr,
    pub dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvCompChannel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut IbvCompChannel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut IbvContext,
        c_int,
        *mut c_void,
        *mut IbvCompChannel,
        c_int,
    ) -> *mut IbvCq,
    pub destroy_cq: unsafe extern "C" fn(*mut IbvCq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut IbvCompChannel, *mut *mut IbvCq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut IbvCq, c_uint),
    pub create_qp: unsafe extern "C" fn(*mut IbvPd, *mut IbvQpInitAttr) -> *mut IbvQp,
    pub modify_qp: unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut IbvQp) -> c_int,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verbs(libibverbs.so.1)")
    }
}

/// The process's libibverbs, loaded on first use; the error says why it could not be.
pub fn verbs() -> Result<&'static Verbs, String> {
    static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();
    VERBS.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Verbs, String> {
    // SAFETY: loading rdma-core's libibverbs runs its initialisers, which only read the
    // provider configuration; it is never unloaded (the Verbs lives in a static).
    let lib = unsafe { libloading::Library::new("libibverbs.so.1") }
        .map_err(|e| format!("cannot load libibverbs.so.1 (install rdma-core's libibverbs1 and the provider for your NIC): {e}"))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the C signature of the field it is stored in (verbs.h).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("libibverbs.so.1 lacks {}: {e}", $name))?
        };
    }
    Ok(Verbs {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        reg_mr: sym!("ibv_reg_mr"),
        dereg_mr: sym!("ibv_dereg_mr"),
        create_comp_channel: sym!("ibv_create_comp_channel"),
        destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        get_cq_event: sym!("ibv_get_cq_event"),
        ack_cq_events: sym!("ibv_ack_cq_events"),
        create_qp: sym!("ibv_create_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
        _lib: lib,
    })
}

/// The operation at byte `at` of `ctx`'s operation table.
///
/// # Safety
///
/// `ctx` must be an open device context, and `at` one of [`offset`]'s `CONTEXT_*` entries,
/// whose operation has type `F`.
unsafe fn op<F: Copy>(ctx: *mut IbvContext, at: usize) -> F {
    // SAFETY: per the contract, `ctx + at` holds a function pointer of type F.
    unsafe { std::ptr::read((ctx as *const u8).add(at) as *const F) }
}

impl Verbs {
    /// `ibv_poll_cq`.
    ///
    /// # Safety
    ///
    /// `cq` must be a live completion queue and `wc` hold room for `n` entries.
    pub unsafe fn poll_cq(&self, cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
        // SAFETY: a live CQ's first field is its context, whose table has poll_cq.
        unsafe {
            let f: PollCq = op((*cq).context, offset::CONTEXT_POLL_CQ);
            f(cq, n, wc)
        }
    }

    /// `ibv_req_notify_cq`.
    ///
    /// # Safety
    ///
    /// `cq` must be a live completion queue.
    pub unsafe fn req_notify_cq(&self, cq: *mut IbvCq, solicited_only: bool) -> c_int {
        // SAFETY: as for poll_cq.
        unsafe {
            let f: ReqNotifyCq = op((*cq).context, offset::CONTEXT_REQ_NOTIFY_CQ);
            f(cq, solicited_only as c_int)
        }
    }

    /// `ibv_post_send`.
    ///
    /// # Safety
    ///
    /// `qp` must be a live queue pair and `wr` a valid chain whose memory is registered.
    pub unsafe fn post_send(&self, qp: *mut IbvQp, wr: *mut IbvSendWr) -> c_int {
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP's first field is its context, whose table has post_send.
        unsafe {
            let f: PostSend = op((*qp).context, offset::CONTEXT_POST_SEND);
            f(qp, wr, &mut bad)
        }
    }

    /// `ibv_post_recv`.
    ///
    /// # Safety
    ///
    /// As for [`Verbs::post_send`].
    pub unsafe fn post_recv(&self, qp: *mut IbvQp, wr: *mut IbvRecvWr) -> c_int {
        let mut bad = std::ptr::null_mut();
        // SAFETY: as for post_send.
        unsafe {
            let f: PostRecv = op((*qp).context, offset::CONTEXT_POST_RECV);
            f(qp, wr, &mut bad)
        }
    }
}

/// The name libibverbs gives a work completion status (`ibv_wc_status_str`'s words).
pub fn wc_status_name(status: c_uint) -> &'static str {
    const NAMES: [&str; 23] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "work request flushed",
        "memory management operation error",
        "bad response",
        "local access error",
        "remote invalid request",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation",
        "remote invalid RD request",
        "remote aborted",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout",
        "general error",
        "tag matching error",
    ];
    NAMES
        .get(status as usize)
        .copied()
        .unwrap_or("unknown status")
}
