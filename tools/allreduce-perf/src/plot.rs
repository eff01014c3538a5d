//! `--plot`: bus bandwidth against message size (log2 axis) as an SVG, one line per file,
//! placement and (type, operator), with a legend. Reads our JSON schema leniently, so files
//! converted from peers (out-of-place only) overlay ours. Writes only the SVG it is given.

use std::path::Path;

use plotters::prelude::*;
use serde::Deserialize;

/// The part of a results file the plot needs; unknown fields are ignored.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct PlotDoc {
    /// Legend name of the file.
    pub label: Option<String>,
    /// The tool that wrote it.
    pub tool: Option<String>,
    /// The rows.
    pub rows: Vec<PlotRow>,
}

/// One row as the plot reads it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct PlotRow {
    /// nccl-tests' collective name.
    pub collective: Option<String>,
    /// Bytes of the whole array.
    pub size: u64,
    /// Type name.
    #[serde(rename = "type")]
    pub dtype: Option<String>,
    /// Operator name or `none`.
    pub redop: Option<String>,
    /// Out-of-place results.
    pub out_of_place: Option<PlotPlaced>,
    /// In-place results.
    pub in_place: Option<PlotPlaced>,
}

/// One placement as the plot reads it.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
pub struct PlotPlaced {
    /// Bus bandwidth, GB/s.
    pub bus_bw: f64,
}

/// Line colours (Tableau 10): distinct on white, and for most colour-blind readers.
const COLOURS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// One line of the chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (log2 of the size in bytes, bus bandwidth in GB/s), by size.
    pub points: Vec<(f64, f64)>,
}

/// Reads a results file.
pub fn load(path: &Path) -> Result<PlotDoc, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a results file (allreduce-perf -J or peer2json.py): {e}",
            path.display()
        )
    })
}

/// The series of one file: one per placement and (collective, type, operator) present; the
/// legend names the file by its label (else `fallback`) and adds what tells its series apart.
pub fn series(doc: &PlotDoc, fallback: &str) -> Vec<Series> {
    let name = doc.label.clone().unwrap_or_else(|| fallback.to_owned());
    let key = |r: &PlotRow| {
        (
            r.collective.clone().unwrap_or_default(),
            r.dtype.clone().unwrap_or_default(),
            r.redop.clone().unwrap_or_default(),
        )
    };
    let mut kinds: Vec<(String, String, String)> = Vec::new();
    for r in &doc.rows {
        if !kinds.contains(&key(r)) {
            kinds.push(key(r));
        }
    }
    let mut out = Vec::new();
    for kind in &kinds {
        for (placement, pick) in [
            (
                "out-of-place",
                (|r: &PlotRow| r.out_of_place) as fn(&PlotRow) -> _,
            ),
            ("in-place", |r: &PlotRow| r.in_place),
        ] {
            let mut points: Vec<(f64, f64)> = doc
                .rows
                .iter()
                .filter(|r| key(r) == *kind && r.size > 0)
                .filter_map(|r| pick(r).map(|p| ((r.size as f64).log2(), p.bus_bw)))
                .filter(|(_, bw)| bw.is_finite())
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut label = name.clone();
            if kinds.len() > 1 {
                label = format!("{label} {} {}", kind.1, kind.2);
            }
            out.push(Series {
                label: format!("{label} {placement}"),
                points,
            });
        }
    }
    out
}

/// A size axis label: `2^x` bytes as `512B`, `4K`, `64M`, `1G`; empty between powers of two.
fn size_label(x: f64) -> String {
    if (x - x.round()).abs() > 1e-9 || x < 0.0 {
        return String::new();
    }
    let p = x.round() as u32;
    match p {
        0..=9 => format!("{}B", 1u64 << p),
        10..=19 => format!("{}K", 1u64 << (p - 10)),
        20..=29 => format!("{}M", 1u64 << (p - 20)),
        30..=39 => format!("{}G", 1u64 << (p - 30)),
        _ => format!("2^{p}"),
    }
}

/// Draws `series` to the SVG file `path` under `title`.
pub fn draw(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut lo, mut hi, mut top) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in all {
        lo = lo.min(x);
        hi = hi.max(x);
        top = top.max(y);
    }
    if !lo.is_finite() {
        return Err(format!(
            "nothing to plot in {}: no row with a size and a bus bandwidth",
            path.display()
        ));
    }
    let (lo, hi) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
    let top = if top > 0.0 { top * 1.1 } else { 1.0 };
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());

    let root = SVGBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(lo..hi, 0.0..top)
        .map_err(|e| err(&e))?;
    let ticks = ((hi - lo) as usize + 1).min(16);
    chart
        .configure_mesh()
        .x_desc("message size (bytes, log2 scale)")
        .y_desc("bus bandwidth (GB/s)")
        .x_labels(ticks)
        .x_label_formatter(&|x| size_label(*x))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let (r, g, b) = COLOURS[i % COLOURS.len()];
        let color = RGBColor(r, g, b);
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// The series of every overlay file, each named by its label or its file name.
pub fn overlay_series(paths: &[std::path::PathBuf]) -> Result<Vec<Series>, String> {
    let mut out = Vec::new();
    for p in paths {
        let doc = load(p)?;
        let stem = p.file_stem().map_or_else(
            || p.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        out.extend(series(&doc, &stem));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels_are_binary_units_at_powers_of_two() {
        assert_eq!(size_label(3.0), "8B");
        assert_eq!(size_label(10.0), "1K");
        assert_eq!(size_label(26.0), "64M");
        assert_eq!(size_label(31.0), "2G");
        assert_eq!(size_label(3.5), "");
    }

    #[test]
    fn series_split_by_placement_and_kind() {
        let doc: PlotDoc = serde_json::from_str(
            r#"{"label": "ours", "rows": [
                {"collective": "all_reduce", "size": 8, "type": "float", "redop": "sum",
                 "out_of_place": {"bus_bw": 1.0}, "in_place": {"bus_bw": 2.0}},
                {"collective": "all_reduce", "size": 0, "type": "float", "redop": "sum",
                 "out_of_place": {"bus_bw": 0.0}, "in_place": null},
                {"collective": "all_reduce", "size": 1024, "type": "float", "redop": "sum",
                 "out_of_place": {"bus_bw": 3.0}, "in_place": {"bus_bw": 4.0}}
            ]}"#,
        )
        .unwrap();
        let s = series(&doc, "file");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label, "ours out-of-place");
        assert_eq!(s[0].points, vec![(3.0, 1.0), (10.0, 3.0)]);
        assert_eq!(s[1].label, "ours in-place");
        let peer: PlotDoc = serde_json::from_str(
            r#"{"tool": "peer-bench", "rows": [
                {"size": 8, "type": "float", "redop": "sum", "out_of_place": {"bus_bw": 1.0}},
                {"size": 8, "type": "int32", "redop": "sum", "out_of_place": {"bus_bw": 1.0}}
            ]}"#,
        )
        .unwrap();
        let s = series(&peer, "mpi");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label, "mpi float sum out-of-place");
    }
}
