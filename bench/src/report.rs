//! Run reports: the terminal table, the HdrHistogram percentile file (`.hgrm`), the
//! self-describing `report.json`, and a latency-percentile plot (SVG).

use std::io::Write;
use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde_json::{json, Value};

/// Latency percentiles in milliseconds, as report.json carries them.
pub fn latency_ms(h: &Histogram<u64>) -> Value {
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    json!({
        "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999), "p9999": q(0.9999),
        "max": h.max() as f64 / 1000.0, "count": h.len(),
    })
}

/// Prints one summary line per latency histogram and the throughput line.
pub fn print_summary(
    title: &str,
    records_per_sec: f64,
    mb_per_sec: f64,
    hists: &[(&str, &Histogram<u64>)],
) {
    println!("{title}: {records_per_sec:.0} records/s, {mb_per_sec:.1} MB/s");
    println!(
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "latency (ms)", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    );
    for (name, h) in hists {
        if h.is_empty() {
            continue;
        }
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        println!(
            "{:<14} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10.3} {:>9.3}",
            name,
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            q(0.9999),
            h.max() as f64 / 1000.0
        );
    }
}

/// Writes HdrHistogram's percentile-distribution text (values in milliseconds).
pub fn write_hgrm(path: &Path, h: &Histogram<u64>) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    writeln!(
        f,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    for v in h.iter_quantiles(5) {
        let p = v.quantile_iterated_to();
        let inv = if p < 1.0 {
            format!("{:.2}", 1.0 / (1.0 - p))
        } else {
            "inf".to_string()
        };
        writeln!(
            f,
            "{:>12.3} {:>14.12} {:>10} {:>14}",
            v.value_iterated_to() as f64 / 1000.0,
            p,
            v.count_since_last_iteration(),
            inv
        )?;
    }
    writeln!(
        f,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]",
        h.mean() / 1000.0,
        h.stdev() / 1000.0
    )?;
    writeln!(
        f,
        "#[Max     = {:>12.3}, Total count    = {:>12}]",
        h.max() as f64 / 1000.0,
        h.len()
    )?;
    Ok(())
}

/// A latency-by-percentile plot: x is 1/(1-percentile) on a log scale, as HdrHistogram
/// plots are drawn, y is milliseconds.
pub fn write_plot(
    path: &Path,
    title: &str,
    series: &[(&str, &Histogram<u64>)],
) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let max_ms = series
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(_, h)| h.max() as f64 / 1000.0)
        .fold(0.001, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((1.0f64..100_000.0f64).log_scale(), 0.0f64..max_ms * 1.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("percentile (1/(1-p): 10 = p90, 100 = p99, 1000 = p99.9)")
        .y_desc("latency (ms)")
        .draw()
        .map_err(|e| e.to_string())?;
    let colors = [BLUE, RED, GREEN, MAGENTA];
    for (i, (name, h)) in series.iter().enumerate() {
        if h.is_empty() {
            continue;
        }
        let color = colors[i % colors.len()];
        let points: Vec<(f64, f64)> = h
            .iter_quantiles(5)
            .map(|v| v.quantile_iterated_to())
            .filter(|p| *p < 0.99999)
            .map(|p| (1.0 / (1.0 - p), h.value_at_quantile(p) as f64 / 1000.0))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Commit and machine facts for a self-describing report.
pub fn environment() -> Value {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().next().and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .unwrap_or(0);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({
        "commit": commit,
        "unix_time": at,
        "machine": {"cores": cores, "cpu": cpu, "memory_gib": mem_kib as f64 / 1048576.0, "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()},
    })
}
