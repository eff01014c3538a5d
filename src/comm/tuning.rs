//! Where the tuner's costs come from: handed out by rank 0 at creation (its cached calibration,
//! its cached probe, or the defaults), measured on demand by [`Communicator::calibrate`] or
//! probed at creation where nothing is cached ([`Calibration::probe`]: the defaults carried to
//! this machine by a few measured sizes), and cached on disk per host, rank count and library
//! version.
//!
//! Every rank must price calls alike or ranks would take different routes, so only rank 0
//! reads or writes the cache and the others take its table: through the store at creation,
//! by broadcast after a calibration.

use std::path::{Path, PathBuf};
use std::time::Instant;

use oxccl_transport_shm::area::AREA_BYTES;

use super::Communicator;
use crate::algo::{Algorithm, Choice, Collective, Plan};
use crate::bootstrap::{PrefixStore, Store};
use crate::config::{Config, Tune};
use crate::error::{Error, Result};
use crate::tune::cost::{AREA_COLLECTIVES, MAX_TEXT_BYTES, RESCALE_BOUND};
use crate::tune::{self, Costs, Decision, Key, LinkCost, LinkKind, Route, Way};
use crate::types::{DataType, Rank};

/// The store key rank 0 answers under at creation.
const KEY: &str = "tune";

/// The transfer that times links inside a host streaming from memory: twice the 32 MiB
/// last-level cache of the reference machine (larger caches make it read partly from them, and
/// then large calls do too).
const STREAM_BYTES: usize = 64 << 20;

/// What a calibration measures.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Calibration {
    /// Sizes per rank, in bytes, at which every way is timed (increasing). A size whose
    /// buffers would pass [`Calibration::max_buffer`] on a rank is left out for that
    /// collective.
    pub sizes: Vec<usize>,
    /// The most bytes one rank's buffer may hold (all-gather's output is `ranks × size`).
    pub max_buffer: usize,
    /// Bytes each way moves per size, at most: the iteration count is this over the size,
    /// from 3 to 100.
    pub budget: usize,
    /// Passes over the grid, each point keeping its fastest; `None`: [`PASSES`], and
    /// [`LARGE_PASSES`] for the largest points (see [`pass_plan`]). Set for a probe
    /// ([`Calibration::probe`]), which carries the defaults to this machine instead of replacing
    /// them.
    passes: Option<usize>,
    /// Whether this is [`Calibration::probe`].
    probe: bool,
}

/// The processor time per message the calibration prices with once, to learn how the
/// simulated schedules grow with it (they grow in proportion, for 8-byte messages).
const UNIT_OVERHEAD: f64 = 1e-6;

/// The scale of α (at least 1) and the processor time per message (at least 0) that make the
/// simulated 8-byte ring, and where timed the direct all-reduce, take what they were measured
/// to take. Each is given as ((simulated time as measured, its growth per second of overhead),
/// measured time), its simulated time growing in proportion to α's scale.
fn fit_alpha_and_overhead(
    ((r1, ro), lr): ((f64, f64), f64),
    direct: Option<((f64, f64), f64)>,
) -> (f64, f64) {
    let scale = lr / r1;
    let alpha_only = (
        if scale.is_finite() {
            scale.clamp(1.0, 1000.0)
        } else {
            1.0
        },
        0.0,
    );
    let Some(((d1, dox), ld)) = direct else {
        return alpha_only;
    };
    // f·r1 + o·ro = lr and f·d1 + o·dox = ld.
    let det = r1 * dox - ro * d1;
    if det.is_nan() || det.abs() <= 1e-12 * r1 * dox.max(ro) {
        return alpha_only;
    }
    let f = (lr * dox - ro * ld) / det;
    let o = (r1 * ld - d1 * lr) / det;
    if !(f.is_finite() && o.is_finite()) || o <= 0.0 {
        return alpha_only;
    }
    if f < 1.0 {
        // α as measured; the overhead that makes the direct all-reduce what it took.
        let o = ((ld - d1) / dox).max(0.0);
        return (1.0, if o.is_finite() { o.min(1e-3) } else { 0.0 });
    }
    (f.min(1000.0), o.min(1e-3))
}

/// Batches a calibration times each measurement in (see `Communicator::time`).
const BATCHES: usize = 5;

/// A way's measured points: (bytes, seconds per call), ascending by size.
type Curve = Vec<(usize, f64)>;

/// Passes a calibration makes over its grid, each point keeping its fastest (see
/// `Communicator::measure`).
const PASSES: usize = 3;

/// Passes over the largest points: those of fewer than 6 calls, each of which lasts a few
/// milliseconds, so that more passes cost little. Timed 2 calls in each of 3 passes, the
/// in-place two-shot all-reduce of 16 and 64 MiB came out 4.4 and 19.0 ms in two calibrations
/// out of three, where it takes 2.3-2.9 and 9.4-12 ms, and those calibrations sent it the
/// direct way, 1.8 times slower there (2026-11-28): the slow state had lasted through the 3
/// passes at that size.
const LARGE_PASSES: usize = 5;
const _: () = assert!(LARGE_PASSES > PASSES);

/// Passes a probe makes over its grid ([`Calibration::probe`]).
const PROBE_PASSES: usize = 2;

/// Probes a host's cached probe is made of before communicators take it as it is: until then
/// each new communicator (of a new process: see [`PROBES`]) probes again, and rank 0 keeps
/// each point's fastest of the probes ([`Costs::fastest_of`]). One probe lasts about a second,
/// and a machine can be in a slow state for seconds (see `fastest_of`).
pub const PROBE_ROUNDS: usize = 3;

/// How a point worth `calls` calls of the budget (at least 3, at most 100 in all) is timed:
/// (passes, calls in each). A third of them in each of [`PASSES`] passes, at least 2; the
/// largest points (fewer than 6 calls) one call in each of [`LARGE_PASSES`] passes, after the
/// warm-up call each measurement makes.
fn pass_plan(calls: usize) -> (usize, usize) {
    let calls = calls.clamp(3, 100);
    if calls < 6 {
        (LARGE_PASSES, 1)
    } else {
        (PASSES, calls.div_ceil(PASSES))
    }
}

/// Records time `t` of `bytes` in `points` (ascending by size, one entry per size), keeping
/// the fastest of the passes.
fn keep_fastest(points: &mut Curve, bytes: usize, t: f64) {
    match points.iter_mut().find(|(b, _)| *b == bytes) {
        Some((_, best)) => *best = best.min(t),
        None => points.push((bytes, t)),
    }
}

impl Default for Calibration {
    /// 8 B, 1 KiB, and 4 KiB to 64 MiB by factors of 2, at most 64 MiB per buffer: about
    /// nine seconds on 2 ranks. Times are not linear in size where the data leaves a cache
    /// or a way's fixed costs stop mattering, and the line through two points a factor of 4
    /// apart missed by up to 15%: between 4 and 16 MiB it missed that the direct all-gather of
    /// 8 MiB per rank (1.7 ms) beat the staged one (2.1 ms); between 16 and 64 KiB it priced
    /// the 2-rank all-to-all of 32 KiB per rank in place the direct way (there: an exchange of
    /// addresses, then staged) at 8.2 µs where it took 7.2–7.7, and sent both placements
    /// staged, 7.9 µs out of place where the direct way took 4.5 (2026-11-27).
    fn default() -> Self {
        let mut sizes = vec![8, 1 << 10];
        sizes.extend((12..=26).map(|k| 1usize << k));
        Calibration {
            sizes,
            max_buffer: 64 << 20,
            budget: 32 << 20,
            passes: None,
            probe: false,
        }
    }
}

impl Calibration {
    /// The default grid cut at `max_buffer` bytes per buffer (a short calibration for tests).
    pub fn up_to(max_buffer: usize) -> Calibration {
        let mut c = Calibration::default();
        c.sizes.retain(|&s| s <= max_buffer);
        c.max_buffer = max_buffer;
        c
    }

    /// The probe a communicator makes at creation where nothing is cached
    /// ([`Tune::Cache`], [`Tune::Probe`]): every way at 8 B, from 4 KiB to 1 MiB by factors
    /// of 2, and at 4 and 16 MiB, [`PROBE_PASSES`] passes, at most 32 MiB per buffer and 2 MiB
    /// moved per way and size (the largest points one call a pass). The defaults' curves are
    /// then carried to this machine by the ratio of what it measured to what they say
    /// ([`Costs::rescaled`]); the links are timed at 8 B and 4 MiB as in a calibration, their
    /// streaming rate the defaults' in the proportion of the 4 MiB rates (a 64 MiB transfer
    /// would take longer than the rest of the probe). Without the links the measured ways
    /// would be priced against the defaults' links, which a slower machine makes look cheap
    /// (on a 2-core Xeon VM, 2026-12-02, such a probe sent the 8 MiB reduce over the ring,
    /// 1.58 ms against 0.88 through the area). A probe run by
    /// [`Communicator::calibrate_with`] is joined with the probe cached for the host and rank
    /// count, as at creation (see [`PROBE_ROUNDS`]).
    pub fn probe() -> Calibration {
        let mut sizes = vec![8];
        sizes.extend((12..=20).map(|k| 1usize << k));
        sizes.extend([4 << 20, 16 << 20]);
        Calibration {
            sizes,
            max_buffer: 32 << 20,
            budget: 2 << 20,
            passes: Some(PROBE_PASSES),
            probe: true,
        }
    }

    /// Whether this is a probe ([`Calibration::probe`]).
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// (passes, calls in each) for a point worth `calls` calls of the budget.
    fn plan(&self, calls: usize) -> (usize, usize) {
        match self.passes {
            None => pass_plan(calls),
            Some(p) => {
                let (p, calls) = (p.max(1), calls.clamp(3, 100));
                // The largest points one call a pass, as in a calibration.
                (p, if calls < 6 { 1 } else { calls.div_ceil(p) })
            }
        }
    }
}

impl Communicator {
    /// The costs the tuner prices the ways through the shared group area and the links with
    /// (the same on every rank): rank 0's cached calibration or probe, one just made, or the
    /// defaults ([`Tune`]).
    pub fn costs(&self) -> Costs {
        self.inner.lock().costs.clone()
    }

    /// Every route the tuner prices for `plan` here — the ways through the group area (in
    /// the plan's placement) and the schedules over the links — with its estimated time in
    /// seconds (`None`: not measured or not priced); empty when `OXCCL_ALGO` forces the
    /// algorithm. [`Communicator::explain`] says which one is taken.
    pub fn candidates(&self, plan: &Plan) -> Vec<(Route, Option<f64>)> {
        let mut st = self.inner.lock();
        self.inner.price(&mut st, plan)
    }

    /// Measures every way through the shared group area on this machine — each collective that
    /// has them, both placements, the default [`Calibration`]'s sizes — and the links the
    /// schedules run over (a ping-pong between two ranks of one host and between rank 0 and a
    /// rank of another host, each giving its kind of link α and β) and the reduction rate γ,
    /// and makes the result the tuner's costs on every rank (rank 0's measurements, handed out
    /// by broadcast); rank 0 also writes them to the cache file ([`Config::tune_file`]), where
    /// later communicators of this host and rank count find them. Collective: every rank calls
    /// it, with no other call in flight. A communicator without the area keeps its costs for
    /// the area's ways.
    pub fn calibrate(&self) -> Result<Costs> {
        self.calibrate_with(&Calibration::default())
    }

    /// [`Communicator::calibrate`] over the sizes of `calibration`.
    pub fn calibrate_with(&self, calibration: &Calibration) -> Result<Costs> {
        let probe = calibration.is_probe();
        let mut measured = if self.inner.means.area {
            let measured = self.measure(calibration)?;
            if probe {
                Costs::defaults().rescaled(&measured)
            } else {
                measured
            }
        } else {
            let kept = self.costs();
            let source = format!(
                "links calibrated on {}, {} ranks, oxccl {} (area ways: {})",
                self.inner.topo.hosts[0],
                self.size(),
                env!("CARGO_PKG_VERSION"),
                kept.source()
            );
            // A calibration's table, not a probe's, whatever the kept one was.
            kept.with_source(&source)
                .with_ranks(self.size())
                .with_probes(0)
        };
        for (kind, mut cost) in self.measure_links(!probe)? {
            // A probe times no streaming transfer (64 MiB): the table's streaming rate, in
            // the proportion this machine's in-cache rate (4 MiB) bears to the table's, held
            // within RESCALE_BOUND as the area's curves are.
            if let (true, Some(d)) = (probe, measured.link(kind))
                && let Some((bytes, beta)) = d.stream
                && d.beta > 0.0
            {
                let ratio = (cost.beta / d.beta).clamp(1.0 / RESCALE_BOUND, RESCALE_BOUND);
                cost.stream = Some((bytes, beta * ratio));
            }
            measured = measured.with_link(kind, cost);
        }
        if self.rank() == 0 {
            measured = measured.with_gamma(measure_gamma());
        }
        // A hop costs more when every rank is busy (ranks sharing cores wait to be scheduled)
        // than in a ping-pong between two, and a rank that has no core of its own pays for
        // every message it sends or receives, one after another. So α is scaled and a
        // processor time per message fitted such that the simulated 8-byte ring and direct
        // all-reduces (the ring: 2(n − 1) hops of one message each; direct: one hop of n − 1
        // messages a rank) take what they take here with every rank at work.
        let plan = Plan::new(Collective::AllReduce, 2, DataType::F32);
        let slice = self.inner.means.slice_bytes;
        let ring = Choice::new(Algorithm::Ring).slice_bytes(slice);
        let direct = Choice::new(Algorithm::Direct).slice_bytes(slice);
        let mut words = [0u64; 2];
        let (a, b) = words.split_at_mut(1);
        let (loaded_ring, loaded_direct) = if self.size() > 1 {
            let r = self.time(&plan, Route::Schedule(ring), 50, (a, b))?;
            let d = if self.size() > 2 {
                Some(self.time(&plan, Route::Schedule(direct), 50, (a, b))?)
            } else {
                None
            };
            (r, d)
        } else {
            (0.0, None)
        };
        if self.rank() == 0 {
            let sim = |choice: Choice, costs: &Costs| {
                tune::simulate(&plan, choice, &self.inner.means, costs, &self.inner.hosts)
                    .filter(|&t| t > 0.0)
            };
            let with_unit = measured.clone().with_overhead(UNIT_OVERHEAD);
            let fitted = match (sim(ring, &measured), sim(ring, &with_unit)) {
                (Some(r1), Some(r2)) => {
                    let ring_fit = ((r1, (r2 - r1) / UNIT_OVERHEAD), loaded_ring);
                    let direct_fit = loaded_direct.and_then(|loaded| {
                        let d1 = sim(direct, &measured)?;
                        let d2 = sim(direct, &with_unit)?;
                        Some(((d1, (d2 - d1) / UNIT_OVERHEAD), loaded))
                    });
                    Some(fit_alpha_and_overhead(ring_fit, direct_fit))
                }
                _ => None,
            };
            if let Some((factor, overhead)) = fitted {
                let mut source = measured.source().to_owned();
                if factor > 1.0 {
                    source += &format!(
                        "; link α × {factor:.2} (8-byte ring: {:.2} µs with every rank at work)",
                        loaded_ring * 1e6
                    );
                    measured = measured.scale_alpha(factor);
                }
                if overhead > 0.0 {
                    source += &format!(
                        "; {:.2} µs per message (8-byte direct: {:.2} µs)",
                        overhead * 1e6,
                        loaded_direct.unwrap_or(0.0) * 1e6
                    );
                    measured = measured.with_overhead(overhead);
                }
                measured = measured.with_source(&source);
            }
        }
        if probe && self.inner.means.area && self.rank() == 0 {
            measured = self.with_earlier_probes(measured);
        }
        // Everyone takes rank 0's table: its length, then its text.
        let mut text = if self.rank() == 0 {
            measured.to_text().into_bytes()
        } else {
            Vec::new()
        };
        let mut len = [text.len() as u64];
        self.broadcast_in_place(&mut len, 0)?;
        let len = usize::try_from(len[0])
            .ok()
            .filter(|&l| l <= MAX_TEXT_BYTES)
            .ok_or_else(|| self.bad_table("a cost table longer than allowed"))?;
        text.resize(len, 0);
        self.broadcast_in_place(&mut text, 0)?;
        let costs = std::str::from_utf8(&text)
            .map_err(|_| self.bad_table("a cost table that is not text"))
            .and_then(|t| Costs::parse(t).map_err(|e| self.bad_table(&e)))?;
        let host = &self.inner.topo.hosts[0];
        // A probe without the area measured nothing of it: nothing to keep.
        let path = match (probe, self.inner.means.area) {
            (false, _) => cache_path(&self.inner.config, host, self.size()),
            (true, true) => {
                if self.rank() == 0 {
                    remember_probe(host, self.size(), &costs);
                }
                probe_path(&self.inner.config, host, self.size())
            }
            (true, false) => None,
        };
        if self.rank() == 0
            && let Some(path) = path
        {
            match save(&path, &text) {
                Ok(()) => tracing::info!(rank = 0, "tuner costs cached in {}", path.display()),
                Err(e) => tracing::warn!(
                    rank = 0,
                    "could not cache the tuner's costs in {}: {e}",
                    path.display()
                ),
            }
        }
        let mut st = self.inner.lock();
        st.costs = costs.clone();
        st.logged.clear();
        st.decided = std::array::from_fn(|_| None);
        st.prices.clear();
        Ok(costs)
    }

    /// Rank 0's probe just made, joined with the probe cached for this host and rank count
    /// (each point the faster of the two, [`Costs::fastest_of`]); the probe alone, counted as
    /// one, where nothing is cached or `OXCCL_TUNE=probe` asked for a probe over a cached one
    /// already made of [`PROBE_ROUNDS`] (the count starts over). Under `cache` the cached one
    /// is joined whatever its count is now: another process may have finished it since rank 0
    /// read it at creation.
    fn with_earlier_probes(&self, probed: Costs) -> Costs {
        let probed = probed.with_probes(1);
        let host = &self.inner.topo.hosts[0];
        let Some(path) = probe_path(&self.inner.config, host, self.size()) else {
            return probed;
        };
        match load(&path, self.size()) {
            Ok(earlier)
                if !(self.inner.config.tune == Tune::Probe
                    && earlier.probes().max(1) >= PROBE_ROUNDS) =>
            {
                let joined = probed.fastest_of(&earlier);
                let source = format!(
                    "{}; each point the fastest of {} probes",
                    joined.source(),
                    joined.probes()
                );
                joined.with_source(&source)
            }
            _ => probed,
        }
    }

    /// Times the links (α from 8-byte messages, β from 4 MiB ones, which stay in the caches): a
    /// ping-pong between the first two ranks of the first host that has two (the links inside a
    /// host; these also time a 64 MiB transfer, which streams from memory as large calls do) and
    /// between rank 0 and the first rank of the next host (the links between hosts, whose
    /// network is slower than memory); the 64 MiB transfer only with `stream`. Rank 0's answer: each measured kind with its model (the
    /// pairs' first ranks send theirs to rank 0); the other ranks' is empty.
    fn measure_links(&self, stream: bool) -> Result<Vec<(LinkKind, LinkCost)>> {
        let hosts = &self.inner.hosts;
        let mut pairs = Vec::new();
        if let Some(h) = (0..hosts.count()).find(|&h| hosts.members(h).len() >= 2) {
            pairs.push((hosts.members(h)[0], hosts.members(h)[1], true));
        }
        if hosts.count() >= 2 {
            pairs.push((0, hosts.members(1)[0], false));
        }
        let me = self.rank();
        let mut out = Vec::new();
        for (a, b, inside) in pairs {
            if me == a || me == b {
                let peer = if me == a { b } else { a };
                let t = |bytes: usize, iters: usize| self.ping_pong(me == a, peer, bytes, iters);
                let (small, near) = (8, LinkCost::NEAR_BYTES);
                let (t0, t1) = (t(small, 200)?, t(near, 12)?);
                let mut cost = LinkCost::fit((small, t0), (near, t1));
                if inside && stream {
                    cost = cost.with_stream(STREAM_BYTES, t(STREAM_BYTES, 3)?);
                }
                if me == a {
                    let kind = self.inner.link_names[b].and_then(LinkKind::of);
                    let (sb, sbeta) = cost.stream.unwrap_or((0, 0.0));
                    let row = [
                        kind.map_or(-1.0, |k| k as u8 as f64),
                        cost.alpha,
                        cost.beta,
                        sb as f64,
                        sbeta,
                    ];
                    if a == 0 {
                        out.extend(kind.map(|k| (k, cost)));
                    } else {
                        self.send(&row, 0)?;
                    }
                }
            }
            if me == 0 && a != 0 {
                let mut row = [0f64; 5];
                self.recv(&mut row, a)?;
                let kind = LinkKind::ALL
                    .into_iter()
                    .find(|&k| k as u8 as f64 == row[0]);
                out.extend(kind.map(|k| {
                    (
                        k,
                        LinkCost {
                            alpha: row[1],
                            beta: row[2],
                            stream: (row[3] > 0.0).then_some((row[3] as usize, row[4])),
                        },
                    )
                }));
            }
        }
        Ok(out)
    }

    /// The median one-way time of a `bytes` message between this rank and `peer` (half a
    /// round trip), over `iters` round trips after a quarter as many (at least one) to warm
    /// up; `first` sends first.
    fn ping_pong(&self, first: bool, peer: Rank, bytes: usize, iters: usize) -> Result<f64> {
        let mut buf = vec![0u8; bytes];
        let warm = (iters / 4).max(1);
        let mut times = Vec::with_capacity(iters);
        for i in 0..iters + warm {
            let start = Instant::now();
            if first {
                self.send(&buf, peer)?;
                self.recv(&mut buf, peer)?;
            } else {
                self.recv(&mut buf, peer)?;
                self.send(&buf, peer)?;
            }
            if i > 0 {
                times.push(start.elapsed().as_secs_f64() / 2.0);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    fn bad_table(&self, why: &str) -> Error {
        Error::Bootstrap(format!(
            "rank {}: calibrate: rank 0 handed out {why}",
            self.rank()
        ))
    }

    /// Times every way at every size of `c`, in lockstep with the other ranks (the same calls
    /// in the same order everywhere); this rank's measurements.
    fn measure(&self, c: &Calibration) -> Result<Costs> {
        let n = self.size();
        let mut sizes: Vec<usize> = c.sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        let biggest = sizes
            .iter()
            .map(|&s| s.saturating_mul(n))
            .max()
            .unwrap_or(0);
        let words = biggest.min(c.max_buffer).div_ceil(8).max(1);
        // f32 ones: every reduction stays finite.
        let one = u64::from(1.0f32.to_bits()) * 0x1_0000_0001;
        let (mut a, mut b) = (vec![one; words], vec![one; words]);
        // Ranks come out of what they did before at different times, and ranks that share
        // cores stay out of step for a while: on 4 ranks over 2 cores the first measurement (the
        // 8-byte one-shot all-reduce) took 596 µs a call in two calibrations of three, against
        // 7-15 µs measured later. A first round of calls, thrown away, brings them into step.
        let settle = Plan::new(Collective::AllReduce, 2, DataType::F32);
        self.time(&settle, Route::Area(Way::OneShot), 100, (&mut a, &mut b))?;
        // Every way and placement of one collective is timed at one size before the next size,
        // so the ways a route is chosen between see the same moment of the machine. Timed one
        // curve after another, the two placements of a way — which do the same work up to
        // 128 KiB — came out up to 30% apart where something else ran for a moment, and in
        // place took another route than out of place at 4-7 (mean 6) of the 49 points from 8 B
        // to 64 KiB of 4 calibrations (collectives other than all-to-all, whose placements do
        // differ); side by side, at 2-6 (mean 4) in 3 (2 ranks, 2026-11-27).
        //
        // And the grid is timed in [`PASSES`] passes, each point keeping its fastest: this VM's
        // 2 cores swing for seconds at a time between two speeds of moving data from one to the
        // other (`tools/perf/c2c_phases.c`: 15-20 against 60-90 µs rounds), and in the slow
        // one the ways of one size come out alike — 11.7, 12.0 and 12.5 µs for the direct,
        // two-shot and one-shot all-reduce of 32 KiB in place, where in the fast one
        // two-shot takes 4.4 µs and direct 10.5 — so a calibration that met the slow one at
        // a size took a way up to 2.4 times slower than the best there (2026-11-28). A point
        // needs one pass in the fast speed to be priced from it. Five calibrations of each kind,
        // interleaved, on 2 ranks: the five disagreed on the way at 95 of the 192 (collective,
        // placement, size) points up to 2 MiB with one pass, at 16 and 36 with three (two such
        // sets); at 43 of the 70 larger ones with one pass, 14 with three (4.4 against 7.6 s).
        let mut tables: Vec<(Collective, Vec<Key>, Vec<Curve>)> = Vec::new();
        for collective in AREA_COLLECTIVES {
            let mut keys = Vec::new();
            for way in Way::ALL {
                let usable = match way {
                    Way::OneShot | Way::TwoShot => collective == Collective::AllReduce,
                    Way::Staged => collective != Collective::AllReduce,
                    Way::Direct => self.inner.means.direct,
                };
                if usable {
                    keys.extend([false, true].map(|in_place| Key {
                        collective,
                        way,
                        in_place,
                    }));
                }
            }
            let points = vec![Vec::new(); keys.len()];
            tables.push((collective, keys, points));
        }
        let most = c.passes.map_or(PASSES.max(LARGE_PASSES), |p| p.max(1));
        for pass in 0..most {
            for (collective, keys, points) in &mut tables {
                let collective = *collective;
                for &bytes in &sizes {
                    let whole = match collective {
                        Collective::AllGather
                        | Collective::ReduceScatter
                        | Collective::Gather
                        | Collective::Scatter
                        | Collective::AllToAll => bytes.saturating_mul(n),
                        _ => bytes,
                    };
                    if whole > c.max_buffer || bytes % 4 != 0 {
                        continue;
                    }
                    let (passes, iters) = c.plan(c.budget / bytes.max(1));
                    if pass >= passes {
                        continue;
                    }
                    for (key, points) in keys.iter().zip(points.iter_mut()) {
                        if key.way == Way::OneShot && bytes > AREA_BYTES {
                            continue;
                        }
                        let plan =
                            Plan::new(collective, bytes / 4, DataType::F32).in_place(key.in_place);
                        let t = self.time(&plan, Route::Area(key.way), iters, (&mut a, &mut b))?;
                        keep_fastest(points, bytes, t);
                    }
                }
            }
        }
        let curves: Vec<(Key, Curve)> = tables
            .into_iter()
            .flat_map(|(_, keys, points)| keys.into_iter().zip(points))
            .collect();
        let source = if c.is_probe() {
            format!(
                "probed on {}, {n} ranks, oxccl {} (the defaults' area ways scaled to this \
                 machine by each way's times at 8 B-16 MiB; links timed at 8 B and 4 MiB)",
                self.inner.topo.hosts[0],
                env!("CARGO_PKG_VERSION")
            )
        } else {
            format!(
                "calibrated on {}, {n} ranks, oxccl {}",
                self.inner.topo.hosts[0],
                env!("CARGO_PKG_VERSION")
            )
        };
        Ok(Costs::from_points(&source, n, curves))
    }

    /// The time per call of `plan` forced onto `route`, in seconds: `iters` calls, after a
    /// quarter as many (at least one) to warm up, timed in up to [`BATCHES`] batches of calls
    /// back to back; the second fastest batch's time over its calls (of 3, the median). The
    /// median of 5 let a disturbance over 3 batches — half a millisecond at 64 KiB — set a
    /// point: the direct in-place all-reduce of 64 KiB priced 22.5 µs between 6.6 at 32 KiB and
    /// 15.3 at 128 KiB, and in place went two-shot, 15.2 µs a call where out of place took
    /// 8.1. Points that cost more than the next size's by 15% or more: 1-7 in each of 7
    /// calibrations with the median, none in 3 of 4 with the second fastest, 2 in the fourth
    /// (2 ranks, 2026-11-27).
    ///
    /// Ranks that share cores fall out of step between two measurements (one waits asleep while
    /// another finishes): measured at once, a 4-rank 8-byte all-reduce on 2 cores took 200-700
    /// µs against the 6.6 µs it takes in a run. And calls timed one by one each pay for the
    /// slowest rank's wake-up, where calls back to back — as applications and benchmarks make
    /// them — overlap it: timed one by one, that all-reduce took 13.5-15 µs through the area
    /// (6.6 µs in a run), and the tuner sent it over the links (12.6 µs in a run).
    fn time(
        &self,
        plan: &Plan,
        route: Route,
        iters: usize,
        (a, b): (&mut [u64], &mut [u64]),
    ) -> Result<f64> {
        let n = self.size();
        let bytes = plan.count * 4;
        let (whole_in, whole_out) = match plan.collective {
            Collective::AllGather | Collective::Gather => (bytes, bytes * n),
            Collective::ReduceScatter | Collective::Scatter => (bytes * n, bytes),
            Collective::AllToAll => (bytes * n, bytes * n),
            _ => (bytes, bytes),
        };
        let decision = Decision {
            route,
            why: "calibration",
        };
        let warm = (iters / 4).max(1);
        let batch = iters.div_ceil(BATCHES).max(1);
        let mut times = Vec::with_capacity(BATCHES);
        let mut start = Instant::now();
        for i in 0..iters + warm {
            // Placement as the API lays it out: in place, both are the whole buffer.
            let (input, output) = if plan.in_place {
                let len = whole_in.max(whole_out);
                let p = b.as_mut_ptr().cast::<u8>();
                ((p.cast_const(), len), (p, len))
            } else {
                (
                    (a.as_ptr().cast::<u8>(), whole_in),
                    (b.as_mut_ptr().cast::<u8>(), whole_out),
                )
            };
            if i == warm {
                start = Instant::now();
            }
            let st = self.inner.lock();
            self.run_decided(st, *plan, decision.clone(), input, output)?;
            // Timed calls done so far; a batch ends every `batch` of them, and at the last.
            let done = (i + 1).saturating_sub(warm);
            if done > 0 && (done.is_multiple_of(batch) || done == iters) {
                let calls = (done - 1) % batch + 1;
                times.push(start.elapsed().as_secs_f64() / calls as f64);
                start = Instant::now();
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 3])
    }
}

/// Seconds per byte of folding one f32 slice into another (a schedule's reduction step, on
/// slices that stay in cache): the median of a few rounds.
fn measure_gamma() -> f64 {
    let n = Choice::DEFAULT_SLICE_BYTES / 4;
    let (mut dst, src) = (vec![1.0f32; n], vec![1.0f32; n]);
    let mut times = Vec::with_capacity(21);
    for i in 0..=21 {
        let start = Instant::now();
        for _ in 0..4 {
            if crate::reduce::cpu::reduce(&mut dst, &src, crate::types::ReduceOp::Sum).is_err() {
                return 0.0;
            }
            std::hint::black_box(&mut dst);
        }
        if i > 0 {
            times.push(start.elapsed().as_secs_f64() / (4 * n * 4) as f64);
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// What a communicator does about its costs once it is made (rank 0's word at creation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Then {
    /// Nothing: it starts from the table it was handed.
    Keep,
    /// A full calibration ([`Communicator::calibrate`]).
    Calibrate,
    /// A probe ([`Calibration::probe`]), where the ranks share a group area.
    Probe,
}

/// Rank 0's answer at creation, under [`KEY`]: `D` (the defaults), `C` (calibrate now), `P`
/// (probe now) or `T` and a cost table. `host`: the first host's label (what the caches are
/// named after); `area`: whether the ranks share the group area and one host (a probe times
/// its ways; without them there is nothing to probe).
pub(super) fn hand_out(
    store: &PrefixStore,
    config: &Config,
    (host, size): (&str, usize),
    area: bool,
) -> Result<()> {
    let table = |costs: Costs| [b"T".as_slice(), costs.to_text().as_bytes()].concat();
    // Where OXCCL_ALGO forces the algorithm no call takes the area, whose ways a probe times.
    let area = area && config.algorithm.is_none();
    // Where no file is named and nothing is cached: the probe an earlier communicator of this
    // host and rank count made (in this process, else cached), else a probe now.
    let probed = || {
        if let Some(costs) = remembered_probe(host, size) {
            return table(costs);
        }
        match probe_path(config, host, size).map(|p| load(&p, size)) {
            // Fewer probes than PROBE_ROUNDS: probe again, rank 0 joining the two.
            Some(Ok(costs)) if area && costs.probes().max(1) < PROBE_ROUNDS => b"P".to_vec(),
            Some(Ok(costs)) => table(costs),
            _ if area => b"P".to_vec(),
            _ => b"D".to_vec(),
        }
    };
    let answer = match config.tune {
        Tune::Defaults => b"D".to_vec(),
        Tune::Probe if area => b"P".to_vec(),
        Tune::Probe => b"D".to_vec(),
        Tune::Cache | Tune::Calibrate => {
            match cache_path(config, host, size).map(|p| (load(&p, size), p)) {
                Some((Ok(costs), _)) => table(costs),
                Some((Err(why), path)) => {
                    let named = config.tune_file.is_some();
                    let answer = match config.tune {
                        Tune::Calibrate => b"C".to_vec(),
                        // A file the user named is theirs: no probe is written in its place.
                        _ if named => b"D".to_vec(),
                        _ => probed(),
                    };
                    if named || path.exists() {
                        tracing::warn!(
                            rank = 0,
                            "tuner costs from {}: {why}; using {}",
                            path.display(),
                            match answer.first() {
                                Some(b'C') => "a new calibration",
                                Some(b'P') => "a probe of this machine",
                                Some(b'T') => "this host's probe",
                                _ => "the defaults",
                            }
                        );
                    }
                    answer
                }
                None if config.tune == Tune::Calibrate => b"C".to_vec(),
                None => probed(),
            }
        }
    };
    store.set(KEY, &answer)
}

/// Probes rank 0 made in this process, by (host, rank count): a communicator made again, or
/// split or shrunk to a size probed before, takes one of these instead of probing again where
/// there is no cache directory to find it in.
static PROBES: std::sync::Mutex<Vec<(String, usize, Costs)>> = std::sync::Mutex::new(Vec::new());

/// The most probes [`PROBES`] holds (one per rank count a process's communicators have).
const MAX_PROBES: usize = 64;

fn remember_probe(host: &str, size: usize, costs: &Costs) {
    let mut p = PROBES.lock().unwrap_or_else(|e| e.into_inner());
    p.retain(|(h, n, _)| !(h == host && *n == size));
    if p.len() >= MAX_PROBES {
        p.remove(0);
    }
    p.push((host.to_owned(), size, costs.clone()));
}

fn remembered_probe(host: &str, size: usize) -> Option<Costs> {
    let p = PROBES.lock().unwrap_or_else(|e| e.into_inner());
    p.iter()
        .find(|(h, n, _)| h == host && *n == size)
        .map(|(_, _, c)| c.clone())
}

/// What rank 0 handed out: the costs to start with, and what to do once made.
pub(super) fn take(store: &PrefixStore, rank: Rank, deadline: Instant) -> Result<(Costs, Then)> {
    let answer = store.get(KEY, deadline)?;
    let bad = |why: String| Error::Bootstrap(format!("rank {rank}: rank 0's tuner costs: {why}"));
    match answer.split_first() {
        Some((b'D', [])) => Ok((Costs::defaults().clone(), Then::Keep)),
        Some((b'C', [])) => Ok((Costs::defaults().clone(), Then::Calibrate)),
        Some((b'P', [])) => Ok((Costs::defaults().clone(), Then::Probe)),
        Some((b'T', text)) => {
            let text = std::str::from_utf8(text).map_err(|_| bad("not text".into()))?;
            Ok((Costs::parse(text).map_err(bad)?, Then::Keep))
        }
        _ => Err(bad("unreadable".into())),
    }
}

/// After creation: calibrates or probes when rank 0 said so (a probe only where the ranks
/// share the group area, which every rank knows alike).
pub(super) fn finish(comm: Communicator, then: Then) -> Result<Communicator> {
    match then {
        Then::Keep => return Ok(comm),
        Then::Calibrate => {
            comm.calibrate()?;
        }
        Then::Probe if comm.inner.means.area => {
            let start = Instant::now();
            let costs = comm.calibrate_with(&Calibration::probe())?;
            tracing::debug!(
                rank = comm.rank(),
                "probed the group area's ways in {:.2} s: {}",
                start.elapsed().as_secs_f64(),
                costs.source()
            );
        }
        Then::Probe => return Ok(comm),
    }
    // The caller's first call is collective #0, and the flight recorder shows the caller's
    // calls only. Every rank starts over here, after the same calls, and a link delivers in
    // order, so no message of those calls can meet one numbered anew.
    {
        let mut st = comm.inner.lock();
        st.collectives = 0;
        st.groups.fill(0);
        comm.inner.trace.forget();
    }
    Ok(comm)
}

/// Where this host's calibration for `size` ranks is cached: [`Config::tune_file`], else a
/// file named after the host, rank count and version under `$XDG_CACHE_HOME/oxccl` or
/// `~/.cache/oxccl`; `None` when there is no such directory.
pub fn cache_path(config: &Config, host: &str, size: usize) -> Option<PathBuf> {
    if let Some(p) = &config.tune_file {
        return Some(p.clone());
    }
    let dir = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|d| !d.is_empty())
                .map(|h| Path::new(&h).join(".cache"))
        })?;
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    Some(dir.join("oxccl").join(format!(
        "costs-{host}-{size}r-{}.txt",
        env!("CARGO_PKG_VERSION")
    )))
}

/// Where this host's probe for `size` ranks is cached ([`Calibration::probe`]): beside the
/// calibration's file, `costs-HOST-Nr-VERSION-probe.txt`; `None` where [`Config::tune_file`]
/// names a file (the user keeps the costs) or there is no cache directory.
pub fn probe_path(config: &Config, host: &str, size: usize) -> Option<PathBuf> {
    if config.tune_file.is_some() {
        return None;
    }
    let full = cache_path(config, host, size)?;
    let name = full.file_stem()?.to_str()?.to_owned() + "-probe.txt";
    Some(full.with_file_name(name))
}

/// The costs cached at `path` for `size` ranks.
fn load(path: &Path, size: usize) -> std::result::Result<Costs, String> {
    let text = crate::files::read_text(path, MAX_TEXT_BYTES).map_err(|e| e.to_string())?;
    let costs = Costs::parse(&text)?;
    if costs.ranks() != size {
        return Err(format!("measured with {} ranks, not {size}", costs.ranks()));
    }
    Ok(costs)
}

/// Writes `text` to `path` whole or not at all (a temporary file renamed over it).
fn save(path: &Path, text: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Unique among writers: processes by their id, threads of one by a count.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::{
        Calibration, LARGE_PASSES, PASSES, PROBE_PASSES, fit_alpha_and_overhead, keep_fastest,
        pass_plan,
    };

    #[test]
    fn a_probe_times_a_sparse_grid_in_fewer_passes() {
        let p = Calibration::probe();
        assert!(p.is_probe() && !Calibration::default().is_probe());
        let k = |k: u32| 1usize << k;
        let mut grid = vec![8];
        grid.extend((12..=20).map(k));
        grid.extend([k(22), k(24)]);
        assert_eq!(p.sizes, grid);
        // Every probed size is one the full calibration times too.
        assert!(
            p.sizes
                .iter()
                .all(|s| Calibration::default().sizes.contains(s))
        );
        // 8 bytes: the most calls, shared between the passes; 16 MiB (a budget for no call):
        // one call in each pass; a full calibration as before.
        assert_eq!(
            p.plan(p.budget / 8),
            (PROBE_PASSES, 100usize.div_ceil(PROBE_PASSES))
        );
        assert_eq!(p.plan(p.budget / (16 << 20)), (PROBE_PASSES, 1));
        assert_eq!(Calibration::default().plan(0), (LARGE_PASSES, 1));
    }

    #[test]
    fn each_point_is_timed_over_passes_a_share_at_a_time() {
        // An 8-byte point (the budget allows 100 calls, the most): a third in each pass.
        assert_eq!(pass_plan(1 << 22), (PASSES, 34));
        assert_eq!(pass_plan(9), (PASSES, 3));
        assert_eq!(pass_plan(6), (PASSES, 2));
        // The largest points (a budget for fewer than 6 calls, or none): one call in each of
        // more passes, at least as many calls in all as the budget's floor of 3.
        for calls in [5, 3, 1, 0] {
            assert_eq!(pass_plan(calls), (LARGE_PASSES, 1));
        }
    }

    #[test]
    fn each_point_keeps_the_fastest_of_its_passes() {
        let mut points = Vec::new();
        // Pass 1 met the slow speed at 32 KiB, pass 2 at 8 bytes.
        for (bytes, t) in [(8, 0.3e-6), (32768, 12.0e-6)] {
            keep_fastest(&mut points, bytes, t);
        }
        for (bytes, t) in [(8, 0.9e-6), (32768, 4.4e-6)] {
            keep_fastest(&mut points, bytes, t);
        }
        assert_eq!(points, vec![(8, 0.3e-6), (32768, 4.4e-6)]);
    }

    #[test]
    fn the_fit_recovers_the_scale_and_overhead_that_made_the_times() {
        // Simulated as measured: ring 6 µs growing 12 s per second of overhead (12 messages on
        // its critical path), direct 1 µs growing 6; true scale 1.5 and overhead 1.2 µs.
        let (ring, direct) = ((6e-6, 12.0), (1e-6, 6.0));
        let made = |(t, per): (f64, f64), f: f64, o: f64| f * t + o * per;
        let (lr, ld) = (made(ring, 1.5, 1.2e-6), made(direct, 1.5, 1.2e-6));
        let (f, o) = fit_alpha_and_overhead((ring, lr), Some((direct, ld)));
        assert!(
            (f - 1.5).abs() < 1e-9 && (o - 1.2e-6).abs() < 1e-15,
            "{f} {o}"
        );
        // Without a direct time (2 ranks) only α is scaled, as before.
        assert_eq!(fit_alpha_and_overhead((ring, lr), None), (lr / 6e-6, 0.0));
        // Times that need no overhead (direct as fast as α alone makes it) keep it at zero.
        let (f, o) = fit_alpha_and_overhead((ring, 12e-6), Some((direct, 1e-6)));
        assert_eq!((f, o), (2.0, 0.0));
        // A scale below 1 is not taken: α stays as measured and the overhead covers direct.
        let (f, o) = fit_alpha_and_overhead((ring, 6e-6), Some((direct, 4e-6)));
        assert_eq!(f, 1.0);
        assert!((o - 0.5e-6).abs() < 1e-15, "{o}");
        // Nonsense stays bounded.
        let (f, o) = fit_alpha_and_overhead((ring, f64::NAN), Some((direct, 1.0)));
        assert_eq!((f, o), (1.0, 0.0));
        let (f, o) = fit_alpha_and_overhead((ring, 6e-6), Some((direct, 1.0)));
        assert_eq!((f, o), (1.0, 1e-3));
    }
}
