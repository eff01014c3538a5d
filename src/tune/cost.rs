//! The tuner's costs: how long each way through the shared group area takes, per collective
//! and placement, as a function of the message size — measured on the machine the job runs on
//! ([`crate::Communicator::calibrate`]), the defaults carried to it by a probe of a few sizes
//! ([`Costs::rescaled`], [`crate::Calibration::probe`]), or the defaults measured on the
//! reference machine (`defaults.txt` beside this file, written by the same calibration).
//!
//! Each way's cost is a piecewise α-β model: the calibration times the way at a grid of sizes,
//! and between two measured sizes `b₀ < b₁` a call of `b` bytes is priced `α + β·b`, the line
//! through both points (so the latency α and the time per byte β change where caches stop
//! holding the data). Below the smallest size the smallest size's time is used; beyond the
//! largest, the last segment's β carries on.
//!
//! Costs are plain data with a line-based text form (what the cache file and the defaults
//! hold):
//!
//! ```text
//! oxccl-costs 1
//! source calibrated on host-1a2b, 2 ranks, oxccl 0.1.0
//! ranks 2
//! all_reduce two-shot out-of-place 8=1.1e-6 1024=1.3e-6 ...
//! ```
//!
//! Schedules over the links are priced by simulating them ([`crate::algo::sim`]) under a plain
//! α-β model per kind of link (shared-memory rings between ranks of one host, TCP) and a
//! reduction rate γ, measured by the same calibration (a ping-pong between rank 0 and one peer
//! of each kind, and rank 0 folding a buffer):
//!
//! ```text
//! link shm alpha=1.1e-6 beta=2.0e-10
//! link tcp alpha=9.0e-6 beta=4.5e-10
//! fold gamma=1.5e-10
//! message overhead=1.4e-6
//! ```
//!
//! The last is the processor time a rank spends on each message it sends or receives, one
//! message after another (LogP's o); the calibration fits it, with the scale of α, to a ring and
//! a direct all-reduce timed with every rank at work, and it is large only where ranks share
//! cores.
//!
//! A probe's table also says how many probes it is the fastest of (`probes 2`; see
//! [`Costs::fastest_of`]).
//!
//! Parsing is strict and bounded (sizes, lines and points are capped), so a damaged or hostile
//! file is rejected with a reason instead of steering the tuner.

use std::fmt::Write as _;
use std::sync::OnceLock;

use crate::algo::Collective;

use super::Way;

/// The first line of the text form.
pub const FORMAT: &str = "oxccl-costs 1";
/// The largest text form accepted, in bytes.
pub const MAX_TEXT_BYTES: usize = 64 << 10;
/// The most measured sizes per curve.
const MAX_POINTS: usize = 64;
/// The longest time a point may state, in seconds (anything longer is not a measurement of
/// one collective call).
const MAX_SECONDS: f64 = 1e4;
/// The most probes a table may say it is made of.
const MAX_PROBES: usize = 1000;

/// The collectives that have ways through the group area, in [`Costs`]' index order.
pub const AREA_COLLECTIVES: [Collective; 8] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::Gather,
    Collective::Scatter,
    Collective::AllToAll,
];
/// Every way, in [`Costs`]' index order.
const WAYS: [Way; 4] = Way::ALL;

/// One priced thing: a way of a collective in a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The collective.
    pub collective: Collective,
    /// The way through the area.
    pub way: Way,
    /// In place (the output buffer is the input).
    pub in_place: bool,
}

impl Key {
    /// Index into [`Costs`]' table; `None` for a collective without area ways.
    fn index(self) -> Option<usize> {
        let c = AREA_COLLECTIVES
            .iter()
            .position(|&c| c == self.collective)?;
        let w = WAYS.iter().position(|&w| w == self.way)?;
        Some((c * WAYS.len() + w) * 2 + usize::from(self.in_place))
    }

    fn placement(in_place: bool) -> &'static str {
        if in_place { "in-place" } else { "out-of-place" }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.collective,
            self.way.name(),
            Key::placement(self.in_place)
        )
    }
}

const SLOTS: usize = AREA_COLLECTIVES.len() * WAYS.len() * 2;

/// A kind of link between two ranks, as the tuner prices it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LinkKind {
    /// Shared-memory rings between ranks of one host.
    Shm,
    /// TCP.
    Tcp,
    /// RDMA verbs (InfiniBand, RoCE). No default: priced once a calibration on the machine
    /// measured it.
    Rdma,
}

impl LinkKind {
    /// Every kind, in [`Costs`]' index order.
    pub const ALL: [LinkKind; 3] = [LinkKind::Shm, LinkKind::Tcp, LinkKind::Rdma];

    /// Its name: the transport's.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Shm => "shm",
            LinkKind::Tcp => "tcp",
            LinkKind::Rdma => "rdma",
        }
    }

    /// The kind of a link named `name` by its transport (`None`: not priced).
    pub fn of(name: &str) -> Option<LinkKind> {
        LinkKind::ALL.into_iter().find(|k| k.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A link's α-β model: a message of `b` bytes takes `alpha + b·beta` seconds from the start of
/// its send to its arrival. β is measured on transfers that stay in the caches
/// ([`LinkCost::NEAR_BYTES`]); where a call's buffers are larger the bytes stream from memory,
/// which can be several times slower, and `stream` holds β measured there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per message.
    pub alpha: f64,
    /// Seconds per byte, for calls of up to [`LinkCost::NEAR_BYTES`].
    pub beta: f64,
    /// Seconds per byte for calls of this many bytes and more, if measured: (bytes, β).
    /// Between `NEAR_BYTES` and these bytes β moves from `beta` to it in proportion to the
    /// logarithm of the size.
    pub stream: Option<(usize, f64)>,
}

impl LinkCost {
    /// The transfer size `beta` is measured at: one that the caches hold.
    pub const NEAR_BYTES: usize = 4 << 20;

    /// The line through two one-way times: `t0` for `b0` bytes and `t1` for `b1 > b0`; β is
    /// never below zero.
    pub fn fit((b0, t0): (usize, f64), (b1, t1): (usize, f64)) -> LinkCost {
        let beta = if b1 > b0 {
            ((t1 - t0) / (b1 - b0) as f64).max(0.0)
        } else {
            0.0
        };
        LinkCost {
            alpha: (t0 - beta * b0 as f64).max(0.0),
            beta,
            stream: None,
        }
    }

    /// This model with β for calls of `bytes` (more than [`LinkCost::NEAR_BYTES`]) measured
    /// as the time of a `bytes` transfer less α.
    pub fn with_stream(self, bytes: usize, seconds: f64) -> LinkCost {
        let stream = (bytes > Self::NEAR_BYTES)
            .then(|| (bytes, ((seconds - self.alpha) / bytes as f64).max(0.0)));
        LinkCost { stream, ..self }
    }

    /// Seconds per byte for a call whose buffers hold `bytes`.
    pub fn beta_for(&self, bytes: usize) -> f64 {
        let Some((far, beta_far)) = self.stream.filter(|&(far, _)| far > Self::NEAR_BYTES) else {
            return self.beta;
        };
        if bytes <= Self::NEAR_BYTES {
            return self.beta;
        }
        let near = (Self::NEAR_BYTES as f64).log2();
        let t = (((bytes as f64).log2() - near) / ((far as f64).log2() - near)).min(1.0);
        self.beta + t * (beta_far - self.beta)
    }

    fn valid(&self) -> bool {
        [self.alpha, self.beta]
            .into_iter()
            .chain(self.stream.map(|(_, b)| b))
            .all(|v| v.is_finite() && (0.0..=MAX_SECONDS).contains(&v))
            && self.stream.is_none_or(|(b, _)| b > Self::NEAR_BYTES)
    }
}

/// Measured times, in seconds, at increasing sizes in bytes (at least one point).
type Curve = Vec<(usize, f64)>;

/// How far a probed point may sit from its curve's level in [`Costs::rescaled`]: a point whose
/// ratio to the table is more than this many times the curve's median ratio, or less than its
/// inverse, counts as this many (one disturbed measurement must not bend a curve further than
/// caches bend it).
pub const RESCALE_BOUND: f64 = 8.0;

/// What the tuner prices area ways with (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    /// Where the numbers come from, for people.
    source: String,
    /// The rank count they were measured with (0: unknown).
    ranks: usize,
    /// How many probes these costs keep the fastest of ([`Costs::fastest_of`]; 0: not a
    /// probe's).
    probes: usize,
    /// Indexed by [`Key::index`].
    curves: [Option<Curve>; SLOTS],
    /// Indexed by [`LinkKind::index`].
    links: [Option<LinkCost>; LinkKind::ALL.len()],
    /// Seconds per byte folded.
    gamma: Option<f64>,
    /// Seconds of a rank's processor per message sent or received.
    overhead: Option<f64>,
}

impl Costs {
    /// Costs from measured curves: for each key, its (bytes, seconds) points. Points are sorted
    /// by size; repeated sizes keep the first; keys without points, negative or non-finite
    /// times are dropped.
    pub fn from_points(
        source: &str,
        ranks: usize,
        points: impl IntoIterator<Item = (Key, Vec<(usize, f64)>)>,
    ) -> Costs {
        let mut curves: [Option<Curve>; SLOTS] = std::array::from_fn(|_| None);
        for (key, mut pts) in points {
            pts.retain(|&(_, t)| t.is_finite() && (0.0..=MAX_SECONDS).contains(&t));
            pts.sort_by_key(|&(b, _)| b);
            pts.dedup_by_key(|&mut (b, _)| b);
            pts.truncate(MAX_POINTS);
            if let (Some(i), false) = (key.index(), pts.is_empty()) {
                curves[i] = Some(pts);
            }
        }
        Costs {
            source: source.replace(['\n', '\r'], " "),
            ranks,
            probes: 0,
            curves,
            links: [None; LinkKind::ALL.len()],
            gamma: None,
            overhead: None,
        }
    }

    /// These costs (a table measured over every size, such as the defaults) carried over to the
    /// machine `probed` was measured on, at a few sizes. Where `probed` has a curve, this
    /// table's time at every size of either is multiplied by the ratio probed / this table:
    /// at a probed size the probed one, held within [`RESCALE_BOUND`] of the curve's median
    /// ratio either way (a point far off the curve's own level is a disturbed measurement,
    /// while the level itself may differ by more than the bound: the defaults were measured
    /// on 2 ranks, and a gather's data grows with the ranks); in between it moves from one
    /// probed size's to the next's in proportion to the logarithm of the size, and beyond the
    /// ends it is the nearest one's. So the curve keeps the shape this table measured between
    /// the probed sizes (where caches stop holding the data, say), at the probed machine's
    /// level. Probed points that are zero or not finite are left out. Curves `probed` lacks
    /// are scaled by the median of the curve medians of their collective, else of every
    /// probed curve, so they stay comparable with the rest (else they are kept); curves only
    /// `probed` has are taken as probed. A curve holds at most the table's limit of sizes:
    /// every probed one, and this table's spread evenly over the rest. Links, folds and the
    /// per-message overhead are this table's; the source, rank count and probe count are
    /// `probed`'s.
    pub fn rescaled(&self, probed: &Costs) -> Costs {
        let mut out = self.clone();
        out.source = probed.source.clone();
        out.ranks = probed.ranks;
        out.probes = probed.probes;
        let per_collective = WAYS.len() * 2;
        // Each probed curve that this table has too: its (log2 size, ratio) points.
        let mut ratios: Vec<Option<Vec<(f64, f64)>>> = vec![None; SLOTS];
        let mut medians: Vec<(usize, f64)> = Vec::new();
        for (slot, (d, p)) in self.curves.iter().zip(&probed.curves).enumerate() {
            let (Some(d), Some(p)) = (d, p) else { continue };
            let mut r: Vec<(f64, f64)> = p
                .iter()
                .map(|&(b, t)| ((b.max(1) as f64).log2(), t / along(d, b)))
                .filter(|&(_, r)| r.is_finite() && r > 0.0)
                .collect();
            let Some(m) = median(r.iter().map(|&(_, r)| r)) else {
                continue;
            };
            for (_, x) in &mut r {
                *x = x.clamp(m / RESCALE_BOUND, m * RESCALE_BOUND);
            }
            ratios[slot] = Some(r);
            medians.push((slot / per_collective, m));
        }
        let everyone = median(medians.iter().map(|&(_, m)| m));
        for (slot, curve) in out.curves.iter_mut().enumerate() {
            let p = probed.curves[slot].as_ref();
            let Some(d) = self.curves[slot].as_ref() else {
                *curve = p.cloned();
                continue;
            };
            let Some(r) = &ratios[slot] else {
                // Not probed (or nothing usable): the level of its collective's probed curves.
                let c = slot / per_collective;
                let level = median(medians.iter().filter(|m| m.0 == c).map(|m| m.1)).or(everyone);
                if let Some(level) = level {
                    *curve = Some(d.iter().map(|&(b, t)| (b, t * level)).collect());
                }
                continue;
            };
            let ratio = |b: usize| {
                let x = (b.max(1) as f64).log2();
                match r.partition_point(|&(xr, _)| xr < x) {
                    0 => r[0].1,
                    i if i == r.len() => r[i - 1].1,
                    i => {
                        let ((x0, r0), (x1, r1)) = (r[i - 1], r[i]);
                        r0 + (r1 - r0) * (x - x0) / (x1 - x0)
                    }
                }
            };
            let mut ours: Vec<usize> = p.into_iter().flatten().map(|&(b, _)| b).collect();
            ours.truncate(MAX_POINTS);
            let theirs: Vec<usize> = d
                .iter()
                .map(|&(b, _)| b)
                .filter(|b| !ours.contains(b))
                .collect();
            let room = MAX_POINTS - ours.len();
            if theirs.len() > room {
                ours.extend((0..room).map(|k| theirs[k * theirs.len() / room]));
            } else {
                ours.extend(theirs);
            }
            ours.sort_unstable();
            *curve = Some(
                ours.into_iter()
                    .map(|b| (b, along(d, b) * ratio(b)))
                    .collect(),
            );
        }
        out
    }

    /// These costs with another source line.
    pub fn with_source(mut self, source: &str) -> Costs {
        self.source = source.replace(['\n', '\r'], " ");
        self
    }

    /// These costs stated for `ranks` ranks (what a cache is checked against).
    pub fn with_ranks(mut self, ranks: usize) -> Costs {
        self.ranks = ranks;
        self
    }

    /// How many probes these costs keep the fastest of (0: not a probe's).
    pub fn probes(&self) -> usize {
        self.probes
    }

    /// These costs stated as the fastest of `probes` probes (at most a thousand).
    pub fn with_probes(mut self, probes: usize) -> Costs {
        self.probes = probes.min(MAX_PROBES);
        self
    }

    /// These costs (a probe's, just made) joined with `earlier` (an earlier probe's of the same
    /// machine and rank count): at every size both curves of a key measured, the faster time;
    /// the links and the per-message overhead together from the one whose links' α (summed
    /// over the kinds, where both measured the same kinds) is the smaller, since a probe fits
    /// α's scale and the overhead to the same timed calls; the fold rate the faster; the rest
    /// (other sizes, the source) these costs'. The probe count is the sum of both (each at
    /// least 1).
    ///
    /// A probe lasts about a second, and a machine can be slow for seconds at a time: the
    /// 2-core VM of 2026-12-02 ran the staged 64 KiB reduce in 3.8-4.2 µs in one state and
    /// 16.6 in the other, and a probe that met only the slow one priced it at 12.6 µs and sent
    /// the call the direct way (11-14 µs either way). Probes at different times, each point
    /// keeping its fastest as a calibration's passes do, price every way at the speed the
    /// machine reaches.
    pub fn fastest_of(mut self, earlier: &Costs) -> Costs {
        for (curve, old) in self.curves.iter_mut().zip(&earlier.curves) {
            let (Some(curve), Some(old)) = (curve.as_mut(), old.as_ref()) else {
                continue;
            };
            for (b, t) in curve.iter_mut() {
                if let Some(&(_, o)) = old.iter().find(|(ob, _)| ob == b) {
                    *t = t.min(o);
                }
            }
        }
        let same_kinds = self
            .links
            .iter()
            .zip(&earlier.links)
            .all(|(a, b)| a.is_some() == b.is_some());
        let alpha = |c: &Costs| c.links.iter().flatten().map(|l| l.alpha).sum::<f64>();
        if same_kinds && alpha(earlier) < alpha(&self) {
            self.links = earlier.links;
            self.overhead = earlier.overhead;
        }
        if let (Some(g), Some(o)) = (self.gamma.as_mut(), earlier.gamma) {
            *g = g.min(o);
        }
        self.probes = (self.probes.max(1) + earlier.probes.max(1)).min(MAX_PROBES);
        self
    }

    /// These costs with `kind`'s link model set (dropped if not finite and non-negative).
    pub fn with_link(mut self, kind: LinkKind, cost: LinkCost) -> Costs {
        self.links[kind.index()] = cost.valid().then_some(cost);
        self
    }

    /// These costs with the reduction rate set, in seconds per byte (dropped if not finite
    /// and non-negative).
    pub fn with_gamma(mut self, gamma: f64) -> Costs {
        self.gamma = (gamma.is_finite() && (0.0..=MAX_SECONDS).contains(&gamma)).then_some(gamma);
        self
    }

    /// These costs with the processor time per message set, in seconds (dropped if not finite
    /// and non-negative).
    pub fn with_overhead(mut self, overhead: f64) -> Costs {
        self.overhead =
            (overhead.is_finite() && (0.0..=MAX_SECONDS).contains(&overhead)).then_some(overhead);
        self
    }

    /// Seconds of a rank's processor per message sent or received, if measured.
    pub fn overhead(&self) -> Option<f64> {
        self.overhead
    }

    /// These costs with every link's α multiplied by `factor` (finite and positive; else
    /// unchanged).
    pub fn scale_alpha(mut self, factor: f64) -> Costs {
        if factor.is_finite() && factor > 0.0 {
            for l in self.links.iter_mut().flatten() {
                l.alpha *= factor;
            }
            self.links = self.links.map(|l| l.filter(LinkCost::valid));
        }
        self
    }

    /// The model of links of `kind`, if measured.
    pub fn link(&self, kind: LinkKind) -> Option<LinkCost> {
        self.links[kind.index()]
    }

    /// Seconds per byte folded, if measured.
    pub fn gamma(&self) -> Option<f64> {
        self.gamma
    }

    /// The defaults: measured by [`crate::Communicator::calibrate`] on the reference machine
    /// (2 ranks), used as they are where nothing was calibrated or probed, and what a probe
    /// carries to the machine it runs on ([`Costs::rescaled`]).
    pub fn defaults() -> &'static Costs {
        static DEFAULTS: OnceLock<Costs> = OnceLock::new();
        DEFAULTS.get_or_init(|| {
            // A unit test checks that the file parses; an empty table (every area way priced
            // alike) is the fallback that cannot fail.
            Costs::parse(include_str!("defaults.txt"))
                .unwrap_or_else(|_| Costs::from_points("empty", 0, []))
        })
    }

    /// Where the numbers come from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The rank count they were measured with (0 if unknown).
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Whether `key` has measurements.
    pub fn has(&self, key: Key) -> bool {
        key.index().is_some_and(|i| self.curves[i].is_some())
    }

    /// The estimated time of `key` for `bytes` bytes, in seconds; `None` if it was never
    /// measured.
    pub fn estimate(&self, key: Key, bytes: usize) -> Option<f64> {
        let curve = self.curves[key.index()?].as_ref()?;
        Some(along(curve, bytes))
    }

    /// The text form (see the module documentation); [`Costs::parse`] reads it back.
    pub fn to_text(&self) -> String {
        let mut s = format!("{FORMAT}\nsource {}\nranks {}\n", self.source, self.ranks);
        if self.probes > 0 {
            let _ = writeln!(s, "probes {}", self.probes);
        }
        for c in AREA_COLLECTIVES {
            for way in WAYS {
                for in_place in [false, true] {
                    let key = Key {
                        collective: c,
                        way,
                        in_place,
                    };
                    let Some(Some(curve)) = key.index().map(|i| &self.curves[i]) else {
                        continue;
                    };
                    let _ = write!(s, "{key}");
                    for &(b, t) in curve {
                        let _ = write!(s, " {b}={t:.4e}");
                    }
                    s.push('\n');
                }
            }
        }
        for kind in LinkKind::ALL {
            if let Some(l) = self.links[kind.index()] {
                let _ = write!(
                    s,
                    "link {} alpha={:.4e} beta={:.4e}",
                    kind.name(),
                    l.alpha,
                    l.beta
                );
                if let Some((bytes, beta)) = l.stream {
                    let _ = write!(s, " stream={bytes}:{beta:.4e}");
                }
                s.push('\n');
            }
        }
        if let Some(g) = self.gamma {
            let _ = writeln!(s, "fold gamma={g:.4e}");
        }
        if let Some(o) = self.overhead {
            let _ = writeln!(s, "message overhead={o:.4e}");
        }
        s
    }

    /// Reads the text form; the error says which line is wrong and why.
    pub fn parse(text: &str) -> Result<Costs, String> {
        if text.len() > MAX_TEXT_BYTES {
            return Err(format!(
                "{} bytes, more than the {MAX_TEXT_BYTES} a cost table may have",
                text.len()
            ));
        }
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
        match lines.next() {
            Some((_, first)) if first == FORMAT => {}
            _ => return Err(format!("line 1: not {FORMAT:?}")),
        }
        let (mut source, mut ranks, mut probes) = (String::new(), 0, 0);
        let mut curves: [Option<Curve>; SLOTS] = std::array::from_fn(|_| None);
        let mut links = [None; LinkKind::ALL.len()];
        let mut gamma = None;
        let mut overhead = None;
        for (no, line) in lines {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("line {no}: {why}");
            if let Some(s) = line.strip_prefix("source ") {
                source = s.to_owned();
                continue;
            }
            if let Some(r) = line.strip_prefix("ranks ") {
                ranks = r.trim().parse().map_err(|_| bad("not a rank count"))?;
                continue;
            }
            if let Some(r) = line.strip_prefix("probes ") {
                if probes != 0 {
                    return Err(bad("probes given twice"));
                }
                probes = r
                    .trim()
                    .parse()
                    .ok()
                    .filter(|&p| (1..=MAX_PROBES).contains(&p))
                    .ok_or_else(|| bad(&format!("not a probe count from 1 to {MAX_PROBES}")))?;
                continue;
            }
            // `name=seconds`, in range.
            let value = |word: Option<&str>, name: &str| -> Result<f64, String> {
                let v = word
                    .and_then(|w| w.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
                    .ok_or_else(|| bad(&format!("expected {name}=seconds")))?;
                if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) {
                    Ok(v)
                } else {
                    Err(bad(&format!("{name}: out of range")))
                }
            };
            if let Some(rest) = line.strip_prefix("link ") {
                let mut words = rest.split_whitespace();
                let name = words.next().unwrap_or("");
                let kind = LinkKind::of(name)
                    .ok_or_else(|| bad(&format!("{name:?} is not a kind of link")))?;
                let mut cost = LinkCost {
                    alpha: value(words.next(), "alpha")?,
                    beta: value(words.next(), "beta")?,
                    stream: None,
                };
                if let Some(w) = words.next() {
                    let (bytes, beta) = w
                        .strip_prefix("stream=")
                        .and_then(|v| v.split_once(':'))
                        .and_then(|(b, v)| Some((b.parse::<usize>().ok()?, v.parse::<f64>().ok()?)))
                        .ok_or_else(|| bad("expected stream=bytes:seconds"))?;
                    cost.stream = Some((bytes, beta));
                    if !cost.valid() {
                        return Err(bad(&format!(
                            "stream: out of range (bytes above {}, seconds per byte)",
                            LinkCost::NEAR_BYTES
                        )));
                    }
                }
                if words.next().is_some() {
                    return Err(bad("more than alpha, beta and stream"));
                }
                if links[kind.index()].replace(cost).is_some() {
                    return Err(bad(&format!("link {name} given twice")));
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix("fold ") {
                let mut words = rest.split_whitespace();
                let g = value(words.next(), "gamma")?;
                if words.next().is_some() || gamma.replace(g).is_some() {
                    return Err(bad("expected one `fold gamma=seconds`"));
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix("message ") {
                let mut words = rest.split_whitespace();
                let o = value(words.next(), "overhead")?;
                if words.next().is_some() || overhead.replace(o).is_some() {
                    return Err(bad("expected one `message overhead=seconds`"));
                }
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(c), Some(w), Some(p)) = (words.next(), words.next(), words.next()) else {
                return Err(bad("expected `collective way placement size=seconds ...`"));
            };
            let collective = AREA_COLLECTIVES
                .into_iter()
                .find(|x| x.name() == c)
                .ok_or_else(|| bad(&format!("{c:?} has no ways through the area")))?;
            let way = WAYS
                .into_iter()
                .find(|x| x.name() == w)
                .ok_or_else(|| bad(&format!("{w:?} is not a way")))?;
            let in_place = match p {
                "in-place" => true,
                "out-of-place" => false,
                _ => return Err(bad(&format!("{p:?} is not in-place or out-of-place"))),
            };
            let key = Key {
                collective,
                way,
                in_place,
            };
            let mut curve = Curve::new();
            for word in words {
                if curve.len() == MAX_POINTS {
                    return Err(bad(&format!("more than {MAX_POINTS} sizes")));
                }
                let point = word
                    .split_once('=')
                    .and_then(|(b, t)| Some((b.parse::<usize>().ok()?, t.parse::<f64>().ok()?)));
                let Some((b, t)) = point else {
                    return Err(bad(&format!("{word:?} is not size=seconds")));
                };
                if !(t.is_finite() && (0.0..=MAX_SECONDS).contains(&t)) {
                    return Err(bad(&format!("{word:?}: time out of range")));
                }
                if curve.last().is_some_and(|&(last, _)| last >= b) {
                    return Err(bad(&format!("{word:?}: sizes must increase")));
                }
                curve.push((b, t));
            }
            if curve.is_empty() {
                return Err(bad("no sizes"));
            }
            let Some(slot) = key.index().map(|i| &mut curves[i]) else {
                return Err(bad("not a priced way"));
            };
            if slot.replace(curve).is_some() {
                return Err(bad(&format!("{key} given twice")));
            }
        }
        Ok(Costs {
            source,
            ranks,
            probes,
            curves,
            links,
            gamma,
            overhead,
        })
    }
}

/// The median of `values` (the mean of the middle two of an even count); `None` if empty.
fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The piecewise α-β estimate along `curve` (non-empty, sizes increasing) at `bytes`.
fn along(curve: &[(usize, f64)], bytes: usize) -> f64 {
    let i = curve.partition_point(|&(b, _)| b < bytes);
    // A measured size reads its own time: through the segment below it, `t0 + (t1 - t0)` can
    // land an ulp away from `t1`, and move with `t0` (a joined probe's "no point got slower"
    // failed by 4.0360000000000004e-7 against 4.036e-7 that way).
    if curve.get(i).is_some_and(|&(b, _)| b == bytes) {
        return curve[i].1;
    }
    let segment = match i {
        0 => return curve[0].1,
        i if i == curve.len() => {
            if i == 1 {
                return curve[0].1;
            }
            i - 1
        }
        i => i,
    };
    let ((b0, t0), (b1, t1)) = (curve[segment - 1], curve[segment]);
    let beta = (t1 - t0) / (b1 - b0) as f64;
    let t = t0 + beta * (bytes - b0) as f64;
    if i == curve.len() {
        // Beyond the last size: the last segment's β, never decreasing.
        t1 + beta.max(0.0) * (bytes - b1) as f64
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measured_size_reads_its_own_time() {
        // Pairs where going through the segment below rounds away from the point itself.
        let mut rounded = 0;
        for k in 1..2000u32 {
            let (t0, t1) = (
                1e-7 * f64::from(k) / 7.0,
                4.036e-7 + 1e-9 * f64::from(k) / 3.0,
            );
            rounded += usize::from(t0 + (t1 - t0) != t1);
            let curve = [(8, t0), (4096, t1), (1 << 20, 2e-4)];
            assert_eq!(along(&curve, 4096), t1, "{t0} {t1}");
            assert_eq!(along(&curve, 8), t0);
            assert_eq!(along(&curve, 1 << 20), 2e-4);
        }
        assert!(rounded > 0, "no pair exercised the rounding");
    }

    fn key(way: Way, in_place: bool) -> Key {
        Key {
            collective: Collective::AllReduce,
            way,
            in_place,
        }
    }

    #[test]
    fn estimates_are_the_line_through_the_neighbouring_points() {
        let c = Costs::from_points(
            "test",
            2,
            [(
                key(Way::TwoShot, false),
                vec![(1000, 1e-6), (100, 5e-7), (3000, 5e-6)],
            )],
        );
        let e = |b| c.estimate(key(Way::TwoShot, false), b).unwrap();
        assert_eq!(e(0), 5e-7);
        assert_eq!(e(100), 5e-7);
        assert!((e(550) - 7.5e-7).abs() < 1e-15);
        assert!((e(2000) - 3e-6).abs() < 1e-15);
        // Beyond the last point, the last segment's slope (2e-9 s/B).
        assert!((e(4000) - 7e-6).abs() < 1e-15);
        assert_eq!(c.estimate(key(Way::Direct, false), 10), None);
        assert_eq!(
            c.estimate(
                Key {
                    collective: Collective::Gather,
                    way: Way::TwoShot,
                    in_place: false
                },
                10
            ),
            None
        );
        // One point: constant; a falling last segment does not go below its last point.
        let c = Costs::from_points(
            "t",
            2,
            [
                (key(Way::OneShot, true), vec![(64, 2e-7)]),
                (key(Way::Direct, true), vec![(64, 2e-6), (128, 1e-6)]),
            ],
        );
        assert_eq!(c.estimate(key(Way::OneShot, true), 1 << 30), Some(2e-7));
        assert_eq!(c.estimate(key(Way::Direct, true), 1 << 30), Some(1e-6));
    }

    #[test]
    fn a_probe_carries_each_curve_by_its_ratio_between_the_probed_sizes() {
        let bcast = Key {
            collective: Collective::Broadcast,
            way: Way::Staged,
            in_place: false,
        };
        let table = Costs::from_points(
            "table",
            2,
            [
                (
                    key(Way::TwoShot, false),
                    vec![
                        (8, 1e-6),
                        (64, 2e-6),
                        (512, 4e-6),
                        (4096, 8e-6),
                        (8192, 1e-5),
                    ],
                ),
                (key(Way::Direct, false), vec![(8, 5e-6), (4096, 9e-6)]),
                (key(Way::OneShot, true), vec![(8, 3e-7), (4096, 3e-6)]),
                (bcast, vec![(8, 1e-6)]),
            ],
        )
        .with_link(
            LinkKind::Shm,
            LinkCost {
                alpha: 6e-7,
                beta: 1e-10,
                stream: None,
            },
        )
        .with_gamma(2e-11);
        let probed = Costs::from_points(
            "probed here",
            4,
            [
                // Twice the table at 8 B, half of it at 4096 B; a zero at 64 B is left out.
                (
                    key(Way::TwoShot, false),
                    vec![(8, 2e-6), (64, 0.0), (4096, 4e-6)],
                ),
                // 100 times the table (a level further off than the bound: taken), and at
                // 512 B 100 times that (off the curve's own level: held to the bound).
                (
                    key(Way::Direct, false),
                    vec![
                        (8, 5e-4),
                        (512, 1e4 * along(&[(8, 5e-6), (4096, 9e-6)], 512)),
                        (4096, 9e-4),
                    ],
                ),
                // A curve the table lacks.
                (key(Way::TwoShot, true), vec![(8, 7e-7)]),
            ],
        );
        let c = table.rescaled(&probed);
        let e = |k, b| c.estimate(k, b).unwrap();
        let close = |x: f64, y: f64| assert!((x - y).abs() <= 1e-12 * y.abs().max(1e-9), "{x} {y}");
        // At the probed sizes, the probed times; between them the table's shape, the ratio
        // moving from 2 to 0.5 with log2 of the size (8 -> 4096 is 9 steps: 64 is a third of
        // the way, 512 two thirds).
        close(e(key(Way::TwoShot, false), 8), 2e-6);
        close(e(key(Way::TwoShot, false), 4096), 4e-6);
        close(e(key(Way::TwoShot, false), 64), 2e-6 * 1.5);
        close(e(key(Way::TwoShot, false), 512), 4e-6 * 1.0);
        // Beyond the last probed size, its ratio.
        close(e(key(Way::TwoShot, false), 8192), 0.5 * 1e-5);
        close(e(key(Way::Direct, false), 8), 5e-4);
        close(e(key(Way::Direct, false), 4096), 9e-4);
        let direct_512 = along(&[(8, 5e-6), (4096, 9e-6)], 512);
        close(
            e(key(Way::Direct, false), 512),
            direct_512 * 100.0 * RESCALE_BOUND,
        );
        // Not probed: the table scaled by the median of the probed all-reduce curves' medians
        // (TwoShot's: (2 + 0.5) / 2; Direct's: 100); a collective nothing of which was probed,
        // by every probed curve's.
        let level = (1.25 + 100.0) / 2.0;
        close(e(key(Way::OneShot, true), 4096), 3e-6 * level);
        close(e(bcast, 8), 1e-6 * level);
        // Only probed: as probed.
        close(e(key(Way::TwoShot, true), 1 << 20), 7e-7);
        // The table's links and folds, the probe's source and rank count.
        assert_eq!(c.link(LinkKind::Shm), table.link(LinkKind::Shm));
        assert_eq!(c.gamma(), Some(2e-11));
        assert_eq!((c.source(), c.ranks()), ("probed here", 4));
        // What it writes reads back.
        assert_eq!(Costs::parse(&c.to_text()).unwrap().to_text(), c.to_text());
    }

    #[test]
    fn the_text_form_reads_back_and_the_defaults_parse() {
        let d = Costs::parse(include_str!("defaults.txt")).expect("defaults.txt parses");
        assert_eq!(&d, Costs::defaults());
        assert!(d.has(key(Way::TwoShot, true)) && d.has(key(Way::OneShot, false)));
        let again = Costs::parse(&d.to_text()).unwrap();
        for c in AREA_COLLECTIVES {
            for way in WAYS {
                for in_place in [false, true] {
                    let k = Key {
                        collective: c,
                        way,
                        in_place,
                    };
                    for b in [0, 8, 5000, 1 << 20, 1 << 30] {
                        let (x, y) = (d.estimate(k, b), again.estimate(k, b));
                        match (x, y) {
                            (Some(x), Some(y)) => assert!((x - y).abs() <= x * 1e-3, "{k} {b}"),
                            _ => assert_eq!(x, y),
                        }
                    }
                }
            }
        }
        assert_eq!(again.source(), d.source());
    }

    #[test]
    fn a_probe_joined_with_an_earlier_one_keeps_each_points_fastest_and_counts_them() {
        let k = key(Way::TwoShot, false);
        let other = key(Way::OneShot, true);
        let link = |alpha, beta, s| LinkCost {
            alpha,
            beta,
            stream: Some((64 << 20, s)),
        };
        let now = Costs::from_points(
            "now",
            2,
            [
                (k, vec![(8, 1e-6), (4096, 9e-6), (1 << 20, 2e-4)]),
                (other, vec![(8, 5e-7)]),
            ],
        )
        .with_link(LinkKind::Shm, link(2e-6, 1e-10, 4e-10))
        .with_gamma(3e-11)
        .with_overhead(1e-6)
        .with_probes(1);
        // The earlier probe: slower at 8 B, faster at 4 KiB, a size the new one lacks, no
        // curve of the other key; its link faster in α, slower in β.
        let earlier = Costs::from_points(
            "then",
            2,
            [(k, vec![(8, 3e-6), (4096, 4e-6), (65536, 1e-9)])],
        )
        .with_link(LinkKind::Shm, link(1e-6, 3e-10, 2e-10))
        .with_gamma(5e-11)
        .with_overhead(9e-6)
        .with_probes(2);
        let j = now.clone().fastest_of(&earlier);
        assert_eq!(j.probes(), 3);
        assert_eq!((j.source(), j.ranks()), ("now", 2));
        assert_eq!(j.estimate(k, 8), Some(1e-6));
        assert_eq!(j.estimate(k, 4096), Some(4e-6));
        assert_eq!(j.estimate(k, 1 << 20), Some(2e-4));
        // Sizes only the earlier probe measured are not taken: the new one's grid stands, and
        // 64 KiB lies on the line through the joined 4 KiB and 1 MiB points.
        let line = 4e-6 + (2e-4 - 4e-6) * (65536.0 - 4096.0) / ((1 << 20) - 4096) as f64;
        assert!((j.estimate(k, 65536).unwrap() - line).abs() < 1e-12);
        assert_eq!(j.estimate(other, 8), Some(5e-7));
        // The links and the overhead as a pair, from the probe of the smaller α; the faster
        // fold rate.
        assert_eq!(j.link(LinkKind::Shm), earlier.link(LinkKind::Shm));
        assert_eq!((j.gamma(), j.overhead()), (Some(3e-11), Some(9e-6)));
        let k2 = now
            .clone()
            .with_link(LinkKind::Shm, link(5e-7, 1e-10, 4e-10));
        let j2 = k2.clone().fastest_of(&earlier);
        assert_eq!(j2.link(LinkKind::Shm), k2.link(LinkKind::Shm));
        assert_eq!(j2.overhead(), Some(1e-6));
        // Links of other kinds are not compared: the new probe's stand.
        let tcp = earlier
            .clone()
            .with_link(LinkKind::Tcp, link(1e-7, 1e-11, 1e-11));
        assert_eq!(now.clone().fastest_of(&tcp).link(LinkKind::Tcp), None);
        // A table without a count (before counts were kept, or a fresh probe) counts as one.
        let plain = Costs::from_points("old", 2, [(k, vec![(8, 2e-6)])]);
        assert_eq!(plain.probes(), 0);
        assert_eq!(plain.clone().fastest_of(&plain).probes(), 2);
        // The count reads back; a table without one has none; zero or absurd counts are refused.
        let text = j.to_text();
        assert!(text.contains("\nprobes 3\n"), "{text}");
        assert_eq!(Costs::parse(&text).unwrap().probes(), 3);
        assert!(!plain.to_text().contains("probes"));
        for bad in ["probes 0", "probes two", "probes 1001"] {
            let e = Costs::parse(&format!("{FORMAT}\n{bad}\n")).unwrap_err();
            assert!(e.contains("line 2: not a probe count"), "{bad}: {e}");
        }
        let e = Costs::parse(&format!("{FORMAT}\nprobes 1\nprobes 2\n")).unwrap_err();
        assert!(e.contains("line 3: probes given twice"), "{e}");
    }

    #[test]
    fn every_kind_of_link_reads_back_by_its_transports_name() {
        let mut c = Costs::from_points("t", 2, []);
        for (i, kind) in LinkKind::ALL.into_iter().enumerate() {
            assert_eq!(LinkKind::of(kind.name()), Some(kind));
            let cost = LinkCost {
                alpha: 1e-6 * (i + 1) as f64,
                beta: 1e-10 * (i + 1) as f64,
                stream: (i % 2 == 0).then_some((64 << 20, 3e-10 * (i + 1) as f64)),
            };
            c = c.with_link(kind, cost);
        }
        let again = Costs::parse(&c.to_text()).unwrap();
        for kind in LinkKind::ALL {
            let (x, y) = (c.link(kind).unwrap(), again.link(kind).unwrap());
            assert!((x.alpha - y.alpha).abs() <= x.alpha * 1e-3, "{kind:?}");
            assert!((x.beta - y.beta).abs() <= x.beta * 1e-3, "{kind:?}");
            match (x.stream, y.stream) {
                (Some((b, s)), Some((b2, s2))) => {
                    assert_eq!(b, b2, "{kind:?}");
                    assert!((s - s2).abs() <= s * 1e-3, "{kind:?}");
                }
                (x, y) => assert_eq!(x, y, "{kind:?}"),
            }
        }
        assert!(
            c.to_text()
                .contains("link rdma alpha=3.0000e-6 beta=3.0000e-10 stream=67108864:9.0000e-10\n")
        );
        assert_eq!(LinkKind::of("loopback"), None);
        // The defaults price no rdma: it was not on the reference machine.
        assert_eq!(Costs::defaults().link(LinkKind::Rdma), None);
    }

    #[test]
    fn the_overhead_per_message_reads_back_and_bad_lines_are_refused() {
        let c = Costs::from_points("t", 4, []).with_overhead(1.5e-6);
        let again = Costs::parse(&c.to_text()).unwrap();
        assert!((again.overhead().unwrap() - 1.5e-6).abs() < 1e-12);
        assert_eq!(Costs::from_points("t", 4, []).overhead(), None);
        assert_eq!(
            Costs::from_points("t", 4, [])
                .with_overhead(-1.0)
                .overhead(),
            None
        );
        for (text, why) in [
            ("message overhead=-1e-6", "out of range"),
            ("message overhead=1e-6 extra", "expected one"),
            (
                "message overhead=1e-6\nmessage overhead=2e-6",
                "expected one",
            ),
            ("message latency=1e-6", "expected overhead=seconds"),
        ] {
            let e = Costs::parse(&format!("{FORMAT}\n{text}\n")).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn beta_moves_from_the_cached_to_the_streaming_rate_with_the_logarithm_of_the_size() {
        let near = LinkCost::NEAR_BYTES;
        let plain = LinkCost::fit((8, 1e-6), (near, 1e-6 + near as f64 * 1e-10));
        assert!((plain.beta - 1e-10).abs() < 1e-15);
        assert_eq!(plain.beta_for(1 << 30), plain.beta);
        // 64 MiB took α + 64 MiB × 4e-10.
        let far = 64 << 20;
        let l = plain.with_stream(far, plain.alpha + far as f64 * 4e-10);
        let (_, b) = l.stream.unwrap();
        assert!((b - 4e-10).abs() < 1e-15, "{b}");
        assert_eq!(l.beta_for(8), plain.beta);
        assert_eq!(l.beta_for(near), plain.beta);
        // 16 MiB is half way from 4 to 64 MiB in log2.
        assert!((l.beta_for(16 << 20) - 2.5e-10).abs() < 1e-15);
        assert!((l.beta_for(far) - 4e-10).abs() < 1e-15);
        assert!((l.beta_for(1 << 30) - 4e-10).abs() < 1e-15);
        // A streaming size within the caches' is no streaming rate.
        assert_eq!(plain.with_stream(near, 1.0).stream, None);
    }

    #[test]
    fn damaged_text_is_rejected_with_the_line() {
        let ok = "oxccl-costs 1\nall_reduce two-shot in-place 8=1e-6 16=2e-6\n";
        assert!(Costs::parse(ok).is_ok());
        for (text, why) in [
            ("", "line 1"),
            ("oxccl-costs 2\n", "line 1"),
            ("oxccl-costs 1\nbarrier staged in-place 8=1\n", "line 2"),
            ("oxccl-costs 1\nall_reduce fast in-place 8=1\n", "not a way"),
            (
                "oxccl-costs 1\nall_reduce direct sideways 8=1\n",
                "in-place",
            ),
            ("oxccl-costs 1\nall_reduce direct in-place\n", "no sizes"),
            (
                "oxccl-costs 1\nall_reduce direct in-place 8=NaN\n",
                "out of range",
            ),
            (
                "oxccl-costs 1\nall_reduce direct in-place 8=-1\n",
                "out of range",
            ),
            (
                "oxccl-costs 1\nall_reduce direct in-place 8=1e300\n",
                "out of range",
            ),
            (
                "oxccl-costs 1\nall_reduce direct in-place 16=1 8=2\n",
                "increase",
            ),
            (
                "oxccl-costs 1\nall_reduce direct in-place 8:1\n",
                "size=seconds",
            ),
            ("oxccl-costs 1\nranks two\n", "rank count"),
            (
                "oxccl-costs 1\nlink shm alpha=1e-6 beta=1e-10 stream=64:1e-9\n",
                "stream: out of range",
            ),
            (
                "oxccl-costs 1\nlink shm alpha=1e-6 beta=1e-10 stream=67108864:-1\n",
                "stream: out of range",
            ),
            (
                "oxccl-costs 1\nlink shm alpha=1e-6 beta=1e-10 stream=67108864\n",
                "stream=bytes:seconds",
            ),
            (
                "oxccl-costs 1\nlink shm alpha=1e-6 beta=1e-10 stream=67108864:1e-9 x\n",
                "more than",
            ),
            (
                "oxccl-costs 1\nreduce staged in-place 8=1\nreduce staged in-place 8=1\n",
                "twice",
            ),
        ] {
            let e = Costs::parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        let many: String = (1..=MAX_POINTS + 1).map(|i| format!(" {i}=1e-6")).collect();
        let e = Costs::parse(&format!("oxccl-costs 1\nreduce staged in-place{many}\n"));
        assert!(e.unwrap_err().contains("more than"));
        let huge = "#".repeat(MAX_TEXT_BYTES + 1);
        assert!(Costs::parse(&huge).unwrap_err().contains("bytes"));
    }
}
