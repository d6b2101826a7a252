//! Medians, per-variant summaries and the result table.

use std::fmt::Write as _;

/// The median of `values` (mean of the two middle values for an even count); `None` if
/// empty. NaNs sort last.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One measurement: the throughput of `variant` at `mtu` in round `round`.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Variant name (e.g. `"tcp"`).
    pub variant: String,
    /// IP MTU in bytes.
    pub mtu: usize,
    /// Round number: in each round every variant runs once, in turn (A B A B).
    pub round: usize,
    /// Throughput in Gbit/s.
    pub gbit_per_s: f64,
    /// CPU-normalized throughput: Gbit moved per CPU-second of the busier process (both
    /// processes pinned to a core each, this is what the run would reach with that core
    /// to itself; robust when other processes compete for the cores).
    pub gbit_per_cpu_s: f64,
}

/// The summary of one variant at one MTU.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Variant name.
    pub variant: String,
    /// IP MTU in bytes.
    pub mtu: usize,
    /// Number of runs.
    pub runs: usize,
    /// Median Gbit/s.
    pub median: f64,
    /// Lowest Gbit/s.
    pub min: f64,
    /// Highest Gbit/s.
    pub max: f64,
    /// Median CPU-normalized Gbit/s ([`Measurement::gbit_per_cpu_s`]).
    pub cpu_median: f64,
    /// Median of this variant / median of the baseline at the same MTU.
    pub ratio_of_medians: Option<f64>,
    /// Median over rounds of (this variant / baseline) within the same round: the
    /// side-by-side ratio, robust to drift between rounds.
    pub paired_ratio: Option<f64>,
    /// The same paired ratio over the CPU-normalized figures.
    pub cpu_paired_ratio: Option<f64>,
}

/// Summarizes `data` per (MTU, variant), in order of first appearance, with ratios to
/// `baseline` (a variant name).
pub fn summarize(data: &[Measurement], baseline: &str) -> Vec<Summary> {
    let mut keys: Vec<(usize, String)> = Vec::new();
    for m in data {
        let k = (m.mtu, m.variant.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let values = |mtu: usize, variant: &str| -> Vec<&Measurement> {
        data.iter()
            .filter(|m| m.mtu == mtu && m.variant == variant)
            .collect()
    };
    keys.into_iter()
        .map(|(mtu, variant)| {
            let mine = values(mtu, &variant);
            let rates: Vec<f64> = mine.iter().map(|m| m.gbit_per_s).collect();
            let base = values(mtu, baseline);
            let base_rates: Vec<f64> = base.iter().map(|m| m.gbit_per_s).collect();
            let med = median(&rates).unwrap_or(0.0);
            let ratio_of_medians = median(&base_rates).filter(|b| *b > 0.0).map(|b| med / b);
            let paired = |f: fn(&Measurement) -> f64| -> Option<f64> {
                let pairs: Vec<f64> = mine
                    .iter()
                    .filter_map(|m| {
                        base.iter()
                            .find(|b| b.round == m.round && f(b) > 0.0)
                            .map(|b| f(m) / f(b))
                    })
                    .collect();
                median(&pairs)
            };
            let cpu: Vec<f64> = mine.iter().map(|m| m.gbit_per_cpu_s).collect();
            Summary {
                runs: rates.len(),
                median: med,
                min: rates.iter().copied().fold(f64::INFINITY, f64::min),
                max: rates.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                cpu_median: median(&cpu).unwrap_or(0.0),
                ratio_of_medians,
                paired_ratio: paired(|m| m.gbit_per_s),
                cpu_paired_ratio: paired(|m| m.gbit_per_cpu_s),
                variant,
                mtu,
            }
        })
        .collect()
}

/// The summaries as a plain-text table (also valid Markdown).
pub fn table(rows: &[Summary], baseline: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| MTU | variant | runs | median Gbit/s | min | max | / {baseline} (medians) | / {baseline} (paired) | CPU-normalized Gbit/s | / {baseline} (CPU-normalized, paired) |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let pct = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0));
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {:.2} | {} |",
            r.mtu,
            r.variant,
            r.runs,
            r.median,
            r.min,
            r.max,
            pct(r.ratio_of_medians),
            pct(r.paired_ratio),
            r.cpu_median,
            pct(r.cpu_paired_ratio)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(variant: &str, mtu: usize, round: usize, g: f64) -> Measurement {
        Measurement {
            variant: variant.into(),
            mtu,
            round,
            gbit_per_s: g,
            gbit_per_cpu_s: 2.0 * g,
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn summaries_and_ratios() {
        let data = vec![
            m("tcp", 1500, 0, 4.0),
            m("fpdu", 1500, 0, 3.0),
            m("tcp", 1500, 1, 2.0),
            m("fpdu", 1500, 1, 2.0),
            m("tcp", 1500, 2, 3.0),
            m("fpdu", 1500, 2, 2.4),
            m("tcp", 9000, 0, 10.0),
        ];
        let s = summarize(&data, "tcp");
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].mtu, s[0].variant.as_str()), (1500, "tcp"));
        assert_eq!(s[0].median, 3.0);
        assert_eq!(s[0].ratio_of_medians, Some(1.0));
        assert_eq!(s[1].variant, "fpdu");
        assert_eq!(s[1].runs, 3);
        assert_eq!((s[1].min, s[1].max, s[1].median), (2.0, 3.0, 2.4));
        assert!((s[1].ratio_of_medians.unwrap() - 0.8).abs() < 1e-12);
        // Per-round ratios 0.75, 1.0, 0.8 -> median 0.8.
        assert!((s[1].paired_ratio.unwrap() - 0.8).abs() < 1e-12);
        assert!((s[1].cpu_paired_ratio.unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(s[1].cpu_median, 4.8);
        assert_eq!(s[2].mtu, 9000);
        let t = table(&s, "tcp");
        assert!(
            t.contains("| 1500 | fpdu | 3 | 2.40 | 2.00 | 3.00 | 80.0% | 80.0% | 4.80 | 80.0% |"),
            "{t}"
        );
        assert_eq!(t.lines().count(), 5);
    }
}
