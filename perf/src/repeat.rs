//! Repeated runs and their median.
//!
//! On a small virtual machine one run of a cache-missing workload can be several times slower
//! than the next, depending on whether the kernel backed the structure with transparent huge
//! pages and on what the neighbours are doing. Each measurement is therefore made a few
//! times, the subjects taking turns so that a slow spell hits them alike, and the tables show
//! the median with the spread beside it.

use crate::peers::Subject;

/// Runs per subject and measurement.
pub const RUNS: usize = 3;

/// Measures every subject `RUNS` times, in turns: all subjects once, then all again. A
/// subject whose measurement fails once counts as failed.
pub fn in_turns<R>(
    subjects: &[Subject],
    mut measure: impl FnMut(Subject, usize) -> Result<R, String>,
) -> Vec<Result<Vec<R>, String>> {
    let mut results: Vec<Result<Vec<R>, String>> = subjects
        .iter()
        .map(|_| Ok(Vec::with_capacity(RUNS)))
        .collect();
    for run in 0..RUNS {
        for (subject, result) in subjects.iter().zip(results.iter_mut()) {
            let Ok(runs) = result else { continue };
            match measure(*subject, run) {
                Ok(value) => runs.push(value),
                Err(error) => *result = Err(error),
            }
        }
    }
    results
}

/// The median, the middle run's value (the upper middle for an even count); `NaN` when
/// there is none.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().collect();
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `min-max` of the values, for the notes under a table.
pub fn spread(values: impl IntoIterator<Item = f64>) -> String {
    let (min, max) = values
        .into_iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(min, max), value| {
            (min.min(value), max.max(value))
        });
    format!("{min:.1}-{max:.1}")
}

#[cfg(test)]
mod tests {
    use super::{median, spread};

    #[test]
    fn median_and_spread() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0]), 4.0);
        assert!(median([]).is_nan());
        assert_eq!(spread([3.0, 1.24, 2.0]), "1.2-3.0");
    }
}
