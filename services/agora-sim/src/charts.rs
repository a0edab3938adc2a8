//! SVG charts of experiment results, drawn with `plotters` (SVG backend only: no font or
//! bitmap system libraries; text is sized by plotters' built-in estimate).

use std::path::Path;

use plotters::prelude::*;

/// One named line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
        }
    }
}

/// What a line chart looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Draw a marker at every point (sweeps) or not (CDFs).
    pub markers: bool,
    /// Draw as a step function (CDFs).
    pub steps: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot draw chart {path}: {message}")]
pub struct ChartError {
    pub path: String,
    pub message: String,
}

const SIZE: (u32, u32) = (900, 540);

fn color(index: usize) -> RGBColor {
    // Distinct, readable colours (Tableau 10).
    const COLORS: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    COLORS[index % COLORS.len()]
}

/// A range covering `values` with a little headroom; never empty.
fn padded_range(values: impl Iterator<Item = f64>, include_zero: bool) -> (f64, f64) {
    let (mut low, mut high) = (f64::INFINITY, f64::NEG_INFINITY);
    for value in values.filter(|value| value.is_finite()) {
        low = low.min(value);
        high = high.max(value);
    }
    if !low.is_finite() {
        return (0.0, 1.0);
    }
    if include_zero {
        low = low.min(0.0);
    }
    let span = (high - low).max(high.abs() * 0.1).max(1e-9);
    let low = if include_zero && low >= 0.0 {
        0.0
    } else {
        low - span * 0.05
    };
    (low, high + span * 0.08)
}

/// Draws `series` as lines into an SVG file.
pub fn line_chart(path: &Path, chart: &LineChart<'_>, series: &[Series]) -> Result<(), ChartError> {
    draw_lines(path, chart, series).map_err(|message| ChartError {
        path: path.display().to_string(),
        message,
    })
}

fn draw_lines(path: &Path, spec: &LineChart<'_>, series: &[Series]) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let points = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = padded_range(points().map(|p| p.0), false);
    let (y0, y1) = padded_range(points().map(|p| p.1), true);
    let mut chart = ChartBuilder::on(&root)
        .caption(spec.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(spec.x_label)
        .y_desc(spec.y_label)
        .draw()
        .map_err(|e| e.to_string())?;
    for (index, line) in series.iter().enumerate() {
        let color = color(index);
        let mut points = line.points.clone();
        if spec.steps {
            let mut stepped = Vec::with_capacity(points.len() * 2);
            let mut previous_y = 0.0;
            for &(x, y) in &points {
                stepped.push((x, previous_y));
                stepped.push((x, y));
                previous_y = y;
            }
            points = stepped;
        }
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(line.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if spec.markers {
            chart
                .draw_series(
                    line.points
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
                )
                .map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Grouped bars: one group per category, one bar per series (`values[i]` for category i).
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<(), ChartError> {
    draw_bars(path, title, y_label, categories, series).map_err(|message| ChartError {
        path: path.display().to_string(),
        message,
    })
}

fn draw_bars(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (_, y1) = padded_range(series.iter().flat_map(|(_, v)| v.iter().copied()), true);
    let n = categories.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..y1)
        .map_err(|e| e.to_string())?;
    let names = categories.to_vec();
    let label = move |x: &f64| {
        let index = x.round();
        if (x - index).abs() < 1e-6 && index >= 0.0 {
            names.get(index as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| e.to_string())?;
    let width = 0.8 / series.len().max(1) as f64;
    for (index, (name, values)) in series.iter().enumerate() {
        let color = color(index);
        chart
            .draw_series(values.iter().enumerate().map(|(category, &value)| {
                let left = category as f64 - 0.4 + index as f64 * width;
                Rectangle::new([(left, 0.0), (left + width * 0.9, value)], color.filled())
            }))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
