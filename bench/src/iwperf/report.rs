//! iwperf's results and how they are printed: perftest's bandwidth table (`#bytes`,
//! `#iterations`, `BW peak`, `BW average`, `MsgRate`) and latency table (`t_min`,
//! `t_max`, `t_typical` = median, `t_avg`, `t_stdev`, 99% and 99.9% percentiles, in
//! microseconds), the demo's one table with the raw TCP baseline, and the JSON forms.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::wire::{Op, VerifyStatus};

/// The dashed rule perftest prints around its tables.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// Gbit/s for `bytes` in `seconds` (0 when `seconds` is not positive).
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds / 1e9
    } else {
        0.0
    }
}

/// One bandwidth measurement (the client's view, as perftest reports it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BwResult {
    /// The operation.
    pub op: Op,
    /// Message size in bytes.
    pub size: u32,
    /// Connections (QPs) that ran this operation.
    pub qps: usize,
    /// Data WRs completed, over all those QPs (perftest's `#iterations` counts per QP;
    /// this is the total).
    pub iterations: u64,
    /// Payload bytes moved: `iterations * size`.
    pub bytes: u64,
    /// Seconds from the first post to the last data completion.
    pub seconds: f64,
    /// Average Gbit/s: `bytes * 8 / seconds / 1e9`.
    pub gbps: f64,
    /// Highest Gbit/s over any 100 ms sampling interval of the run (perftest computes
    /// its peak from per-WR timestamps; ours is coarser and never below the average).
    pub peak_gbps: f64,
    /// Million messages per second: `iterations / seconds / 1e6`.
    pub mpps: f64,
    /// What the receiver's check of the data found.
    pub verify: VerifyStatus,
    /// Messages or slots that did not match (0 unless `verify` is `failed`).
    pub mismatches: u64,
    /// `true` if the run ended early (connection lost, device removed): the figures are
    /// what was done until then.
    pub partial: bool,
}

/// Latency statistics of a ping-pong run, in microseconds (perftest's `*_lat` columns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatStats {
    /// The operation.
    pub op: Op,
    /// Message size in bytes.
    pub size: u32,
    /// Round trips measured.
    pub iterations: u64,
    /// Lowest.
    pub t_min: f64,
    /// Highest.
    pub t_max: f64,
    /// Median (perftest's `t_typical`).
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation (population).
    pub t_stdev: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// 99.9th percentile (nearest rank).
    pub p999: f64,
    /// `true` if the run ended early.
    pub partial: bool,
}

/// The nearest-rank percentile `p` (0 < p <= 1) of sorted `v` (not empty).
fn nearest_rank(v: &[f64], p: f64) -> f64 {
    let rank = (p * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

impl LatStats {
    /// Statistics of `samples_ns` (one-way latencies in nanoseconds; perftest reports
    /// half the round trip for Send and Write ping-pong, the whole round trip for Read).
    /// `None` without samples.
    pub fn from_samples(op: Op, size: u32, samples_ns: &[u64]) -> Option<LatStats> {
        if samples_ns.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = samples_ns.iter().map(|&n| n as f64 / 1000.0).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len() as f64;
        let avg = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
        Some(LatStats {
            op,
            size,
            iterations: samples_ns.len() as u64,
            t_min: v[0],
            t_max: v[v.len() - 1],
            t_typical: crate::stats::median(&v).unwrap_or(0.0),
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: nearest_rank(&v, 0.99),
            p999: nearest_rank(&v, 0.999),
            partial: false,
        })
    }
}

/// perftest's bandwidth table for `rows` (with `--report_gbits`).
pub fn bw_table(rows: &[BwResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{RULE}");
    let _ = writeln!(
        s,
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    );
    for r in rows {
        let _ = writeln!(
            s,
            " {:<10} {:<14} {:<18.2} {:<20.2} {:.6}",
            r.size, r.iterations, r.peak_gbps, r.gbps, r.mpps
        );
    }
    let _ = writeln!(s, "{RULE}");
    s
}

/// perftest's latency table for `rows`.
pub fn lat_table(rows: &[LatStats]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{RULE}");
    let _ = writeln!(
        s,
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
    );
    for r in rows {
        let _ = writeln!(
            s,
            " {:<6} {:<14} {:<14.2} {:<12.2} {:<18.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
            r.size, r.iterations, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p999
        );
    }
    let _ = writeln!(s, "{RULE}");
    s
}

/// One row of the demo's table: an iWARP operation beside the raw TCP baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoRow {
    /// The operation.
    pub op: Op,
    /// Message size in bytes.
    pub size: u32,
    /// Median Gbit/s over the rounds.
    pub gbps: f64,
    /// Median million messages per second.
    pub mpps: f64,
    /// Median raw TCP Gbit/s of the same rounds.
    pub baseline_gbps: f64,
    /// Median over rounds of (this / raw TCP in the same round).
    pub ratio: f64,
    /// What the receiver's check found (the worst over the rounds).
    pub verify: VerifyStatus,
    /// Median over rounds of the same ratio with each side's throughput per CPU-second
    /// of its busier process (each peer is pinned to a core: what the run reaches when
    /// that core is its own; robust when other jobs share the machine). TAP mode only.
    #[serde(default)]
    pub cpu_ratio: Option<f64>,
}

/// The demo's latency row: 8-byte (by default) Send ping-pong beside raw TCP
/// ping-pong of the same size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoLatency {
    /// The iWARP ping-pong (statistics of the median round by `t_typical`).
    pub iwarp: LatStats,
    /// The raw TCP ping-pong of the same round.
    pub tcp: LatStats,
    /// Median over rounds of (iWARP `t_typical` / TCP `t_typical`).
    pub ratio: f64,
}

/// Everything the demo measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoReport {
    /// `"tap"` (two namespaces, TAPs, bridges), `"veth"` (two namespaces joined by one
    /// veth: host TCP alone) or `"memory"` (one process).
    pub link: String,
    /// IP MTU in bytes.
    pub mtu: usize,
    /// Rounds run (figures are medians over them).
    pub rounds: usize,
    /// Seconds per bandwidth run.
    pub seconds: f64,
    /// MPA CRC32c on.
    pub crc: bool,
    /// Median raw smoltcp TCP Gbit/s.
    pub baseline_tcp_gbps: f64,
    /// Median Gbit/s of kernel TCP between the two namespaces over the same bridges and
    /// veth (TAP mode; the absolute reference), `None` over a memory link.
    pub kernel_tcp_gbps: Option<f64>,
    /// TAP checksum and segmentation offload on.
    pub offload: bool,
    /// One row per operation.
    pub results: Vec<DemoRow>,
    /// The latency row, if measured.
    pub latency: Option<DemoLatency>,
    /// The soft device on the host's kernel TCP (`--netdev`) between the same two
    /// namespaces, against kernel TCP: one row per operation (`baseline_gbps` is
    /// [`DemoReport::kernel_tcp_gbps`] of the same rounds), empty when not measured.
    #[serde(default)]
    pub host_results: Vec<DemoRow>,
    /// Its Send ping-pong beside a kernel TCP ping-pong of the same size (`tcp`).
    #[serde(default)]
    pub host_latency: Option<DemoLatency>,
}

/// The label of a host-TCP row in the demo's table (`write (host TCP)`).
pub fn host_row_label(op: Op) -> String {
    format!("{} (host TCP)", op.name())
}

impl DemoReport {
    /// The demo's JSON object: `{"link", "mtu", "baseline_tcp_gbps",
    /// "results": [{"op", "size", "gbps", "mpps", "ratio", ...}], "latency_us": {...}}`.
    /// With host-TCP rows, `"host_tcp": {"results": [...], "latency_us": {...}}` in the
    /// same forms (the baseline is kernel TCP); `null` without.
    pub fn to_json(&self) -> serde_json::Value {
        let rows = |rows: &[DemoRow]| -> Vec<serde_json::Value> {
            rows.iter()
                .map(|r| {
                    serde_json::json!({
                        "op": r.op, "size": r.size, "gbps": r.gbps, "mpps": r.mpps,
                        "ratio": r.ratio, "baseline_gbps": r.baseline_gbps, "verify": r.verify,
                        "cpu_ratio": r.cpu_ratio,
                    })
                })
                .collect()
        };
        let lat = |l: &DemoLatency| {
            serde_json::json!({
                "op": l.iwarp.op, "size": l.iwarp.size, "iterations": l.iwarp.iterations,
                "t_min": l.iwarp.t_min, "t_typical": l.iwarp.t_typical, "t_avg": l.iwarp.t_avg,
                "t_max": l.iwarp.t_max, "p99": l.iwarp.p99, "p999": l.iwarp.p999,
                "baseline_tcp_typical": l.tcp.t_typical, "baseline_tcp_p99": l.tcp.p99,
                "ratio": l.ratio,
            })
        };
        let results = rows(&self.results);
        let latency = self.latency.as_ref().map(lat);
        let host_tcp = (!self.host_results.is_empty() || self.host_latency.is_some()).then(|| {
            serde_json::json!({
                "results": rows(&self.host_results),
                "latency_us": self.host_latency.as_ref().map(lat),
            })
        });
        serde_json::json!({
            "link": self.link,
            "mtu": self.mtu,
            "rounds": self.rounds,
            "seconds": self.seconds,
            "crc": self.crc,
            "baseline_tcp_gbps": self.baseline_tcp_gbps,
            "kernel_tcp_gbps": self.kernel_tcp_gbps,
            "offload": self.offload,
            "results": results,
            "latency_us": latency,
            "host_tcp": host_tcp,
        })
    }

    /// The human table: one row per operation with the baseline and the ratio, then the
    /// latency row.
    pub fn table(&self) -> String {
        let mut s = String::new();
        if self.link == "veth" {
            let _ = writeln!(
                s,
                "iWARP over a veth between two network namespaces (MTU {}, MPA CRC {}), medians of {} round(s) of {:.1} s",
                self.mtu,
                if self.crc { "on" } else { "off" },
                self.rounds,
                self.seconds
            );
        } else {
            let _ = writeln!(
                s,
                "iWARP over {} (MTU {}, MPA CRC {}, offload {}), medians of {} round(s) of {:.1} s; baseline: raw smoltcp TCP on the same path",
                if self.link == "tap" {
                    "TAPs in two network namespaces"
                } else {
                    "an in-memory link in one process"
                },
                self.mtu,
                if self.crc { "on" } else { "off" },
                if self.offload { "on" } else { "off" },
                self.rounds,
                self.seconds
            );
        }
        match (self.kernel_tcp_gbps, self.link.as_str()) {
            (Some(k), "veth") => {
                let _ = writeln!(
                    s,
                    "kernel TCP (veth): {k:.2} Gbit/s between the veth's two ends (the reference)"
                );
            }
            (Some(k), _) => {
                let _ = writeln!(
                    s,
                    "kernel TCP (veth): {k:.2} Gbit/s between the namespaces' bridges over the same veth (the absolute reference)"
                );
            }
            (None, _) => {}
        }
        let host = !self.host_results.is_empty() || self.host_latency.is_some();
        if host {
            let _ = writeln!(
                s,
                "host TCP rows: the soft device on the kernel's TCP (`--netdev`, the interfaces holding the kernel addresses, over the same veth); baseline: kernel TCP (veth)"
            );
        }
        // The op column fits the longest label (`op` alone without host-TCP rows).
        let w = if host {
            host_row_label(Op::Write).len()
        } else {
            5
        };
        let _ = writeln!(
            s,
            "| {:<w$} |    size | Gbit/s |   Mpps | baseline Gbit/s | ratio  | ratio, CPU-normalized | verify |",
            "op"
        );
        let _ = writeln!(
            s,
            "|-{}-|--------:|-------:|-------:|----------------:|-------:|----------------------:|--------|",
            "-".repeat(w)
        );
        let rows = self
            .results
            .iter()
            .map(|r| (r.op.name().to_owned(), r))
            .chain(self.host_results.iter().map(|r| (host_row_label(r.op), r)));
        for (label, r) in rows {
            let cpu = r
                .cpu_ratio
                .map_or("-".to_owned(), |c| format!("{:.1}%", c * 100.0));
            let _ = writeln!(
                s,
                "| {:<w$} | {:>7} | {:>6.2} | {:>6.4} | {:>15.2} | {:>5.1}% | {:>21} | {:<6} |",
                label,
                r.size,
                r.gbps,
                r.mpps,
                r.baseline_gbps,
                r.ratio * 100.0,
                cpu,
                verify_name(r.verify)
            );
        }
        let lats = self
            .latency
            .iter()
            .map(|l| (l.iwarp.op.name().to_owned(), "raw TCP", l))
            .chain(
                self.host_latency
                    .iter()
                    .map(|l| (host_row_label(l.iwarp.op), "kernel TCP", l)),
            );
        for (label, base, l) in lats {
            let _ = writeln!(
                s,
                "| {:<w$} | {:>7} | latency {:.2} us typical (p99 {:.2}), {base} ping-pong {:.2} us (p99 {:.2}): {:.2}x |",
                label,
                l.iwarp.size,
                l.iwarp.t_typical,
                l.iwarp.p99,
                l.tcp.t_typical,
                l.tcp.p99,
                l.ratio
            );
        }
        let _ = writeln!(
            s,
            "ratio: Gbit/s over the baseline's; CPU-normalized: the same, each divided by the CPU seconds its peers used."
        );
        if self
            .results
            .iter()
            .chain(&self.host_results)
            .any(|r| r.ratio > 1.0)
        {
            let _ = writeln!(
                s,
                "note: a wall-clock ratio above 100% means the one-threaded baseline was short of CPU (other load on this machine); read the CPU-normalized column, or rerun under `chrt -f 10` (docs/PERFORMANCE.md)."
            );
        }
        s
    }
}

/// `off`, `passed`, `failed`.
pub fn verify_name(v: VerifyStatus) -> &'static str {
    match v {
        VerifyStatus::Off => "off",
        VerifyStatus::Passed => "passed",
        VerifyStatus::Failed => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bw() -> BwResult {
        BwResult {
            op: Op::Write,
            size: 65536,
            qps: 1,
            iterations: 5000,
            bytes: 5000 * 65536,
            seconds: 0.5,
            gbps: gbps(5000 * 65536, 0.5),
            peak_gbps: 5.5,
            mpps: 5000.0 / 0.5 / 1e6,
            verify: VerifyStatus::Passed,
            mismatches: 0,
            partial: false,
        }
    }

    #[test]
    fn gbps_golden() {
        assert_eq!(gbps(1_000_000_000, 8.0), 1.0);
        assert_eq!(gbps(1, 0.0), 0.0);
        assert!((bw().gbps - 5.24288).abs() < 1e-9);
    }

    #[test]
    fn lat_stats_golden() {
        // 1..=1000 us.
        let ns: Vec<u64> = (1..=1000).rev().map(|u| u * 1000).collect();
        let s = LatStats::from_samples(Op::Send, 8, &ns).unwrap();
        assert_eq!(s.iterations, 1000);
        assert_eq!((s.t_min, s.t_max), (1.0, 1000.0));
        assert_eq!(s.t_typical, 500.5);
        assert_eq!(s.t_avg, 500.5);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert!(
            (s.t_stdev - 288.6749902572095).abs() < 1e-9,
            "{}",
            s.t_stdev
        );
        let one = LatStats::from_samples(Op::Write, 1, &[2500]).unwrap();
        assert_eq!(
            (one.t_min, one.t_typical, one.p99, one.p999, one.t_stdev),
            (2.5, 2.5, 2.5, 2.5, 0.0)
        );
        assert!(LatStats::from_samples(Op::Read, 8, &[]).is_none());
    }

    #[test]
    fn bw_table_golden() {
        let t = bw_table(&[bw()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], RULE);
        assert_eq!(
            lines[1],
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        );
        assert_eq!(
            lines[2],
            " 65536      5000           5.50               5.24                 0.010000"
        );
        assert_eq!(lines[3], RULE);
    }

    #[test]
    fn lat_table_golden() {
        let s = LatStats::from_samples(Op::Send, 8, &[3000, 1000, 2000]).unwrap();
        let t = lat_table(&[s]);
        let row = t.lines().nth(2).unwrap();
        assert_eq!(
            row,
            " 8      3              1.00           3.00         2.00               2.00           0.82            3.00                   3.00"
        );
    }

    #[test]
    fn demo_json_has_the_issue_fields() {
        let lat = LatStats::from_samples(Op::Send, 8, &[10_000, 12_000]).unwrap();
        let tcp = LatStats::from_samples(Op::Send, 8, &[8_000, 10_000]).unwrap();
        let r = DemoReport {
            link: "memory".into(),
            mtu: 1500,
            rounds: 1,
            seconds: 1.0,
            crc: true,
            baseline_tcp_gbps: 4.0,
            kernel_tcp_gbps: None,
            offload: true,
            results: vec![DemoRow {
                op: Op::Read,
                size: 65536,
                gbps: 3.0,
                mpps: 0.0057,
                baseline_gbps: 4.0,
                ratio: 0.75,
                verify: VerifyStatus::Off,
                cpu_ratio: None,
            }],
            latency: Some(DemoLatency {
                ratio: 11.0 / 9.0,
                iwarp: lat,
                tcp,
            }),
            host_results: Vec::new(),
            host_latency: None,
        };
        let j = r.to_json();
        assert_eq!(j["link"], "memory");
        assert_eq!(j["mtu"], 1500);
        assert_eq!(j["baseline_tcp_gbps"], 4.0);
        assert_eq!(j["results"][0]["op"], "read");
        assert_eq!(j["results"][0]["size"], 65536);
        assert_eq!(j["results"][0]["gbps"], 3.0);
        assert_eq!(j["results"][0]["ratio"], 0.75);
        assert_eq!(j["results"][0]["verify"], "off");
        assert_eq!(j["latency_us"]["t_typical"], 11.0);
        assert_eq!(j["latency_us"]["baseline_tcp_typical"], 9.0);
        let t = r.table();
        assert!(
            t.contains("| read  |   65536 |   3.00 | 0.0057 |            4.00 |  75.0% |                     - | off    |"),
            "{t}"
        );
        assert!(t.contains("latency 11.00 us typical"), "{t}");
        assert!(t.contains("1.22x"), "{t}");
        assert!(!t.contains("note: a wall-clock ratio above 100%"), "{t}");
        assert!(j["host_tcp"].is_null(), "{j}");
        let mut starved = r.clone();
        starved.results[0].ratio = 2.5;
        let t = starved.table();
        assert!(t.contains("| 250.0% |"), "{t}");
        assert!(t.contains("note: a wall-clock ratio above 100% means the one-threaded baseline was short of CPU"), "{t}");
    }

    #[test]
    fn host_tcp_rows_follow_the_tap_rows_against_kernel_tcp() {
        let row = |op, gbps| DemoRow {
            op,
            size: 65536,
            gbps,
            mpps: 0.01,
            baseline_gbps: 10.0,
            ratio: gbps / 10.0,
            verify: VerifyStatus::Passed,
            cpu_ratio: Some(0.9),
        };
        let lat = LatStats::from_samples(Op::Send, 8, &[26_000]).unwrap();
        let tcp = LatStats::from_samples(Op::Send, 8, &[20_000]).unwrap();
        let r = DemoReport {
            link: "tap".into(),
            mtu: 65000,
            rounds: 3,
            seconds: 3.0,
            crc: true,
            baseline_tcp_gbps: 4.0,
            kernel_tcp_gbps: Some(10.0),
            offload: true,
            results: vec![row(Op::Write, 3.0)],
            latency: None,
            host_results: vec![row(Op::Write, 9.0), row(Op::Read, 8.0)],
            host_latency: Some(DemoLatency {
                ratio: 1.3,
                iwarp: lat,
                tcp,
            }),
        };
        let t = r.table();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[2].starts_with("host TCP rows: "), "{t}");
        assert_eq!(
            lines[3],
            "| op               |    size | Gbit/s |   Mpps | baseline Gbit/s | ratio  | ratio, CPU-normalized | verify |"
        );
        assert_eq!(
            lines[5],
            "| write            |   65536 |   3.00 | 0.0100 |           10.00 |  30.0% |                 90.0% | passed |"
        );
        assert_eq!(
            lines[6],
            "| write (host TCP) |   65536 |   9.00 | 0.0100 |           10.00 |  90.0% |                 90.0% | passed |"
        );
        assert!(
            lines[7].starts_with("| read (host TCP)  |   65536 |   8.00 |"),
            "{t}"
        );
        assert_eq!(
            lines[8],
            "| send (host TCP)  |       8 | latency 26.00 us typical (p99 26.00), kernel TCP ping-pong 20.00 us (p99 20.00): 1.30x |"
        );
        let j = r.to_json();
        assert_eq!(j["host_tcp"]["results"][1]["op"], "read", "{j}");
        assert_eq!(j["host_tcp"]["results"][1]["ratio"], 0.8, "{j}");
        assert_eq!(j["host_tcp"]["latency_us"]["t_typical"], 26.0, "{j}");
        assert_eq!(
            j["host_tcp"]["latency_us"]["baseline_tcp_typical"], 20.0,
            "{j}"
        );
    }
}
