//! The direct way: ranks reach each other's buffers with `process_vm_readv`/
//! `process_vm_writev`. Reductions (all-reduce, reduce, reduce-scatter): each rank reduces its
//! slice, reading it from every peer's input, and writes the result where it belongs — every
//! output (all-reduce), the root's (reduce), its own (reduce-scatter, where its slice is its
//! block). Copies (all-gather, broadcast, gather, scatter, all-to-all), one copy per byte:
//! each rank reads what it lacks straight into its output, except that a gather's peers write
//! their blocks into the root's, a broadcast root in place writes a share into every peer's,
//! and an all-to-all rank in place lends its peers a copy of their blocks in its area buffer
//! (the copy the staged way makes too). And how a rank that gives up makes sure no peer
//! touches its buffers any more.

use std::time::Instant;

use super::staged::copy_out;
use super::waiter::CHECK_EVERY;
use super::{AREA_BYTES, AreaPath, Blocks, Data, PART_BYTES, Waiter, slicer};
use crate::algo::{Collective, Plan};
use crate::error::{Error, Result};
use crate::reduce::{cpu, stream};
use crate::types::{Rank, ReduceOp};

/// Direct reductions at least this large write their output (out of place: nobody touched it
/// lately) with non-temporal stores.
const STREAM_MIN: usize = 256 * 1024;
/// Bytes a direct copy reads from a peer between two looks at whether anyone gave up.
const COPY_PART: usize = 1 << 20;
/// Largest buffer an all-to-all rank in place lends from its area buffer (larger ones go
/// staged): 2 ranks, in place, forced direct, interleaved with the staged fallback it replaces
/// (`OXCCL_AREA_WAY=direct allreduce-perf --ranks 2 -o alltoall -b 64K -e 4M -f 2`, two runs
/// each, 2026-11-27): 128 KiB 9.8–10.2 µs where it took 13.5–13.9, 256 KiB 17.5–18.4 against
/// 19.1, 512 KiB and 1 MiB alike, but 4 MiB 359–383 µs against 330–340 (staged pipelines
/// its copies in pieces; a lender copies everything in before anyone copies out).
const LEND_MAX: usize = 1 << 20;
const _: () = assert!(LEND_MAX <= AREA_BYTES);
/// A page, as the kernel's copies see addresses.
const PAGE: usize = 4096;

/// `len` bytes of `buf` (at least `len + PAGE - 1` long) starting at the same offset within a
/// page as address `like`.
///
/// The kernel's copies for `process_vm_readv`/`process_vm_writev` (`rep movsb`, by the look of
/// it: user space's has the same slow case, see `oxccl_transport::shared`) ran, on AMD EPYC
/// (2026-11-27), 4.5–6× slower where the destination lies 4–16 bytes past the source
/// modulo 4 KiB: 128 KiB took 53–76 µs, against 12–16 at distance 0 or from 32 bytes
/// (`tools/perf/pvm_distance.c`).
/// A scratch buffer from `malloc` lies 16 bytes past a page, so a peer's page-aligned input read
/// into it hit that case, as does a sum written from there into a peer's output 4–16 bytes
/// further on: 2 ranks, forced direct, page-aligned buffers (`allreduce-perf`'s), 3 interleaved
/// runs, before / after: 1 MiB all-reduce 479–651 / 214–271 µs, 16 MiB 10.5–13.3 / 6.9–7.5 ms.
/// Placed at the peer's own offset within a page, the copy's distance is 0.
fn same_page_offset(buf: &mut [u8], like: usize, len: usize) -> &mut [u8] {
    let o = like.wrapping_sub(buf.as_ptr() as usize) % PAGE;
    &mut buf[o..o + len]
}

/// Whether the kernel copies from `src` to `dst` at its slow distance: `dst` 1–31 bytes past
/// `src` modulo a page (128 KiB: 54–56 µs against 12–16 at 0 and from 32 to 4095, every
/// distance of 1–4, 7, 8, 12, 15, 16, 20, 24, 28 and 31 alike; 2026-11-27). A direct copy
/// between users' buffers meets it where a block's offset is not a multiple of the page: the
/// out-of-place all-gather of 2 ranks with 1 MiB + 16 bytes a rank took 1.7–2.2 ms forced
/// direct, against 0.19–0.21 ms with 1 MiB or 1 MiB + 64 bytes. Such copies go through
/// scratch placed at the source's offset ([`AreaPath::bounce`]).
fn slow_distance(dst: usize, src: usize) -> bool {
    (1..32).contains(&(dst.wrapping_sub(src) % PAGE))
}

/// Which way [`AreaPath::bounce`] moves bytes.
#[derive(Clone, Copy)]
enum Bounce {
    /// From the peer into our `into`, of an output `total` bytes long (for the choice of
    /// stores).
    Read { into: *mut u8, total: usize },
    /// From our `from` to the peer.
    Write { from: *const u8 },
}

/// A rank's own block of a direct copy: (offset in its source, offset in its output).
type Share = (usize, usize);
/// A range a direct copy moves between us and a peer: (peer, offset in the source, offset in
/// the output, bytes). Read: the peer's source into our output; written: our source into the
/// peer's output.
type Span = (Rank, usize, usize, usize);

impl AreaPath {
    /// The direct way for `plan`: see the module's documentation. Returns `Ok(false)` when
    /// some rank did not ask for it (then nobody touched anyone's memory).
    ///
    /// Peers reach this rank's buffers from the moment it publishes their addresses. So once
    /// published, it returns — with a result or an error — only when no peer can touch them
    /// any more: on success, once every rank finished (left its loop); on any error, after
    /// [`AreaPath::stop_touching`].
    pub(super) fn go_direct(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        blocks: &Blocks,
        want: bool,
    ) -> Result<bool> {
        // A panic between publishing and returning must not hand back memory peers still
        // write: stop touching first, then let it go on.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.direct_inner(w, turn, plan, blocks, want)
        }));
        match r {
            Ok(Ok(direct)) => Ok(direct),
            Ok(Err(e)) => {
                self.stop_touching(w, turn, &e);
                Err(e)
            }
            Err(panic) => {
                let e = Error::InvalidArgument(format!(
                    "rank {}: {}: the direct way panicked",
                    self.rank, w.name
                ));
                self.stop_touching(w, turn, &e);
                std::panic::resume_unwind(panic)
            }
        }
    }

    fn direct_inner(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        want: bool,
    ) -> Result<bool> {
        let me = self.rank;
        let n = self.area.len();
        // In place, an all-to-all rank overwrites blocks of its buffer that peers read: it
        // first copies them into its large area buffer of this turn and has peers read them
        // there (the copy the staged way would make too), then reads its peers' blocks
        // straight into place. Where its buffer is larger than `LEND_MAX` (at most the area
        // buffer), it does not ask for direct (so everyone goes staged).
        let whole = n.saturating_mul(b.block);
        let lend =
            want && plan.collective == Collective::AllToAll && b.in_place && b.block > 0 && n > 1;
        let want = want && !(lend && whole > LEND_MAX);
        let lending = lend && want;
        let src = if lending {
            // The large buffer whatever the size (the turn's slot carries the addresses).
            let lent = self.claim(w, turn, AREA_BYTES)?;
            for q in (0..n).filter(|&q| q != me) {
                // SAFETY: our buffer holds `n` blocks (`Blocks::of`), the area buffer
                // `AREA_BYTES >= LEND_MAX >= whole` bytes, which this rank may write this turn
                // (`claim`); they do not overlap.
                unsafe {
                    oxccl_transport::shared::copy(
                        lent.add(q * b.block),
                        b.src.add(q * b.block),
                        b.block,
                    )
                };
            }
            lent.cast_const()
        } else {
            b.src
        };
        // A broadcast root in place has nothing to copy for itself: it writes a share of the
        // data into every peer's output while they read the rest (only the root knows its
        // placement, so it says so).
        let helps = plan.collective == Collective::Broadcast && me == plan.root && b.in_place;
        // Publish our buffers' addresses, whether we would go direct and whether we help.
        let mut addrs = [0u8; 32];
        addrs[..8].copy_from_slice(&(src as u64).to_le_bytes());
        addrs[8..16].copy_from_slice(&(b.dst as u64).to_le_bytes());
        // Bit 0: we would go direct; bit 1: our source is our area buffer of this turn.
        let lent_bit = u64::from(lending) << 1;
        addrs[16..24].copy_from_slice(&(u64::from(want) | lent_bit).to_le_bytes());
        addrs[24..].copy_from_slice(&u64::from(helps).to_le_bytes());
        let mut peer_addrs: Vec<(usize, usize)> = Vec::with_capacity(n);
        let mut lenders: Vec<bool> = Vec::with_capacity(n);
        let mut everyone = true;
        let mut root_helps = false;
        let len = plan.count * plan.dtype.size();
        let data = Data::Copy(addrs.as_ptr(), addrs.len());
        // What a peer may lend: its source in its area buffer, only where a lender would (the
        // reader copies `whole` bytes from there). Anything else is a publication written out
        // of turn, which must not send this rank's copies past the area's mapping.
        let lendable =
            plan.collective == Collective::AllToAll && b.block > 0 && n > 1 && whole <= LEND_MAX;
        let name = w.name;
        self.exchange(
            w,
            turn,
            data,
            len,
            |_| true,
            |r, data| {
                // SAFETY: every publication of this turn carries 32 bytes (the descriptors
                // matched, so every rank took this path), in area memory its owner may write: read
                // once, as a copy.
                let a: [u8; 32] = unsafe { oxccl_transport::shared::read(data.cast()) };
                let word = |i: usize| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&a[i * 8..i * 8 + 8]);
                    u64::from_le_bytes(b) as usize
                };
                peer_addrs.push((word(0), word(1)));
                let lent = word(2) & 2 != 0;
                if lent && !lendable {
                    return Err(Error::PeerFailed {
                        rank: me,
                        peer: r,
                        op: name.to_string(),
                        cause: format!(
                            "its area says its data lie in its area buffer, which cannot hold \
                             them ({whole} bytes; written out of turn?)"
                        ),
                    });
                }
                lenders.push(lent);
                everyone &= word(2) & 1 == 1;
                root_helps |= r == plan.root && word(3) == 1;
                Ok(())
            },
        )?;
        if !everyone {
            // Nobody touches anyone's memory: every rank saw the same publications.
            return Ok(false);
        }

        // From here this rank may touch peers' memory: say so before looking whether anyone
        // gave up (the order that makes `stop_touching` sound).
        self.area.enter(turn);
        if plan.collective.reduces() {
            self.direct_fold(w, turn, plan, b, &peer_addrs)?;
        } else {
            self.direct_copy(w, turn, plan, b, &peer_addrs, &lenders, root_helps)?;
        }

        // Done touching peers; they reach our buffers until they finish too: the caller gets
        // them back only then. A rank that gave up instead never finishes.
        self.area.leave();
        self.area.finish(turn);
        let gave_up = w.until(|| {
            if self.area.unfinished(turn).is_none() {
                Ok(None)
            } else if let Some(r) = self.area.abandoned(turn) {
                Ok(Some(r))
            } else {
                Err(self.area.unfinished(turn).unwrap_or(me))
            }
        })?;
        match gave_up {
            None => Ok(true),
            Some(peer) => Err(w.gave_up(peer, turn)),
        }
    }

    /// The error for a failed read or write of peer `peer`'s memory: the peer died or
    /// unmapped memory it promised to keep; either way it failed.
    fn reach_err(&self, w: &Waiter<'_>, peer: Rank, e: std::io::Error) -> Error {
        Error::PeerFailed {
            rank: self.rank,
            peer,
            op: w.name.to_string(),
            cause: format!("reaching its memory directly failed: {e}"),
        }
    }

    /// A direct reduction: our slice, part by part — read each peer's input into cache, fold,
    /// then write the result to our output and straight into the peers' outputs that want it.
    /// Writing a peer's buffer is safe in place too: only we read that slice of it, and we
    /// just did.
    fn direct_fold(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        peer_addrs: &[(usize, usize)],
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let (lo, hi) = slicer(plan.count, n, plan.dtype.size())(me);
        let (range, to): ((usize, usize, usize), Vec<Rank>) = match plan.collective {
            // Our slice is our block, and its result is ours alone.
            Collective::ReduceScatter => {
                let lo = me * b.block;
                ((lo, lo + b.block, lo), Vec::new())
            }
            Collective::Reduce if plan.root == me => ((lo, hi, 0), Vec::new()),
            Collective::Reduce => ((lo, hi, 0), vec![plan.root]),
            _ => ((lo, hi, 0), (1..n).map(|k| (me + k) % n).collect()),
        };
        self.fold_parts(w, turn, plan, b, peer_addrs, range, &to)
    }

    /// Folds input bytes `lo..hi` of every rank, part by part, into our output at `at - shift`
    /// (when we have one) and into the outputs of `to` at `at`.
    #[allow(clippy::too_many_arguments)]
    fn fold_parts(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        peer_addrs: &[(usize, usize)],
        (lo, hi, shift): (usize, usize, usize),
        to: &[Rank],
    ) -> Result<()> {
        let (n, me) = (self.area.len(), self.rank);
        let size = plan.dtype.size();
        let part = PART_BYTES / size * size;
        let stream = !b.in_place && plan.count * size >= STREAM_MIN;
        let mut scratch = self.scratch();
        let (tmp_all, acc_all) =
            bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..]).split_at_mut(PART_BYTES + PAGE);
        let mut at = lo;
        while at < hi {
            // Before touching any peer: has anyone given up, aborted, timed out, failed?
            w.check_running(turn)?;
            let len = part.min(hi - at);
            // The sum lies where the first output it goes to lies within its page (see
            // `same_page_offset`).
            let target = match to.first() {
                Some(&q) => peer_addrs[q].1 + at,
                None => (b.dst as usize).wrapping_add(at.wrapping_sub(shift)),
            };
            let acc = same_page_offset(acc_all, target, len);
            // SAFETY: our input holds our slice (`Blocks::of` checked its length).
            let mine = unsafe { std::slice::from_raw_parts(b.src.add(at), len) };
            if n == 1 {
                acc.copy_from_slice(mine);
            }
            for (k, q) in (1..n).map(|k| (k, (me + k) % n)) {
                let tmp = same_page_offset(tmp_all, peer_addrs[q].0 + at, len);
                // SAFETY: `tmp` is ours; the kernel checks the peer's range, which the peer
                // keeps valid and unchanged until every rank finishes this turn or stops
                // touching it (`stop_touching`), and no rank gave up when we last looked.
                unsafe {
                    self.area
                        .read_from(q, peer_addrs[q].0 + at, tmp.as_mut_ptr(), len)
                }
                .map_err(|e| self.reach_err(w, q, e))?;
                if k == 1 {
                    cpu::reduce_into_bytes(acc, mine, tmp, plan.dtype, plan.op.combiner())?;
                } else {
                    cpu::reduce_bytes(acc, tmp, plan.dtype, plan.op.combiner())?;
                }
            }
            if plan.op == ReduceOp::Avg {
                cpu::divide_bytes(acc, plan.dtype, n)?;
            }
            if !b.dst.is_null() {
                // SAFETY: our output holds this range (`Blocks::of`); the input is either the
                // same memory, whose range we are done reading, or disjoint from it.
                let out = unsafe { std::slice::from_raw_parts_mut(b.dst.add(at - shift), len) };
                if stream {
                    stream::copy_streaming(out, acc);
                } else {
                    // In place, these lines were just read: they are in cache.
                    out.copy_from_slice(acc);
                }
            }
            for &q in to {
                // The sum lies at the first receiver's offset within a page; a receiver whose
                // output lies 1-31 bytes further (3 ranks or more, placed differently) gets
                // it through `tmp`, free again, placed at its offset (see `bounce`).
                let remote = peer_addrs[q].1 + at;
                let from = acc.as_ptr();
                // SAFETY: `acc` is ours, disjoint from `tmp_all`; the peer keeps its output
                // valid until every rank finishes this turn or stops touching it, and does
                // not touch this range of it meanwhile.
                unsafe {
                    if slow_distance(remote, from as usize) {
                        self.bounce_through(tmp_all, q, remote, len, Bounce::Write { from })
                    } else {
                        self.area.write_to(q, remote, from, len)
                    }
                }
                .map_err(|e| self.reach_err(w, q, e))?;
            }
            at += len;
        }
        Ok(())
    }

    /// A direct copy: each rank reads what it lacks straight from the peers' buffers into its
    /// output — all-gather every peer's block, broadcast the root's data, scatter its block of
    /// the root's input, all-to-all its block of every peer's input — and copies its own share
    /// locally when not in place; a gather's peers write their blocks into the root's output
    /// (2 ranks, 8 MiB blocks out of place: the root then copies 8 MiB where it copied 16 MiB
    /// while the peer idled). A broadcast root in place (`root_helps`) writes its slice of `n`
    /// into every peer's output, and the peers read the rest: each rank moves `(n − 1)/n` of
    /// the data, where otherwise the root would idle while every peer moved all of it (2 ranks
    /// on the 2026-11-26 host, 16 MiB: 2.1 ms before).
    #[allow(clippy::too_many_arguments)]
    fn direct_copy(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        b: &Blocks,
        peer_addrs: &[(usize, usize)],
        lenders: &[bool],
        root_helps: bool,
    ) -> Result<()> {
        let (n, me, root) = (self.area.len(), self.rank, plan.root);
        let block = b.block;
        let peers = || (1..n).map(move |k| (me + k) % n);
        // The root's slice when it helps: it writes, the peers skip it.
        let (lo, hi) = if root_helps {
            slicer(plan.count, n, plan.dtype.size())(root)
        } else {
            (0, 0)
        };
        // Our own share (source offset, output offset); what to read and what to write.
        let mut to: Vec<Span> = Vec::new();
        let (own, from): (Option<Share>, Vec<Span>) = match plan.collective {
            Collective::AllGather => (
                Some((0, me * block)),
                peers().map(|q| (q, 0, q * block, block)).collect(),
            ),
            Collective::Broadcast if me == root => {
                to = peers().map(|q| (q, lo, lo, hi - lo)).collect();
                (Some((0, 0)), Vec::new())
            }
            Collective::Broadcast => (None, vec![(root, 0, 0, lo), (root, hi, hi, block - hi)]),
            // Every peer writes its block into the root's output, side by side, while the root
            // copies its own: where the root read them all one after another.
            Collective::Gather if me == root => (Some((0, me * block)), Vec::new()),
            Collective::Gather => {
                to = vec![(root, 0, me * block, block)];
                (None, Vec::new())
            }
            Collective::Scatter if me == root => (Some((me * block, 0)), Vec::new()),
            Collective::Scatter => (None, vec![(root, me * block, 0, block)]),
            Collective::AllToAll => (
                Some((me * block, me * block)),
                peers().map(|q| (q, me * block, q * block, block)).collect(),
            ),
            c => {
                return Err(Error::InvalidArgument(format!(
                    "rank {me}: {}: {c} is not a copy",
                    w.name
                )));
            }
        };
        if let Some((src_at, dst_at)) = own
            && !b.in_place
            && block > 0
        {
            // As the staged way copies (non-temporal stores from 8 MiB of output, `rep movsb`
            // from 4 KiB): `memcpy` ran at 5.6 GB/s on a 32 MiB block (2 ranks, 64 MiB
            // all-gather out of place: 9.6 ms, in place 3.5 ms), the kernel's copy of the
            // peer's at 9.6.
            let total = match plan.collective {
                Collective::AllGather | Collective::Gather | Collective::AllToAll => block * n,
                _ => block,
            };
            // SAFETY: our source and output hold these blocks (`Blocks::of`); out of place
            // they do not overlap, and nobody else writes our output's block meanwhile.
            unsafe { copy_out(b.src.add(src_at), b.dst.add(dst_at), block, total) };
        }
        let spans = from.into_iter().map(|s| (false, s));
        for (write, (q, src_at, dst_at, bytes)) in spans.chain(to.into_iter().map(|s| (true, s))) {
            let mut at = 0;
            while at < bytes {
                w.check_running(turn)?;
                let len = COPY_PART.min(bytes - at);
                let (src, dst) = (src_at + at, dst_at + at);
                // SAFETY: a read: our output holds `dst_at + bytes` bytes, which nobody else
                // touches meanwhile (a helping root writes only the range we skip), and the
                // peer keeps its source valid as in `fold_parts`. A write: our source holds
                // `src_at + bytes` bytes (`Blocks::of`), and the peer keeps its output valid
                // until every rank finishes this turn or stops touching it, and does not touch
                // this range of it meanwhile (a broadcast peer reads the rest; a gather root
                // copies only its own block).
                unsafe {
                    if write {
                        let remote = peer_addrs[q].1 + dst;
                        let local = b.src.add(src);
                        if slow_distance(remote, local as usize) {
                            self.bounce(q, remote, len, Bounce::Write { from: local })
                        } else {
                            self.area.write_to(q, remote, local, len)
                        }
                    } else if lenders[q] {
                        // An all-to-all peer in place lent its blocks in its area buffer of
                        // this turn, mapped here too: no system call. It keeps them there
                        // until every rank finishes this turn.
                        let from = self.area.buffer_of(q, turn).add(src);
                        copy_out(from, b.dst.add(dst), len, n * block);
                        Ok(())
                    } else {
                        let remote = peer_addrs[q].0 + src;
                        let local = b.dst.add(dst);
                        if slow_distance(local as usize, remote) {
                            let total = n * block;
                            self.bounce(q, remote, len, Bounce::Read { into: local, total })
                        } else {
                            self.area.read_from(q, remote, local, len)
                        }
                    }
                }
                .map_err(|e| self.reach_err(w, q, e))?;
                at += len;
            }
        }
        Ok(())
    }

    /// The scratch memory of direct calls, two parts of [`PART_BYTES`] and a page each.
    fn scratch(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        scratch.resize(2 * (PART_BYTES + PAGE) / 8, 0);
        scratch
    }

    /// Moves `len` bytes between `remote` in rank `q` and our memory through scratch at
    /// `remote`'s offset within a page (see [`slow_distance`]): the kernel copies at distance
    /// 0, and a user-space copy, which has no slow distance, moves the bytes between the
    /// scratch and our memory.
    ///
    /// # Safety
    ///
    /// As for [`oxccl_transport_shm::area::Area::read_from`] into `into..into + len`
    /// ([`Bounce::Read`]), or [`oxccl_transport_shm::area::Area::write_to`] from
    /// `from..from + len` ([`Bounce::Write`]).
    unsafe fn bounce(
        &self,
        q: Rank,
        remote: usize,
        len: usize,
        way: Bounce,
    ) -> std::io::Result<()> {
        let mut scratch = self.scratch();
        let buf = bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..]);
        // SAFETY: the caller's contract; `buf` is ours.
        unsafe { self.bounce_through(buf, q, remote, len, way) }
    }

    /// [`AreaPath::bounce`] through `buf` (at least [`PART_BYTES`] and a page long), for a
    /// caller that holds the scratch already.
    ///
    /// # Safety
    ///
    /// As for [`AreaPath::bounce`], and the caller's memory is disjoint from `buf`.
    unsafe fn bounce_through(
        &self,
        buf: &mut [u8],
        q: Rank,
        remote: usize,
        len: usize,
        way: Bounce,
    ) -> std::io::Result<()> {
        let mut at = 0;
        while at < len {
            let l = PART_BYTES.min(len - at);
            let tmp = same_page_offset(buf, remote + at, l);
            // SAFETY: `tmp` is ours and disjoint from the caller's memory; the rest is the
            // caller's contract.
            unsafe {
                match way {
                    Bounce::Read { into, total } => {
                        self.area.read_from(q, remote + at, tmp.as_mut_ptr(), l)?;
                        copy_out(tmp.as_ptr(), into.add(at), l, total);
                    }
                    Bounce::Write { from } => {
                        oxccl_transport::shared::copy(tmp.as_mut_ptr(), from.add(at), l);
                        self.area.write_to(q, remote + at, tmp.as_ptr(), l)?;
                    }
                }
            }
            at += l;
        }
        Ok(())
    }

    /// After an error in a direct call whose addresses this rank published: tells every
    /// rank it gave up, stops touching peers, and waits until no peer can touch this rank's
    /// buffers — every peer has left its loop, or exited. Peers look before every part (a few
    /// dozen microseconds of copying), so this is prompt; it has no deadline of its own and
    /// ignores abort, since returning earlier would hand the caller memory a peer may still
    /// write. A peer frozen in the middle of a part (stopped by a debugger or SIGSTOP) holds
    /// this rank until it goes on or exits; that is logged once a timeout.
    ///
    /// `e` fails the communicator (peers are told) once this rank no longer touches theirs.
    fn stop_touching(&self, w: &mut Waiter<'_>, turn: u64, e: &Error) {
        self.area.abandon(turn);
        self.area.leave();
        w.fail(e);
        let started = Instant::now();
        let mut warned = started;
        for q in (0..self.area.len()).filter(|&q| q != self.rank) {
            let mut spins = 0u32;
            while self.area.touching(q, turn) {
                spins = spins.saturating_add(1);
                if spins < 256 {
                    std::hint::spin_loop();
                    continue;
                }
                if !self.area.peer_alive(q) {
                    break;
                }
                if warned.elapsed() >= w.timeout {
                    warned = Instant::now();
                    tracing::error!(
                        rank = self.rank,
                        peer = q,
                        op = %w.name,
                        "rank {q} still reaches this rank's buffers after {:?}; waiting until it \
                         stops or exits",
                        started.elapsed()
                    );
                }
                self.area
                    .sleep_on(q, CHECK_EVERY, || !self.area.touching(q, turn));
            }
        }
    }
}
