//! The direct all-reduce: ranks reach each other's buffers with `process_vm_readv`/
//! `process_vm_writev`, each reducing its slice and writing the result into every peer's
//! output; and how a rank that gives up makes sure no peer touches its buffers any more.

use std::time::Instant;

use super::waiter::CHECK_EVERY;
use super::{AreaPath, PART_BYTES, Waiter, slicer};
use crate::algo::Plan;
use crate::error::{Error, Result};
use crate::reduce::{cpu, stream};
use crate::types::{Rank, ReduceOp};

/// Direct all-reduces at least this large write their output (out of place: nobody touched it
/// lately) with non-temporal stores.
const STREAM_MIN: usize = 256 * 1024;

impl AreaPath {
    /// The direct all-reduce: see the module's documentation. Returns `Ok(false)` when some
    /// rank did not ask for it (then nobody touched anyone's memory).
    ///
    /// Peers reach this rank's buffers from the moment it publishes their addresses. So once
    /// published, it returns — with a result or an error — only when no peer can touch them
    /// any more: on success, once every rank finished (left its loop); on any error, after
    /// [`AreaPath::stop_touching`].
    pub(super) fn direct_all_reduce(
        &self,
        w: &mut Waiter<'_>,
        turn: u64,
        plan: &Plan,
        input: (*const u8, usize),
        output: (*mut u8, usize),
        want: bool,
    ) -> Result<bool> {
        // A panic between publishing and returning must not hand back memory peers still
        // write: stop touching first, then let it go on.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.direct_inner(w, turn, plan, input, output, want)
        }));
        match r {
            Ok(Ok(direct)) => Ok(direct),
            Ok(Err(e)) => {
                self.stop_touching(w, turn, &e);
                Err(e)
            }
            Err(panic) => {
                let e = Error::InvalidArgument(format!(
                    "rank {}: {}: the direct all-reduce panicked",
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
        input: (*const u8, usize),
        output: (*mut u8, usize),
        want: bool,
    ) -> Result<bool> {
        let (n, me) = (self.area.len(), self.rank);
        let size = plan.dtype.size();
        let bytes = plan.count * size;
        let slice = slicer(plan.count, n, size);
        let part = PART_BYTES / size * size;
        let stream = !std::ptr::eq(input.0, output.0) && bytes >= STREAM_MIN;

        // Publish our buffers' addresses and whether we would go direct.
        let mut addrs = [0u8; 24];
        addrs[..8].copy_from_slice(&(input.0 as u64).to_le_bytes());
        addrs[8..16].copy_from_slice(&(output.0 as u64).to_le_bytes());
        addrs[16..].copy_from_slice(&u64::from(want).to_le_bytes());
        let mut peer_addrs: Vec<(usize, usize)> = Vec::with_capacity(n);
        let mut everyone = true;
        self.exchange(w, turn, (addrs.as_ptr(), addrs.len()), bytes, |_, data| {
            let mut a = [0u8; 24];
            // SAFETY: every publication of this turn carries 24 bytes (the descriptors
            // matched, so every rank took this path).
            unsafe { std::ptr::copy_nonoverlapping(data, a.as_mut_ptr(), 24) };
            let word = |i: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&a[i * 8..i * 8 + 8]);
                u64::from_le_bytes(b) as usize
            };
            peer_addrs.push((word(0), word(1)));
            everyone &= word(2) == 1;
            Ok(())
        })?;
        if !everyone {
            // Nobody touches anyone's memory: every rank saw the same publications.
            return Ok(false);
        }
        // A failed read means the peer died or unmapped memory it promised to keep: either
        // way it failed.
        let opname = w.name.to_string();
        let reach_err = |peer: Rank, e: std::io::Error| Error::PeerFailed {
            rank: me,
            peer,
            op: opname.clone(),
            cause: format!("reaching its memory directly failed: {e}"),
        };

        // From here this rank may touch peers' memory: say so before looking whether anyone
        // gave up (the order that makes `stop_touching` sound).
        self.area.enter(turn);
        // Our slice, part by part: read each peer's input into cache, fold, then write the
        // result to our output and straight into every peer's output. Writing a peer's
        // buffer is safe in place too: only we read that slice of it, and we just did.
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        scratch.resize(2 * PART_BYTES / 8, 0);
        let (tmp, acc) =
            bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..]).split_at_mut(PART_BYTES);
        let (lo, hi) = slice(me);
        let mut at = lo;
        while at < hi {
            // Before touching any peer: has anyone given up, aborted, timed out, failed?
            w.check_running(turn)?;
            let len = part.min(hi - at);
            let (tmp, acc) = (&mut tmp[..len], &mut acc[..len]);
            for (k, q) in (1..n).map(|k| (k, (me + k) % n)) {
                // SAFETY: `tmp` is ours; the kernel checks the peer's range, which the peer
                // keeps valid and unchanged until every rank finishes this turn or stops
                // touching it (`stop_touching`), and no rank gave up when we last looked.
                unsafe {
                    self.area
                        .read_from(q, peer_addrs[q].0 + at, tmp.as_mut_ptr(), len)
                }
                .map_err(|e| reach_err(q, e))?;
                if k == 1 {
                    // SAFETY: `input` holds `bytes` bytes.
                    let mine = unsafe { std::slice::from_raw_parts(input.0.add(at), len) };
                    cpu::reduce_into_bytes(acc, mine, tmp, plan.dtype, plan.op.combiner())?;
                } else {
                    cpu::reduce_bytes(acc, tmp, plan.dtype, plan.op.combiner())?;
                }
            }
            if plan.op == ReduceOp::Avg {
                cpu::divide_bytes(acc, plan.dtype, n)?;
            }
            // SAFETY: `output` holds `bytes` bytes; `input` is either the same memory, whose
            // range we are done reading, or disjoint from it.
            let out = unsafe { std::slice::from_raw_parts_mut(output.0.add(at), len) };
            if stream {
                stream::copy_streaming(out, acc);
            } else {
                // In place, these lines were just read: they are in cache.
                out.copy_from_slice(acc);
            }
            for q in (1..n).map(|k| (me + k) % n) {
                // SAFETY: `acc` is ours; the peer keeps its output valid until every rank
                // finishes this turn or stops touching it, and does not touch this range of
                // it meanwhile.
                unsafe {
                    self.area
                        .write_to(q, peer_addrs[q].1 + at, acc.as_ptr(), len)
                }
                .map_err(|e| reach_err(q, e))?;
            }
            at += len;
        }
        drop(scratch);

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

    /// After an error in a direct all-reduce whose addresses this rank published: tells every
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
        w.engine.fail_outside(e);
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
