//! Output: the aligned tables printed per workload, the ratio sheets most workloads print
//! (a row per subject, ratio columns against each peer), and the CSV written at the end.

use std::fmt::Write as _;
use std::path::Path;

use crate::peers::Subject;

/// A printed table: a title, a header row, rows, and notes under it.
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    /// An empty table with these headers.
    pub fn new(title: impl Into<String>, header: &[&str]) -> Self {
        Self {
            title: title.into(),
            header: header.iter().map(|cell| cell.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row of cells.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Adds a note line under the table.
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// The first column left-aligned (names), the rest right-aligned (numbers).
    pub fn render(&self) -> String {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max();
        let mut widths = vec![0; columns.unwrap_or(0)];
        for row in self.rows.iter().chain([&self.header]) {
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
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A figure with `digits` decimals; whole numbers grouped by thousands; `n/a` for none.
pub fn figure(value: Option<f64>, digits: usize) -> String {
    match value {
        None => "n/a".to_string(),
        Some(v) if digits == 0 && v >= 0.0 && v.is_finite() => thousands(v.round() as u64),
        Some(v) => format!("{v:.digits$}"),
    }
}

/// A column of a [`Sheet`]: its header, its CSV metric and unit, its decimals, and whether
/// rows get ratios against the peers on it.
pub struct Col {
    header: String,
    metric: &'static str,
    unit: &'static str,
    digits: usize,
    higher_is_better: bool,
    ratios: bool,
}

impl Col {
    /// A figure where lower is better (a cost), without ratio columns.
    pub fn new(
        header: impl Into<String>,
        metric: &'static str,
        unit: &'static str,
        digits: usize,
    ) -> Self {
        Self {
            header: header.into(),
            metric,
            unit,
            digits,
            higher_is_better: false,
            ratios: false,
        }
    }

    /// The same column, for a figure where higher is better (a rate).
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

/// One row of a [`Sheet`]: a subject at a thread count, its figures in column order.
pub struct Row {
    /// The first cell and the CSV's subject.
    pub name: String,
    pub subject: Subject,
    pub threads: usize,
    pub values: Result<Vec<Option<f64>>, String>,
}

/// A workload's table and CSV rows from one set of figures: a row per subject (and thread
/// count), a column per figure, and ratio columns against every peer (every subject that is
/// not corewheel's) at the same thread count.
pub struct Sheet {
    pub workload: String,
    pub title: String,
    /// The CSV's `timers` column.
    pub timers: u64,
    pub cols: Vec<Col>,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// The column (a cost) whose 1-thread figure gives each row a "vs own 1 thread" column.
    pub scaling: Option<usize>,
}

impl Sheet {
    /// An empty sheet.
    pub fn new(
        workload: impl Into<String>,
        title: impl Into<String>,
        timers: u64,
        cols: Vec<Col>,
    ) -> Self {
        Self {
            workload: workload.into(),
            title: title.into(),
            timers,
            cols,
            rows: Vec::new(),
            notes: Vec::new(),
            scaling: None,
        }
    }

    /// Adds a row named after its subject (with the thread count when `with_threads`).
    pub fn add(
        &mut self,
        subject: Subject,
        threads: usize,
        with_threads: bool,
        values: Result<Vec<Option<f64>>, String>,
    ) {
        let name = if with_threads {
            format!("{}, {threads}", subject.name())
        } else {
            subject.name().to_string()
        };
        self.rows.push(Row {
            name,
            subject,
            threads,
            values,
        });
    }

    /// Adds a note under the table.
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    fn peers(&self) -> Vec<Subject> {
        let mut peers: Vec<Subject> = Vec::new();
        for row in &self.rows {
            if !row.subject.is_corewheel() && !peers.contains(&row.subject) {
                peers.push(row.subject);
            }
        }
        if self
            .rows
            .iter()
            .all(|row| row.subject == self.rows[0].subject)
        {
            peers.clear();
        }
        peers
    }

    fn value(&self, row: &Row, col: usize) -> Option<f64> {
        row.values.as_ref().ok()?.get(col).copied().flatten()
    }

    /// How many times better `row` is than `other` on `col`.
    fn ratio(&self, row: &Row, other: &Row, col: usize) -> Option<f64> {
        let (this, that) = (self.value(row, col)?, self.value(other, col)?);
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
    pub fn finish(self, csv: &mut Csv) {
        let peers = self.peers();
        let ratio_cols: Vec<usize> = (0..self.cols.len())
            .filter(|&c| self.cols[c].ratios)
            .collect();
        let mut header: Vec<String> = vec![if self.rows.iter().any(|r| r.name.contains(", ")) {
            "subject, threads".to_string()
        } else {
            "subject".to_string()
        }];
        header.extend(self.cols.iter().map(|col| col.header.clone()));
        for &col in &ratio_cols {
            for peer in &peers {
                header.push(match ratio_cols.len() {
                    1 => format!("vs {}", peer.name()),
                    _ => format!("vs {} {}", peer.name(), self.cols[col].header),
                });
            }
        }
        if self.scaling.is_some() {
            header.push("vs own 1 thread".to_string());
        }
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut table = Table::new(&self.title, &header);
        let mut errors = Vec::new();
        for row in &self.rows {
            let Ok(values) = &row.values else {
                table.row(vec![row.name.clone(), "error".to_string()]);
                errors.push(format!(
                    "ERROR: {}: {}",
                    row.name,
                    row.values.as_ref().err().map_or("", String::as_str)
                ));
                continue;
            };
            let mut cells = vec![row.name.clone()];
            cells.extend(
                self.cols
                    .iter()
                    .zip(values)
                    .map(|(col, &v)| figure(v, col.digits)),
            );
            let mut put = |metric: &'static str, value: f64, unit: &'static str| {
                csv.push(CsvRow {
                    workload: self.workload.clone(),
                    subject: row.name.clone(),
                    threads: row.threads as u32,
                    timers: self.timers,
                    metric,
                    value,
                    unit,
                });
            };
            for (col, value) in self.cols.iter().zip(values) {
                if let Some(value) = value {
                    put(col.metric, *value, col.unit);
                }
            }
            for (i, &col) in ratio_cols.iter().enumerate() {
                for peer in &peers {
                    let ratio = self
                        .find(*peer, row.threads)
                        .and_then(|other| self.ratio(row, other, col));
                    cells.push(match ratio {
                        _ if row.subject == *peer => "-".to_string(),
                        Some(ratio) => format!("{ratio:.2}x"),
                        None => "n/a".to_string(),
                    });
                    if let (0, true, Some(ratio), Some(metric)) =
                        (i, row.subject.is_corewheel(), ratio, peer.ratio_metric())
                    {
                        put(metric, ratio, "x");
                    }
                }
            }
            if let Some(col) = self.scaling {
                let one = self.find(row.subject, 1).filter(|_| row.threads > 1);
                let scaling = one.and_then(|one| self.ratio(row, one, col));
                cells.push(match scaling {
                    _ if row.threads == 1 => "-".to_string(),
                    Some(s) => format!("{s:.2}x"),
                    None => "n/a".to_string(),
                });
                if let Some(scaling) = scaling {
                    put("scaling_vs_1_thread", scaling, "x");
                }
            }
            table.row(cells);
        }
        for note in self.notes.iter().chain(&errors) {
            table.note(note.clone());
        }
        if !peers.is_empty() && !ratio_cols.is_empty() {
            table.note(RATIO_LEGEND);
        }
        if self.scaling.is_some() {
            table.note("vs own 1 thread = the subject's 1-thread figure / this row's: above 1 means more threads got more done");
        }
        table.print();
    }
}

/// One CSV row: `workload,subject,threads,timers,metric,value,unit`.
pub struct CsvRow {
    pub workload: String,
    pub subject: String,
    pub threads: u32,
    pub timers: u64,
    pub metric: &'static str,
    pub value: f64,
    pub unit: &'static str,
}

/// The results of the whole run, written as CSV once every workload has finished.
#[derive(Default)]
pub struct Csv {
    rows: Vec<CsvRow>,
}

impl Csv {
    /// Adds a row.
    pub fn push(&mut self, row: CsvRow) {
        self.rows.push(row);
    }

    /// Every row so far, in the order pushed.
    pub fn rows(&self) -> &[CsvRow] {
        &self.rows
    }

    /// Several metrics of one subject in one workload, on one thread.
    pub fn push_metrics(
        &mut self,
        workload: &str,
        subject: &str,
        timers: u64,
        metrics: &[(&'static str, f64, &'static str)],
    ) {
        for &(metric, value, unit) in metrics {
            self.push(CsvRow {
                workload: workload.to_string(),
                subject: subject.to_string(),
                threads: 1,
                timers,
                metric,
                value,
                unit,
            });
        }
    }

    /// Writes the CSV beside `path` and renames it into place, so that a run stopped halfway
    /// never leaves a truncated file where scripts expect a complete one.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let partial = path.with_extension("csv.tmp");
        let failed =
            |error: &dyn std::fmt::Display| format!("could not write {}: {error}", path.display());
        let mut out = csv::Writer::from_path(&partial).map_err(|e| failed(&e))?;
        out.write_record([
            "workload", "subject", "threads", "timers", "metric", "value", "unit",
        ])
        .map_err(|e| failed(&e))?;
        for row in &self.rows {
            let (threads, timers, value) = (
                row.threads.to_string(),
                row.timers.to_string(),
                row.value.to_string(),
            );
            out.write_record([
                &row.workload,
                &row.subject,
                &threads,
                &timers,
                row.metric,
                &value,
                row.unit,
            ])
            .map_err(|e| failed(&e))?;
        }
        out.flush().map_err(|e| failed(&e))?;
        std::fs::rename(&partial, path).map_err(|e| failed(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::{Col, Csv, Sheet, Table, figure, thousands};
    use crate::peers::Subject;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(20_000_000), "20,000,000");
        assert_eq!(figure(Some(1234.4), 0), "1,234");
        assert_eq!(figure(None, 1), "n/a");
    }

    #[test]
    fn table_aligns_columns() {
        let mut table = Table::new("t", &["subject", "ns/op"]);
        table.row(vec!["corewheel".into(), "1.5".into()]);
        table.row(vec!["x".into(), "100.25".into()]);
        assert_eq!(
            table.render(),
            "t\nsubject     ns/op\ncorewheel     1.5\nx          100.25\n"
        );
    }

    /// Ratios read as how many times better the row is, for costs and rates alike; the
    /// CSV gets every figure and corewheel's ratios, and scaling against one thread.
    #[test]
    fn sheets_compute_ratios_and_csv_rows() {
        let cols = vec![
            Col::new("ns", "ns_per_op", "ns", 1).ratios(),
            Col::new("M/s", "mops_per_s", "M/s", 2).rate(),
        ];
        let mut sheet = Sheet::new("w", "title", 10, cols);
        sheet.scaling = Some(0);
        sheet.add(Subject::Engine, 1, true, Ok(vec![Some(10.0), Some(100.0)]));
        sheet.add(Subject::TokioSleep, 1, true, Ok(vec![Some(30.0), None]));
        sheet.add(Subject::Engine, 2, true, Ok(vec![Some(5.0), Some(200.0)]));
        sheet.add(Subject::TokioSleep, 2, true, Err("broke".into()));
        assert_eq!(sheet.ratio(&sheet.rows[0], &sheet.rows[1], 0), Some(3.0));
        let mut csv = Csv::default();
        sheet.finish(&mut csv);
        let metrics: Vec<(&str, &str, u32, f64)> = csv
            .rows()
            .iter()
            .map(|r| (r.subject.as_str(), r.metric, r.threads, r.value))
            .collect();
        assert!(metrics.contains(&("engine, 1", "vs_tokio_sleep", 1, 3.0)));
        assert!(metrics.contains(&("engine, 2", "scaling_vs_1_thread", 2, 2.0)));
        assert!(!metrics.iter().any(|m| m.0 == "tokio-sleep, 2"));
    }
}
