//! SVG line charts for reports (`draftc bench`, `draftc perf-model`): a row
//! of panels, each with labelled series of points, an optional horizontal
//! reference line (break-even, roofline) and a legend. plotters' SVG backend
//! writes text as `<text>` elements, so no font files are needed.

use std::path::Path;

use plotters::prelude::*;

/// One line of points `(x, y)`, drawn in order.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Clone, Debug, Default)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Logarithmic x axis (batch sizes, context lengths).
    pub log_x: bool,
    pub series: Vec<Series>,
    /// A horizontal line at this y, with its label (e.g. `1×` break-even).
    pub reference: Option<(f64, String)>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Writes `panels` side by side under `title` to an SVG file.
pub fn write_svg(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    let n = panels.len().max(1);
    let (w, h) = (440 * n as u32, 400);
    let e = |x: &dyn std::fmt::Display| format!("drawing {}: {x}", path.display());
    let root = SVGBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root.titled(title, ("sans-serif", 18)).map_err(|x| e(&x))?;
    for (area, panel) in root.split_evenly((1, n)).iter().zip(panels) {
        draw_panel(area, panel).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// x and y ranges of a panel: every point and the reference line, y from 0.
fn ranges(panel: &Panel) -> ((f64, f64), (f64, f64)) {
    let pts = panel.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &(x, y) in pts {
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
    }
    if let Some((r, _)) = &panel.reference {
        y1 = y1.max(*r);
    }
    if !x0.is_finite() {
        (x0, x1) = (1.0, 2.0);
    }
    if x1 <= x0 {
        x1 = if panel.log_x { x0 * 2.0 } else { x0 + 1.0 };
    }
    if panel.log_x && x0 <= 0.0 {
        x0 = x1.min(1.0) / 10.0;
    }
    let y1 = if y1 > 0.0 { y1 * 1.12 } else { 1.0 };
    ((x0, x1), (0.0, y1))
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ((x0, x1), (y0, y1)) = ranges(panel);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&panel.title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50);
    if panel.log_x {
        let mut chart = builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1)?;
        chart
            .configure_mesh()
            .x_desc(panel.x_label.as_str())
            .y_desc(panel.y_label.as_str())
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()?;
        draw_series(&mut chart, panel, (x0, x1))
    } else {
        let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1)?;
        chart
            .configure_mesh()
            .x_desc(panel.x_label.as_str())
            .y_desc(panel.y_label.as_str())
            .draw()?;
        draw_series(&mut chart, panel, (x0, x1))
    }
}

fn draw_series<'a, DB, X>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
    panel: &Panel,
    (x0, x1): (f64, f64),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
{
    if let Some((y, label)) = &panel.reference {
        chart
            .draw_series(LineSeries::new([(x0, *y), (x1, *y)], BLACK.mix(0.4)))?
            .label(label.as_str())
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.4)));
    }
    for (i, s) in panel.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(PointSeries::of_element(
            pts,
            3,
            color.filled(),
            &|c, s, st| Circle::new(c, s, st),
        ))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_every_label() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("p.svg");
        let panels = vec![
            Panel {
                title: "tokens/s".into(),
                x_label: "batch".into(),
                y_label: "tokens/s".into(),
                log_x: true,
                series: vec![Series {
                    label: "decode".into(),
                    points: vec![(1.0, 2.0), (4.0, 6.5), (16.0, 9.0)],
                }],
                reference: Some((8.0, "roofline".into())),
            },
            Panel {
                title: "empty".into(),
                ..Panel::default()
            },
        ];
        write_svg(&path, "a report", &panels).expect("writes");
        let svg = std::fs::read_to_string(&path).expect("reads");
        for needle in [
            "a report", "tokens/s", "decode", "roofline", "batch", "<svg",
        ] {
            assert!(svg.contains(needle), "missing {needle}");
        }
    }

    #[test]
    fn ranges_cover_points_and_reference() {
        let p = Panel {
            series: vec![Series {
                label: "a".into(),
                points: vec![(2.0, 3.0), (8.0, f64::NAN), (4.0, 1.0)],
            }],
            reference: Some((5.0, "r".into())),
            log_x: true,
            ..Panel::default()
        };
        let ((x0, x1), (y0, y1)) = ranges(&p);
        assert_eq!((x0, x1, y0), (2.0, 4.0, 0.0));
        assert!(y1 >= 5.0);
    }
}
