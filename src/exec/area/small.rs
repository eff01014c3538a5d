//! Small calls in one turn: a broadcast, a reduce, an all-gather or a gather whose data fit a
//! slot, an all-to-all, a reduce-scatter or a scatter whose blocks together do, and the
//! one-shot all-reduce of as much, run straight from the communicator's call ([`Engine::run_area_now`])
//! instead of through the layers every call of any size and way takes (the way's dispatch,
//! the pieces, the generic exchange). The same turn, descriptor, lagged check, reads, folds,
//! and failure checks as [`AreaPath::staged`] and the one-shot way take for such a call, so a
//! rank here and a rank on the general path (one whose engine had work queued) agree, and
//! every error is the general path's: the helpers are shared.
//!
//! A call of a few bytes costs its instructions, and the layers were a good part of them: on
//! 2 ranks a broadcast's root ran 1342 instructions per benchmark call and its other rank 1320
//! before, 1036 and 972 with this lane (and the other savings of its commit; callgrind,
//! `tools/perf/call-ir.sh -r R target/release/allreduce-perf broadcast`), and the 8-byte
//! broadcast took 0.74 / 0.73 of the time (out of place / in place, paired runs of the two
//! builds, `tools/perf/ab.sh -n 16 OLD NEW -- --ranks 2 -o broadcast -b 8 -e 1K -f 128 -n 20000
//! -w 1000 -R 1 --min-time 0.05 -c 0`, 2026-11-29).
//!
//! [`Engine::run_area_now`]: crate::exec::driver::Engine::run_area_now

use std::time::Duration;

use oxccl_transport_shm::area::{self, DESC_BYTES, SLOT_BYTES};

use super::{AreaPath, Blocks, Waiter};
use crate::algo::{Collective, Plan};
use crate::error::{Error, Result};
use crate::exec::driver::Engine;
use crate::exec::op::OpName;
use crate::reduce::cpu;
use crate::reduce::shared::Shared;
use crate::tune::Way;
use crate::types::{Rank, ReduceOp};

impl AreaPath {
    /// Whether `plan`, sent `way`, is a call of this lane: one turn, at most a slot of data
    /// per rank (an all-to-all, a reduce-scatter or a scatter's root publishes a block for
    /// every rank; the
    /// general path takes such calls in one turn too: `n` blocks in a slot make a block of at
    /// most `SLOT_BYTES / n` bytes, within its piece of `STAGE_BYTES / n`).
    #[inline]
    pub fn small(&self, plan: &Plan, way: Way) -> bool {
        let block = plan.count.saturating_mul(plan.dtype.size());
        let bytes = match plan.collective {
            Collective::AllToAll | Collective::ReduceScatter | Collective::Scatter => {
                block.saturating_mul(self.area.len())
            }
            _ => block,
        };
        (1..=SLOT_BYTES).contains(&bytes)
            && !plan.on_device
            && matches!(
                (plan.collective, way),
                (Collective::AllReduce, Way::OneShot)
                    | (
                        Collective::Broadcast
                            | Collective::Reduce
                            | Collective::AllGather
                            | Collective::Gather
                            | Collective::AllToAll
                            | Collective::ReduceScatter
                            | Collective::Scatter,
                        Way::Staged
                    )
            )
    }

    /// Hands every rank's publication of `turn` to `each` in rank order (ours at `mine`), each
    /// peer's once it is there and checked against our call (`call`: our descriptor, its tag,
    /// the call's length); `ahead`: asking for each peer's next publication as it goes
    /// ([`AreaPath::prefetch_next`]).
    #[inline(always)]
    fn read_all(
        &self,
        w: &mut Waiter<'_>,
        (turn, ahead): (u64, bool),
        call: (&[u8; DESC_BYTES], u64, usize),
        mine: *mut u8,
        mut each: impl FnMut(Rank, *const u8) -> Result<()>,
    ) -> Result<()> {
        for r in 0..self.area.len() {
            let data = if r == self.rank {
                mine.cast_const()
            } else {
                let p = self.published_by(w, r, turn)?;
                self.accept(w, r, turn, &p, call)?;
                if ahead {
                    self.prefetch_next(r, turn);
                }
                p.data
            };
            each(r, data)?;
        }
        Ok(())
    }

    /// Runs `plan` (a call [`AreaPath::small`] takes) as collective `seq` in area turn
    /// `*turns`, advancing it.
    pub fn run_small(
        &self,
        engine: &mut Engine,
        (seq, turns): (u64, &mut u64),
        (plan, way): (&Plan, Way),
        (input, output): ((*const u8, usize), (*mut u8, usize)),
        timeout: Duration,
    ) -> Result<()> {
        let name = OpName::Collective(plan.collective, seq);
        let ours = self.descriptor(seq, plan, self.protocol(way));
        let (me, n) = (self.rank, self.area.len());
        let Some(b) = Blocks::of(plan, me, n, input, output) else {
            return Err(Error::InvalidArgument(format!(
                "rank {me}: {name}: buffers too small or not for this path"
            )));
        };
        let turn = *turns;
        *turns += 1;
        let mut w = Waiter::new(engine, &self.area, &name, &ours, (timeout, self.pace), me);
        w.turn = turn;
        let desc = ours.encode();
        let tag = area::tag(&desc);
        let len = b.block;
        let call = (&desc, tag, len);
        // An in-place reduce's root other than rank 0 of 3 or more ranks folds its own bytes
        // from the copy it publishes, as on the general path ([`AreaPath::reduce_piece`]).
        let staged_own = plan.collective == Collective::Reduce
            && me == plan.root
            && b.in_place
            && me != 0
            && n > 2;
        // What this rank publishes: the root's data (broadcast; scatter: a block for every
        // rank, at its place), everybody's but the root's (reduce), everybody's (all-reduce,
        // all-gather, gather; all-to-all and reduce-scatter: a block for every rank, at its
        // place, as the general path stages them).
        let publishes = match plan.collective {
            Collective::Broadcast | Collective::Scatter => me == plan.root,
            Collective::Reduce => me != plan.root || staged_own,
            _ => true,
        };
        let per_peer = matches!(
            plan.collective,
            Collective::AllToAll | Collective::ReduceScatter | Collective::Scatter
        );
        let (mine, bytes) = if per_peer && publishes {
            // One piece of every block, the whole of each here (`small`).
            let bytes = self.stage_blocks(&mut w, turn, &b, 0, len)?;
            (self.area.my_buffer(turn, bytes), bytes)
        } else {
            let bytes = if publishes { len } else { 0 };
            let mine = self.claim(&mut w, turn, bytes)?;
            if publishes {
                // SAFETY: the input holds `len` readable bytes, which fit a slot (`small`), and
                // this rank may write its place (`claim`).
                unsafe { std::ptr::copy_nonoverlapping(b.src, mine, len) };
            }
            (mine, bytes)
        };
        self.area.publish(turn, &desc, tag, len, bytes);
        // Our own data once the others can read: the root's copy (broadcast, scatter), our
        // block (all-gather, a gather's root, all-to-all); in place it is there already.
        if !b.in_place {
            let root = me == plan.root;
            let own = match plan.collective {
                Collective::Broadcast if root => Some((0, 0)),
                Collective::Scatter if root => Some((me * len, 0)),
                Collective::AllGather => Some((0, me * len)),
                Collective::Gather if root => Some((0, me * len)),
                Collective::AllToAll => Some((me * len, me * len)),
                _ => None,
            };
            if let Some((from, to)) = own {
                // SAFETY: the input holds `from + len` bytes and the output `to + len`
                // (`Blocks::of`), which do not overlap out of place (the raw API's contract).
                unsafe { std::ptr::copy_nonoverlapping(b.src.add(from), b.dst.add(to), len) };
            }
        }
        match plan.collective {
            Collective::Broadcast | Collective::Scatter if me != plan.root => {
                // The root's data, or our block of the root's publication.
                let at = if per_peer { me * len } else { 0 };
                let p = self.published_by(&mut w, plan.root, turn)?;
                self.accept(&mut w, plan.root, turn, &p, call)?;
                self.prefetch_next(plan.root, turn);
                // SAFETY: the root's slot holds `len` bytes (a scatter's: `n` blocks of them),
                // left alone until this rank publishes the next turn; our output holds `len`
                // bytes only we touch.
                let (theirs, out) = unsafe {
                    (
                        Shared::new(p.data.add(at), len),
                        std::slice::from_raw_parts_mut(b.dst, len),
                    )
                };
                theirs.copy_to(out);
            }
            Collective::Broadcast | Collective::Scatter => {}
            Collective::Reduce | Collective::Gather if me != plan.root => {}
            // Not ahead: a reduce's root gained nothing from it and in place lost up to 9% at
            // 1 KiB (it reads peers that usually have not written their next turn yet).
            Collective::Reduce => self.read_all(&mut w, (turn, false), call, mine, |r, data| {
                self.fold_at_root(plan, &b, (0, len), staged_own, r, data)
            })?,
            Collective::AllGather | Collective::Gather | Collective::AllToAll => {
                // Our block of each peer's publication: its only one (all-gather, a gather's
                // root), or the one at our place (all-to-all).
                let at = if per_peer { me * len } else { 0 };
                self.read_all(&mut w, (turn, true), call, mine, |r, data| {
                    if r != me {
                        // SAFETY: `data` is `r`'s area memory holding its publication (`len`
                        // bytes, or `n` blocks of them), left alone until this rank publishes
                        // the next turn; our output holds every block, and block `r` only we
                        // touch (in place, an all-to-all's own blocks were published above).
                        let (theirs, out) = unsafe {
                            (
                                Shared::new(data.add(at), len),
                                std::slice::from_raw_parts_mut(b.dst.add(r * len), len),
                            )
                        };
                        theirs.copy_to(out);
                    }
                    Ok(())
                })?
            }
            Collective::ReduceScatter => {
                // Our block of every peer's publication folded into ours, ours first and then
                // the peers' in rank order, as the general path folds (`scatter_piece`).
                let (at, combiner) = (me * len, plan.op.combiner());
                // Out of place, the first peer's fold writes our output (an area has two ranks
                // at least: `AreaSet::group`).
                debug_assert!(n > 1);
                let mut first = !b.in_place;
                self.read_all(&mut w, (turn, true), call, mine, |r, data| {
                    if r == me {
                        return Ok(());
                    }
                    // SAFETY: our output holds our block, which only we touch (in place, the
                    // input's block `me`, never published); `data` is `r`'s area memory holding
                    // `n` blocks of `len` bytes, left alone until we publish the next turn.
                    let (out, theirs) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(b.dst, len),
                            Shared::new(data.add(at), len),
                        )
                    };
                    if std::mem::take(&mut first) {
                        // SAFETY: out of place, our input's block `me` is readable and disjoint
                        // from the output.
                        let own = unsafe { std::slice::from_raw_parts(b.src.add(at), len) };
                        cpu::reduce_into_shared(out, own, theirs, plan.dtype, combiner)
                    } else {
                        cpu::reduce_shared(out, theirs, plan.dtype, combiner)
                    }
                })?
            }
            _ => self.read_all(&mut w, (turn, true), call, mine, |r, data| {
                self.fold_one_shot(plan, (b.src, b.dst), b.in_place, r, data)
            })?,
        }
        self.look_for_failures(&mut w, turn)?;
        let folded = match plan.collective {
            Collective::Reduce => me == plan.root,
            Collective::AllReduce | Collective::ReduceScatter => true,
            _ => false,
        };
        if folded && plan.op == ReduceOp::Avg && n > 1 {
            // SAFETY: our output holds `len` writable bytes, which only this rank touches.
            let out = unsafe { std::slice::from_raw_parts_mut(b.dst, len) };
            cpu::divide_bytes(out, plan.dtype, n)?;
        }
        Ok(())
    }
}
