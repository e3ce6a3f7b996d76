//! SVG plots of a run, written beside its CSV: throughput against application threads for every subject of each
//! engine workload (read back from the CSV rows, so a plot shows exactly the figures the CSV holds), and the fire
//! storm's lateness CDF per subject.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::Csv;

/// The CSV metrics that are a throughput, in millions of units a second, and their axis labels.
const THROUGHPUT_METRICS: [(&str, &str); 2] = [
    ("mtimers_per_s", "million timers / s"),
    ("mresets_per_s", "million resets / s"),
];

const SIZE: (u32, u32) = (760, 460);

/// What the run gathered for plots that the CSV does not hold in full: per fire-storm subject, its lateness CDF as
/// (lateness in milliseconds, share of timers at or below it).
#[derive(Default)]
pub struct Plots(Vec<Series>);

/// One line of a plot: its name and points.
type Series = (String, Vec<(f64, f64)>);

/// Each subject's (threads, throughput) points.
type BySubject<'a> = BTreeMap<&'a str, Vec<(f64, f64)>>;

impl Plots {
    pub fn add_lateness(&mut self, subject: &str, cdf: Vec<(f64, f64)>) {
        if !cdf.is_empty() {
            let in_ms = cdf.into_iter().map(|(us, q)| (us / 1e3, q));
            self.0.push((subject.to_string(), in_ms.collect()));
        }
    }

    /// Draws every plot the run has data for into `dir`, each titled with `machine`, and returns the files written.
    pub fn write(&self, csv: &Csv, dir: &Path, machine: &str) -> Result<Vec<PathBuf>, String> {
        let mut written = Vec::new();
        for (workload, y_label, series) in throughput_series(csv) {
            let path = dir.join(format!("{workload}.svg"));
            let title = format!("{workload}: throughput against threads ({machine})");
            let labels = (title.as_str(), "application threads", y_label);
            line_chart(&path, labels, &series, true)?;
            written.push(path);
        }
        if !self.0.is_empty() {
            let path = dir.join("fire-storm-lateness.svg");
            let title = format!("fire-storm: lateness CDF ({machine})");
            let y_label = "share of timers fired at most this late";
            let labels = (title.as_str(), "lateness, ms", y_label);
            line_chart(&path, labels, &self.0, false)?;
            written.push(path);
        }
        Ok(written)
    }
}

/// Per engine or async workload with a throughput metric: its axis label and a series per subject by threads.
fn throughput_series(csv: &Csv) -> Vec<(String, &'static str, Vec<Series>)> {
    let mut by_workload: BTreeMap<&str, (&'static str, BySubject)> = BTreeMap::new();
    for row in &csv.rows {
        let label = THROUGHPUT_METRICS.iter().find(|(m, _)| *m == row.metric);
        // The single-thread workloads run at one thread count only.
        let threaded = row.workload.starts_with("engine-") || row.workload.starts_with("async-");
        let Some(&(_, label)) =
            label.filter(|_| threaded && row.threads > 0 && row.value.is_finite())
        else {
            continue;
        };
        let entry = by_workload.entry(&row.workload);
        let (_, subjects) = entry.or_insert((label, BTreeMap::new()));
        let points = subjects.entry(&row.subject).or_default();
        points.push((f64::from(row.threads), row.value));
    }
    let sorted = |(name, mut points): (&str, Vec<(f64, f64)>)| {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        (name.to_string(), points)
    };
    let plot = |(workload, (label, subjects)): (&str, (_, BySubject))| {
        let series = subjects.into_iter().map(sorted).collect();
        (workload.to_string(), label, series)
    };
    by_workload.into_iter().map(plot).collect()
}

/// A line chart of `series`, with a legend; `marks` puts a dot on every point (a few measured points).
fn line_chart(
    path: &Path,
    labels: (&str, &str, &str),
    series: &[Series],
    marks: bool,
) -> Result<(), String> {
    use SeriesLabelPosition::{LowerRight, UpperLeft};
    let (title, x_label, y_label) = labels;
    let failed = |error: &dyn std::fmt::Display| format!("plot {}: {error}", path.display());
    let points = series.iter().flat_map(|s| s.1.iter());
    let (x_min, x_max, y_max) = points.fold(
        (f64::INFINITY, f64::NEG_INFINITY, 0.0_f64),
        |(x_min, x_max, y_max), &(x, y)| (x_min.min(x), x_max.max(x), y_max.max(y)),
    );
    if !x_min.is_finite() {
        return Ok(());
    }
    let x_range = match marks {
        true => (x_min - 0.25).max(0.0)..x_max + 0.25,
        false => 0.0..x_max.max(1e-3) * 1.02,
    };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range, 0.0..y_max.max(1e-9) * 1.1)
        .map_err(|e| failed(&e))?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_label).y_desc(y_label);
    if marks {
        // Thread counts are whole numbers: one label per count, none in between.
        mesh.x_labels((x_max - x_min) as usize + 1)
            .x_label_formatter(&|x| format!("{x:.0}"));
    }
    mesh.draw().map_err(|e| failed(&e))?;
    for (index, line) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let style = ShapeStyle::from(color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(line.1.iter().copied(), style))
            .map_err(|e| failed(&e))?
            .label(line.0.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        if marks {
            let dots = line.1.iter().map(|&p| Circle::new(p, 4, color.filled()));
            chart.draw_series(dots).map_err(|e| failed(&e))?;
        }
    }
    chart
        .configure_series_labels()
        .position(if marks { UpperLeft } else { LowerRight })
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| failed(&e))?;
    root.present().map_err(|e| failed(&e))
}

/// The machine in a few words, for plot titles: its CPU model where known, and the CPUs this process may use.
pub fn machine() -> String {
    let cpus = crate::peers::engine::cpus();
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info.lines().find_map(|l| l.strip_prefix("model name"));
    match model.and_then(|rest| rest.split_once(':')) {
        Some((_, model)) => format!("{cpus} CPUs, {}", model.trim()),
        None => format!("{cpus} CPUs"),
    }
}

#[cfg(test)]
mod tests {
    use super::{Plots, throughput_series};
    use crate::report::Csv;

    /// The throughput plots take each engine workload's throughput rows, a line per subject in thread order, and
    /// leave every other metric out; the files are SVG with the subjects named in them.
    #[test]
    fn throughput_lines_come_from_the_csv() {
        let mut csv = Csv::default();
        for (workload, subject, threads, metric, value) in [
            ("engine-reset", "engine", 2, "mresets_per_s", 50.0),
            ("engine-reset", "engine", 1, "mresets_per_s", 17.0),
            ("engine-reset", "tokio-sleep", 1, "mresets_per_s", 8.0),
            ("engine-reset", "engine", 1, "ns_per_reset", 58.0),
            ("reset-heavy", "corewheel", 1, "mresets_per_s", 58.0),
        ] {
            csv.push_metrics(workload, subject, (threads, 1), &[(metric, value, "M/s")]);
        }
        let plots = throughput_series(&csv);
        let (workload, _, series) = &plots[0];
        let first = (plots.len(), workload.as_str(), series[0].0.as_str());
        assert_eq!(first, (1, "engine-reset", "engine"));
        let points = (&series[0].1[..], &series[1].1[..]);
        assert_eq!(points, (&[(1.0, 17.0), (2.0, 50.0)][..], &[(1.0, 8.0)][..]));
        let dir = std::env::temp_dir().join(format!("corewheel-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let mut extra = Plots::default();
        extra.add_lateness("corewheel", vec![(0.0, 0.0), (700.0, 0.5), (1500.0, 1.0)]);
        let written = extra.write(&csv, &dir, "test machine").expect("plots");
        let read = |path: &std::path::PathBuf| std::fs::read_to_string(path).expect("written");
        let svgs: Vec<String> = written.iter().map(read).collect();
        assert!(svgs.len() == 2 && svgs.iter().all(|svg| svg.starts_with("<svg")));
        assert!(svgs[0].contains("tokio-sleep") && svgs[0].contains("test machine"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
