//! Line charts as hand-written SVG (no plotting dependency): messages/s
//! against the added round trip, ours beside each baseline. Figure 3 draws
//! one from the e2e run; figure 4's Python script writes the same [`Chart`]
//! as JSON and draws it with `sqs-flight-bench chart`.
//!
//! Each series is a line with markers; a baseline shares the colour of the
//! series it is measured against and is drawn dashed with hollow markers.
//! The y axis is logarithmic (rates at 0 ms and at 50 ms differ by orders
//! of magnitude), ticks at 1, 2 and 5 of each decade.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::report::number;

/// Colours of the series groups (colour-blind-safe, Okabe-Ito).
const PALETTE: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999",
];
const WIDTH: f64 = 880.0;
const HEIGHT: f64 = 500.0;
/// Plot area: left, top, right, bottom edges.
const LEFT: f64 = 90.0;
const TOP: f64 = 50.0;
const RIGHT: f64 = 560.0;
const BOTTOM: f64 = 430.0;

/// One line of a chart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Series {
    pub name: String,
    /// A baseline: dashed, hollow markers.
    #[serde(default)]
    pub dashed: bool,
    /// Index into the palette; [`Chart::pair`] sets it.
    #[serde(default)]
    pub colour: usize,
    /// `(x, y)`; points with a y that is not positive and finite are left
    /// out (JSON writes a NaN as `null`).
    #[serde(deserialize_with = "points_with_gaps")]
    pub points: Vec<(f64, f64)>,
}

/// `[[x, y], ...]` where a y may be `null` (NaN: a run that failed).
fn points_with_gaps<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(f64, f64)>, D::Error> {
    let points = Vec::<(f64, Option<f64>)>::deserialize(d)?;
    Ok(points
        .into_iter()
        .map(|(x, y)| (x, y.unwrap_or(f64::NAN)))
        .collect())
}

impl Series {
    pub fn new(name: impl Into<String>, dashed: bool) -> Self {
        Self {
            name: name.into(),
            dashed,
            colour: 0,
            points: Vec::new(),
        }
    }
}

/// A chart: title, axis labels, series.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

impl Chart {
    pub fn new(title: &str, x_label: &str, y_label: &str) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
        }
    }

    fn next_colour(&self) -> usize {
        self.series.iter().map(|s| s.colour + 1).max().unwrap_or(0)
    }

    /// Adds ours and its baseline, in one colour.
    pub fn pair(&mut self, mut ours: Series, mut baseline: Series) {
        let colour = self.next_colour();
        (ours.colour, baseline.colour) = (colour, colour);
        self.series.push(ours);
        self.series.push(baseline);
    }

    /// The chart as a standalone SVG document.
    pub fn svg(&self) -> String {
        let points = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter())
                .filter(|(x, y)| x.is_finite() && y.is_finite() && *y > 0.0)
        };
        let x_max = points().map(|p| p.0).fold(0f64, f64::max);
        let (y_min, y_max) = points().fold((f64::INFINITY, 0f64), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
        let x = LinearAxis::new(x_max);
        let y = LogAxis::new(y_min, y_max);
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            svg,
            r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="28" font-size="15" text-anchor="middle">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        self.axes(&mut svg, &x, &y);
        for s in &self.series {
            draw_series(&mut svg, s, &x, &y);
        }
        self.legend(&mut svg);
        svg.push_str("</svg>\n");
        svg
    }

    fn axes(&self, svg: &mut String, x: &LinearAxis, y: &LogAxis) {
        for t in y.ticks() {
            let py = y.pos(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{RIGHT}" y2="{py:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT - 8.0,
                py + 4.0,
                tick_label(t)
            );
        }
        for t in x.ticks() {
            let px = x.pos(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{BOTTOM}" x2="{px:.1}" y2="{}" stroke="#333"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
                BOTTOM + 5.0,
                BOTTOM + 20.0,
                tick_label(t)
            );
        }
        let _ = writeln!(
            svg,
            r##"<path d="M{LEFT},{TOP} V{BOTTOM} H{RIGHT}" fill="none" stroke="#333"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (LEFT + RIGHT) / 2.0,
            BOTTOM + 45.0,
            escape(&self.x_label)
        );
        let mid = (TOP + BOTTOM) / 2.0;
        let _ = writeln!(
            svg,
            r#"<text x="20" y="{mid}" text-anchor="middle" transform="rotate(-90 20 {mid})">{} (log scale)</text>"#,
            escape(&self.y_label)
        );
    }

    fn legend(&self, svg: &mut String) {
        let left = RIGHT + 25.0;
        for (i, s) in self.series.iter().enumerate() {
            let y = TOP + 10.0 + 22.0 * i as f64;
            let colour = PALETTE[s.colour % PALETTE.len()];
            let dash = if s.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = writeln!(
                svg,
                r#"<line x1="{left}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>"#,
                left + 30.0
            );
            marker(svg, left + 15.0, y, colour, s.dashed);
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}">{}</text>"#,
                left + 38.0,
                y + 4.0,
                escape(&s.name)
            );
        }
    }
}

fn draw_series(svg: &mut String, s: &Series, x: &LinearAxis, y: &LogAxis) {
    let colour = PALETTE[s.colour % PALETTE.len()];
    let mut pts: Vec<(f64, f64)> = s
        .points
        .iter()
        .filter(|(px, py)| px.is_finite() && py.is_finite() && *py > 0.0)
        .map(|&(px, py)| (x.pos(px), y.pos(py)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let line: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
    let dash = if s.dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    };
    let _ = writeln!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
        line.join(" ")
    );
    for (px, py) in pts {
        marker(svg, px, py, colour, s.dashed);
    }
}

/// A circle, filled for ours, hollow for a baseline.
fn marker(svg: &mut String, x: f64, y: f64, colour: &str, hollow: bool) {
    let fill = if hollow { "white" } else { colour };
    let _ = writeln!(
        svg,
        r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{fill}" stroke="{colour}" stroke-width="2"/>"#
    );
}

/// `0`, `20`, `5,000`, `0.5`.
fn tick_label(t: f64) -> String {
    if t.fract() == 0.0 && t.abs() < 100.0 {
        format!("{t:.0}")
    } else {
        number(t)
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// From 0 to a round number at or above the largest x.
struct LinearAxis {
    max: f64,
    step: f64,
}

impl LinearAxis {
    fn new(x_max: f64) -> Self {
        let x_max = if x_max > 0.0 { x_max } else { 1.0 };
        // The smallest 1, 2 or 5 x 10^k that needs at most 6 steps.
        let raw = x_max / 6.0;
        let decade = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .map(|m| m * decade)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * decade);
        Self {
            max: (x_max / step).ceil() * step,
            step,
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let n = (self.max / self.step).round() as usize;
        (0..=n).map(|i| i as f64 * self.step).collect()
    }

    fn pos(&self, x: f64) -> f64 {
        LEFT + (RIGHT - LEFT) * x / self.max
    }
}

/// Whole decades around the data.
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    fn new(min: f64, max: f64) -> Self {
        if !(min.is_finite() && max > 0.0) {
            return Self { lo: 0.0, hi: 1.0 };
        }
        let lo = min.log10().floor();
        let hi = max.log10().ceil().max(lo + 1.0);
        Self { lo, hi }
    }

    fn ticks(&self) -> Vec<f64> {
        let mut ticks = Vec::new();
        for k in self.lo as i32..=self.hi as i32 {
            for m in [1.0, 2.0, 5.0] {
                let t = m * 10f64.powi(k);
                if t.log10() <= self.hi + 1e-9 {
                    ticks.push(t);
                }
            }
        }
        ticks
    }

    fn pos(&self, y: f64) -> f64 {
        BOTTOM - (BOTTOM - TOP) * (y.log10() - self.lo) / (self.hi - self.lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        let mut c = Chart::new("Figure <3> & co", "RTT (ms)", "messages/s");
        let mut ours = Series::new("ours, 256 B", false);
        ours.points = vec![(0.0, 20_000.0), (20.0, 3_000.0), (50.0, 1_200.0)];
        let mut raw = Series::new("raw", true);
        raw.points = vec![(0.0, 18_000.0), (20.0, 2_000.0), (50.0, f64::NAN)];
        c.pair(ours, raw);
        let mut other = Series::new("floor", true);
        other.points = vec![(0.0, 500.0)];
        other.colour = 1;
        c.series.push(other);
        c
    }

    #[test]
    fn draws_a_line_per_series_with_axes_and_legend() {
        let c = chart();
        assert_eq!(
            c.series.iter().map(|s| s.colour).collect::<Vec<_>>(),
            [0, 0, 1]
        );
        let svg = c.svg();
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        // 3 + 2 + 1 markers on lines, 3 in the legend.
        assert_eq!(svg.matches("<circle").count(), 9);
        assert!(svg.contains("Figure &lt;3&gt; &amp; co"));
        assert!(svg.contains("messages/s (log scale)"));
        assert!(svg.contains(">20,000<"), "a y tick of the top decade");
        assert!(svg.contains(">50<"), "an x tick at 50");
    }

    #[test]
    fn round_trips_through_json() {
        let c = chart();
        let text = serde_json::to_string(&c).unwrap();
        let back: Chart = serde_json::from_str(&text).unwrap();
        assert_eq!(back.series.len(), 3);
        let minimal: Chart = serde_json::from_str(
            r#"{"title":"t","x_label":"x","y_label":"y",
                "series":[{"name":"a","points":[[0,1],[20,2]]}]}"#,
        )
        .unwrap();
        assert!(!minimal.series[0].dashed);
        assert!(minimal.svg().contains("<polyline"));
    }

    #[test]
    fn axes_are_round() {
        let x = LinearAxis::new(50.0);
        assert_eq!(x.ticks(), [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(LinearAxis::new(0.0).ticks().last(), Some(&1.0));
        let y = LogAxis::new(450.0, 23_000.0);
        let t = y.ticks();
        assert_eq!(t.first(), Some(&100.0));
        assert_eq!(t.last(), Some(&100_000.0));
        assert!((y.pos(100.0) - BOTTOM).abs() < 1e-9);
        assert!((y.pos(100_000.0) - TOP).abs() < 1e-9);
    }
}
