//! Order statistics over samples. Nearest-rank percentiles: with 5,000
//! samples, p99 is the 4,950th smallest, a real observation, not an
//! interpolation between two.

use std::time::Duration;

/// Sorted samples in microseconds.
#[derive(Debug, Clone)]
pub struct Summary {
    sorted_us: Vec<f64>,
}

impl Summary {
    pub fn from_durations(samples: &[Duration]) -> Summary {
        Self::from_f64(samples.iter().map(|d| d.as_secs_f64() * 1e6).collect())
    }

    pub fn from_f64(mut v: Vec<f64>) -> Summary {
        v.sort_by(|a, b| a.total_cmp(b));
        Summary { sorted_us: v }
    }

    pub fn len(&self) -> usize {
        self.sorted_us.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted_us.is_empty()
    }

    /// The `p`-th percentile (0..=100), nearest rank; NaN when empty.
    pub fn percentile(&self, p: f64) -> f64 {
        let n = self.sorted_us.len();
        if n == 0 {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        self.sorted_us[rank.clamp(1, n) - 1]
    }

    pub fn median(&self) -> f64 {
        self.percentile(50.0)
    }

    pub fn p99(&self) -> f64 {
        self.percentile(99.0)
    }

    pub fn max(&self) -> f64 {
        self.sorted_us.last().copied().unwrap_or(f64::NAN)
    }
}

/// The median of a few runs' figures (the figure the report prints).
pub fn median(values: &[f64]) -> f64 {
    Summary::from_f64(values.to_vec()).median()
}

/// `12,345` for counts and rates.
pub fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// Microseconds as `850 µs` or `1.42 ms`.
pub fn micros(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

/// Bytes as `12.3 MiB`.
pub fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

/// Bytes in the unit that reads best: `850 B`, `1.4 KiB`, `12.3 MiB`.
pub fn bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        mib(b)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}
