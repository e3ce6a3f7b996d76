//! Output: the aligned tables printed per workload and the CSV written at the end.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;

/// One workload's table: a title, a header row, one row per subject, and notes under it.
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[&str]) -> Self {
        Self {
            title: title.into(),
            header: header.iter().map(|cell| cell.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn header_cell(&mut self, cell: impl Into<String>) {
        self.header.push(cell.into());
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

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
            .max()
            .unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in self.rows.iter().chain([&self.header]) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.title);
        for row in [&self.header].into_iter().chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map_or("", String::as_str);
                if i == 0 {
                    let _ = write!(line, "{cell:<width$}");
                } else {
                    let _ = write!(line, "  {cell:>width$}");
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        for note in &self.notes {
            let _ = writeln!(out, "  {note}");
        }
        out
    }

    pub fn print(&self) {
        crate::progress::print(&self.render());
    }
}

/// The ratio cells of one row: for each of `columns`, `cost[column] / cost[row]`, so a value
/// above 1 means the row's subject is that many times faster than the column's. `costs` are
/// lower-is-better, such as ns per operation.
pub fn ratio_cells(costs: &[Option<f64>], row: usize, columns: &[usize]) -> Vec<String> {
    columns
        .iter()
        .map(|&column| match (costs[row], costs[column]) {
            _ if column == row => "-".to_string(),
            (Some(this), Some(that)) if this > 0.0 => format!("{:.2}x", that / this),
            _ => "n/a".to_string(),
        })
        .collect()
}

/// The legend line under every table that has ratio columns.
pub const RATIO_LEGEND: &str = "vs X = X's cost / this row's cost: above 1 means this row is faster than X (on corewheel's row: how many times faster corewheel is)";

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

/// Bytes as MiB with one decimal, signed: RSS can end lower than where it started.
pub fn mib(bytes: i64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
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
    pub fn push(&mut self, row: CsvRow) {
        self.rows.push(row);
    }

    /// Every row so far, in the order pushed.
    pub fn rows(&self) -> &[CsvRow] {
        &self.rows
    }

    /// Several metrics of one subject in one workload.
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
    pub fn write(&self, path: &Path) -> io::Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let mut out = String::from("workload,subject,threads,timers,metric,value,unit\n");
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{}",
                row.workload, row.subject, row.threads, row.timers, row.metric, row.value, row.unit
            );
        }
        let partial = path.with_extension("csv.tmp");
        fs::write(&partial, out)?;
        fs::rename(&partial, path)
    }
}

#[cfg(test)]
mod tests {
    use super::{Table, ratio_cells, thousands};

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(20_000_000), "20,000,000");
    }

    #[test]
    fn ratios_read_as_how_much_faster_the_row_is() {
        let costs = [Some(10.0), Some(30.0), None];
        assert_eq!(ratio_cells(&costs, 0, &[0, 1, 2]), ["-", "3.00x", "n/a"]);
        assert_eq!(ratio_cells(&costs, 1, &[0, 1, 2]), ["0.33x", "-", "n/a"]);
        assert_eq!(ratio_cells(&costs, 0, &[2, 1]), ["n/a", "3.00x"]);
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
}
