//! Output: the aligned tables printed per workload, the sheets most workloads print (a row per subject, ratio columns
//! against each peer), and the CSV written at the end.

use std::fmt::Write as _;
use std::path::Path;

use crate::peers::Subject;

/// A printed table: a title, a header row, rows, and notes under it.
#[derive(Default)]
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[impl ToString]) -> Self {
        Self {
            title: title.into(),
            header: header.iter().map(ToString::to_string).collect(),
            ..Self::default()
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// The first column left-aligned (names), the rest right-aligned (numbers).
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = Vec::new();
        for row in self.rows.iter().chain([&self.header]) {
            widths.resize(widths.len().max(row.len()), 0);
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = format!("{}\n", self.title);
        for row in [&self.header].into_iter().chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                let _ = match i {
                    0 => write!(line, "{cell:<width$}"),
                    _ => write!(line, "  {cell:>width$}"),
                };
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        for note in &self.notes {
            let _ = writeln!(out, "  {note}");
        }
        out
    }

    /// Prints the table through the runner, which keeps it for the summary.
    pub fn print(&self) {
        crate::runner::print(&self.render());
    }
}

/// The legend line under every table that has ratio columns.
pub const RATIO_LEGEND: &str = "vs X = how many times better this row is than X's on that figure (X's cost / this row's, or this row's rate / X's): above 1 means this row is better";

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string().into_bytes();
    let groups = digits.rchunks(3).rev().map(String::from_utf8_lossy);
    groups.collect::<Vec<_>>().join(",")
}

/// A figure with `digits` decimals; whole numbers grouped by thousands; `n/a` for none.
pub fn figure(value: Option<f64>, digits: usize) -> String {
    match value {
        None => "n/a".to_string(),
        Some(v) if digits == 0 && v >= 0.0 && v.is_finite() => thousands(v.round() as u64),
        Some(v) => format!("{v:.digits$}"),
    }
}

/// A column of a [`Sheet`]: its header, CSV metric and unit, decimals, whether higher is better (a rate), and whether
/// rows get ratios against the peers on it.
pub struct Col {
    header: String,
    metric: String,
    unit: &'static str,
    digits: usize,
    higher_is_better: bool,
    ratios: bool,
}

impl Col {
    /// A cost column, without ratios.
    pub fn new(
        header: impl Into<String>,
        metric: impl Into<String>,
        unit: &'static str,
        digits: usize,
    ) -> Self {
        Self {
            header: header.into(),
            metric: metric.into(),
            unit,
            digits,
            higher_is_better: false,
            ratios: false,
        }
    }

    /// The same column, for a figure where higher is better.
    pub fn rate(mut self) -> Self {
        self.higher_is_better = true;
        self
    }

    /// The same column, with a ratio column against each peer.
    pub fn ratios(mut self) -> Self {
        self.ratios = true;
        self
    }
}

/// One row of a [`Sheet`]: its name (the CSV's subject), a subject at a thread count, its figures in column order.
pub struct Row {
    pub name: String,
    pub subject: Subject,
    pub threads: usize,
    pub values: Values,
}

/// A row's figures in column order, or why it has none.
pub type Values = Result<Vec<Option<f64>>, String>;

/// A workload's table and CSV rows: a row per subject (and thread count), a column per figure, and ratio columns
/// against every peer at the same thread count; `scaling` names the cost column that gives "vs own 1 thread".
#[derive(Default)]
pub struct Sheet {
    pub workload: String,
    pub title: String,
    pub timers: u64,
    pub cols: Vec<Col>,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    pub scaling: Option<usize>,
}

impl Sheet {
    pub fn new(workload: impl ToString, title: impl ToString, timers: u64, cols: Vec<Col>) -> Self {
        Self {
            workload: workload.to_string(),
            title: title.to_string(),
            timers,
            cols,
            ..Self::default()
        }
    }

    /// Adds a row named after its subject.
    pub fn add(&mut self, subject: Subject, threads: usize, values: Values) {
        self.push(subject.name(), subject, values);
        self.rows.last_mut().expect("pushed").threads = threads;
    }

    /// Adds a row of one thread named `name`.
    pub fn push(&mut self, name: &str, subject: Subject, values: Values) {
        let name = name.to_string();
        self.rows.push(Row {
            name,
            subject,
            threads: 1,
            values,
        });
    }

    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// How many times better `row` is than `other` on `col`.
    fn ratio(&self, row: &Row, other: &Row, col: usize) -> Option<f64> {
        let value = |row: &Row| row.values.as_ref().ok()?.get(col).copied().flatten();
        let (this, that) = (value(row)?, value(other)?);
        let ratio = if self.cols[col].higher_is_better {
            this / that
        } else {
            that / this
        };
        ratio.is_finite().then_some(ratio)
    }

    fn find(&self, subject: Subject, threads: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|row| row.subject == subject && row.threads == threads)
    }

    /// Prints the table and adds every figure, ratio and scaling to `csv`.
    pub fn finish(mut self, csv: &mut Csv) {
        let mut peers: Vec<Subject> = self.rows.iter().map(|row| row.subject).collect();
        peers.retain(|subject| !subject.is_corewheel());
        crate::cli::dedup(&mut peers);
        let first = self.rows.first().map(|row| row.subject);
        if self.rows.iter().all(|row| Some(row.subject) == first) {
            peers.clear();
        }
        let ratio_cols: Vec<usize> = (0..self.cols.len())
            .filter(|&c| self.cols[c].ratios)
            .collect();
        let threads = self.scaling.is_some();
        let suffix = if threads { ", threads" } else { "" };
        let mut header = vec![format!("subject{suffix}")];
        header.extend(self.cols.iter().map(|col| col.header.clone()));
        for &col in &ratio_cols {
            let what = match ratio_cols.len() {
                1 => String::new(),
                _ => format!(" {}", self.cols[col].header),
            };
            header.extend(peers.iter().map(|peer| format!("vs {}{what}", peer.name())));
        }
        header.extend(self.scaling.map(|_| "vs own 1 thread".to_string()));
        let mut table = Table::new(self.title.clone(), &header);
        let show = |same: bool, ratio: Option<f64>| match (same, ratio) {
            (true, _) => "-".to_string(),
            (false, ratio) => ratio.map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}x")),
        };
        for row in &self.rows {
            let values = match &row.values {
                Ok(values) => values,
                Err(error) => {
                    table.row(vec![row.name.clone(), "error".to_string()]);
                    self.notes.push(format!("ERROR: {}: {error}", row.name));
                    continue;
                }
            };
            let mut cells = vec![row.name.clone()];
            if threads {
                cells[0] = format!("{}, {}", row.name, row.threads);
            }
            let mut put = |metric: &str, value: f64, unit: &'static str| {
                let at = (row.threads, self.timers);
                csv.push_metrics(&self.workload, &row.name, at, &[(metric, value, unit)]);
            };
            for (col, value) in self.cols.iter().zip(values) {
                cells.push(figure(*value, col.digits));
                if let Some(value) = value {
                    put(&col.metric, *value, col.unit);
                }
            }
            for (i, &col) in ratio_cols.iter().enumerate() {
                for peer in &peers {
                    let other = self.find(*peer, row.threads);
                    let ratio = other.and_then(|other| self.ratio(row, other, col));
                    cells.push(show(row.subject == *peer, ratio));
                    let metric = peer
                        .ratio_metric()
                        .filter(|_| i == 0 && row.subject.is_corewheel());
                    if let (Some(ratio), Some(metric)) = (ratio, metric) {
                        put(&metric, ratio, "x");
                    }
                }
            }
            if let Some(col) = self.scaling {
                let one = self.find(row.subject, 1).filter(|_| row.threads > 1);
                let scaling = one.and_then(|one| self.ratio(row, one, col));
                cells.push(show(row.threads == 1, scaling));
                if let Some(scaling) = scaling {
                    put("scaling_vs_1_thread", scaling, "x");
                }
            }
            table.row(cells);
        }
        if !peers.is_empty() && !ratio_cols.is_empty() {
            self.notes.push(RATIO_LEGEND.to_string());
        }
        if self.scaling.is_some() {
            self.notes.push("vs own 1 thread = the subject's 1-thread figure / this row's: above 1 means more threads got more done".to_string());
        }
        table.notes = self.notes;
        table.print();
    }
}

/// One CSV row: `workload,subject,threads,timers,metric,value,unit`.
#[derive(serde::Serialize)]
pub struct CsvRow {
    pub workload: String,
    pub subject: String,
    pub threads: u32,
    pub timers: u64,
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
}

/// The results of the whole run, written as CSV once every workload has finished.
#[derive(Default)]
pub struct Csv {
    pub rows: Vec<CsvRow>,
}

impl Csv {
    /// Several metrics of one subject in one workload, at `threads` and `timers`.
    pub fn push_metrics(
        &mut self,
        workload: &str,
        subject: &str,
        (threads, timers): (usize, u64),
        metrics: &[(&str, f64, &'static str)],
    ) {
        for &(metric, value, unit) in metrics {
            self.rows.push(CsvRow {
                workload: workload.to_string(),
                subject: subject.to_string(),
                threads: threads as u32,
                timers,
                metric: metric.to_string(),
                value,
                unit,
            });
        }
    }

    /// Writes the CSV beside `path` and renames it into place, so that a run stopped halfway never leaves a truncated
    /// file where scripts expect a complete one.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let partial = path.with_extension("csv.tmp");
        let write = || -> Result<(), Box<dyn std::error::Error>> {
            let mut out = csv::Writer::from_path(&partial)?;
            self.rows.iter().try_for_each(|row| out.serialize(row))?;
            out.flush()?;
            Ok(std::fs::rename(&partial, path)?)
        };
        write().map_err(|error| format!("could not write {}: {error}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::{Col, Csv, Sheet, Table, figure, thousands};
    use crate::peers::Subject;

    #[test]
    fn numbers_and_tables_read_as_printed() {
        let grouped = (thousands(0), thousands(999), thousands(20_000_000));
        assert_eq!(grouped, ("0".into(), "999".into(), "20,000,000".into()));
        assert_eq!(
            (figure(Some(1234.4), 0), figure(None, 1)),
            ("1,234".into(), "n/a".into())
        );
        let mut table = Table::new("t", &["subject", "ns/op"]);
        table.row(vec!["corewheel".into(), "1.5".into()]);
        table.row(vec!["x".into(), "100.25".into()]);
        assert_eq!(
            table.render(),
            "t\nsubject     ns/op\ncorewheel     1.5\nx          100.25\n"
        );
    }

    /// Ratios read as how many times better the row is, for costs and rates alike; the CSV gets every figure and
    /// corewheel's ratios, and scaling against one thread.
    #[test]
    fn sheets_compute_ratios_and_csv_rows() {
        let cols = vec![
            Col::new("ns", "ns_per_op", "ns", 1).ratios(),
            Col::new("M/s", "mops_per_s", "M/s", 2).rate(),
        ];
        let mut sheet = Sheet::new("w", "title", 10, cols);
        sheet.scaling = Some(0);
        sheet.add(Subject::Engine, 1, Ok(vec![Some(10.0), Some(100.0)]));
        sheet.add(Subject::TokioSleep, 1, Ok(vec![Some(30.0), Some(20.0)]));
        sheet.add(Subject::Engine, 2, Ok(vec![Some(5.0), Some(200.0)]));
        sheet.add(Subject::TokioSleep, 2, Err("broke".into()));
        assert_eq!(sheet.ratio(&sheet.rows[0], &sheet.rows[1], 1), Some(5.0));
        let mut csv = Csv::default();
        sheet.finish(&mut csv);
        let rows: Vec<_> = csv
            .rows
            .iter()
            .map(|r| (r.subject.as_str(), r.metric.as_str(), r.value))
            .collect();
        assert!(rows.contains(&("engine", "vs_tokio_sleep", 3.0)));
        assert!(rows.contains(&("engine", "scaling_vs_1_thread", 2.0)));
        let tokio = rows.iter().filter(|m| m.0 == "tokio-sleep").count();
        assert_eq!(tokio, 2, "the 1-thread figures only");
    }
}
