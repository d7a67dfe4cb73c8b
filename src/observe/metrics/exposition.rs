//! The Prometheus text exposition format (0.0.4): family headers, samples and
//! histograms, with escaping. Cut apart because it knows nothing of the registry: the
//! built-in families (`families.rs`) and collectors elsewhere (the lag board's) all
//! write through it.

use std::fmt::Write as _;

use sluice_storage::stats::{HistogramSnapshot, BUCKET_BOUNDS_US};

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// The Prometheus text exposition format (0.0.4) being written: call [`Self::family`]
/// once per family, then its samples, before the next family.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample line; label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        self.out.push(' ');
        self.value(value);
        self.out.push('\n');
    }

    /// A histogram's `_bucket` (cumulative, `le` in seconds), `_sum` and `_count` lines.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0u64;
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n;
            let le = match BUCKET_BOUNDS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".to_string(),
            };
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        self.out.push(' ');
        self.value(h.sum_us as f64 / 1e6);
        self.out.push('\n');
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", h.count());
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let le = le.map(|v| ("le", v));
        for (i, (k, v)) in labels.iter().copied().chain(le).enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(k);
            self.out.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }

    fn value(&mut self, v: f64) {
        if v.is_nan() {
            self.out.push_str("NaN");
        } else if v.is_infinite() {
            self.out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
        } else if v == v.trunc() && v.abs() < 1e15 {
            let _ = write!(self.out, "{}", v as i64);
        } else {
            let _ = write!(self.out, "{v}");
        }
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_histograms_are_cumulative() {
        let mut e = Exposition::default();
        e.family("x_total", "Help with a \\ and\nnewline.", Kind::Counter);
        e.sample("x_total", &[("a", "q\"b\\c\nd")], 3.0);
        let mut h = HistogramSnapshot::default();
        h.buckets[0] = 2;
        h.buckets[2] = 1;
        h.sum_us = 1_500;
        e.histogram("lat_seconds", &[("api", "Produce")], &h);
        let text = e.finish();
        assert!(text.contains("# HELP x_total Help with a \\\\ and\\nnewline.\n"));
        assert!(text.contains("x_total{a=\"q\\\"b\\\\c\\nd\"} 3\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"0.00005\"} 2\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"0.0001\"} 2\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"0.00025\"} 3\n"));
        assert!(text.contains("lat_seconds_bucket{api=\"Produce\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("lat_seconds_sum{api=\"Produce\"} 0.0015\n"));
        assert!(text.contains("lat_seconds_count{api=\"Produce\"} 3\n"));
    }
}
