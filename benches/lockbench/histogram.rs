//! Wait times as a log-bucketed histogram (the HDR histogram's layout): what `--plot`
//! draws a row's wait-time distribution from, in a few kilobytes whatever the run's length.
//!
//! Values below 64 ns are kept exactly; above, each power of two is cut into 32 buckets,
//! so a bucket spans at most 1/32 (about 3%) of its values. A point of the CDF is a
//! bucket's upper end with the exact share of samples at or below it: the curve is the
//! real distribution, read at bucket edges.

/// Buckets per power of two, as bits: 32 buckets, a relative width of at most 1/32.
const SUB_BITS: u32 = 5;
/// Values below this are their own bucket.
const EXACT_BELOW: u64 = 2 << SUB_BITS;

/// Counts of nanosecond values in log-spaced buckets: at most 1,920 of them (`u64::MAX`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

/// The bucket of `v`.
fn index(v: u64) -> usize {
    if v < EXACT_BELOW {
        return v as usize;
    }
    let top_bit = 63 - v.leading_zeros();
    let shift = top_bit - SUB_BITS;
    // The value's top six bits, in 32..64: the bucket within its power of two.
    let mantissa = (v >> shift) as usize;
    ((shift as usize) << SUB_BITS) + mantissa
}

/// The largest value of bucket `i`.
fn highest(i: usize) -> u64 {
    if (i as u64) < EXACT_BELOW {
        return i as u64;
    }
    let shift = (i >> SUB_BITS) - 1;
    let mantissa = (i - (shift << SUB_BITS)) as u64;
    // In u128: the last bucket's successor would start at 2^64.
    let next = u128::from(mantissa + 1) << shift;
    u64::try_from(next - 1).unwrap_or(u64::MAX)
}

impl Histogram {
    /// The histogram of `values` (nanoseconds).
    pub fn of(values: &[u64]) -> Histogram {
        let mut h = Histogram::default();
        for &v in values {
            h.record(v);
        }
        h
    }

    /// Counts one value.
    pub fn record(&mut self, v: u64) {
        let i = index(v);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    /// Adds the counts of `other` (another run of the same row).
    pub fn merge(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (sum, n) in self.counts.iter_mut().zip(&other.counts) {
            *sum += n;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// Values counted.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The nearest-rank `q` quantile, as the upper end of its bucket (at most the largest
    /// value seen): within 1/32 above the exact figure, exact below 64 ns. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return highest(i).min(self.max);
            }
        }
        self.max
    }

    /// The CDF at every bucket that holds values: (x, share of values ≤ x), x rising, the
    /// last share 1.0. Each x is its bucket's upper end (the largest value for the last),
    /// so the share is exact at x.
    pub fn cdf(&self) -> Vec<(u64, f64)> {
        let mut seen = 0;
        let mut points = Vec::new();
        for (i, &n) in self.counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            seen += n;
            points.push((highest(i).min(self.max), seen as f64 / self.total as f64));
        }
        points
    }
}

/// Checks the buckets, quantiles and CDF on known samples (run by the smoke run under
/// `cargo test`: a bench has no test harness).
pub fn self_check() -> Result<(), String> {
    // Every bucket's values map back to it, and the buckets tile the numbers.
    let mut next_low = 0u64;
    for i in 0..index(u64::MAX) + 1 {
        let top = highest(i);
        if index(next_low) != i || index(top) != i || top < next_low {
            return Err(format!(
                "histogram bucket {i}: [{next_low}, {top}] maps to {} and {}",
                index(next_low),
                index(top)
            ));
        }
        if top - next_low > (next_low >> SUB_BITS) {
            return Err(format!(
                "histogram bucket {i}: [{next_low}, {top}] wider than 1/32"
            ));
        }
        next_low = top.wrapping_add(1);
    }
    if next_low != 0 {
        return Err(format!("histogram buckets end at {next_low}, not u64::MAX"));
    }

    let h = Histogram::of(&[10, 10, 20, 40]);
    let expected = vec![(10, 0.5), (20, 0.75), (40, 1.0)];
    if h.cdf() != expected {
        return Err(format!(
            "cdf of [10, 10, 20, 40]: {:?}, expected {expected:?}",
            h.cdf()
        ));
    }
    // Exact below 64 ns: 1..=63 gives the nearest-rank figures themselves.
    let small: Vec<u64> = (1..=63).collect();
    let h = Histogram::of(&small);
    for (q, expected) in [(0.5, 32), (0.9, 57), (1.0, 63), (0.0, 1)] {
        if h.quantile(q) != expected {
            return Err(format!(
                "quantile {q} of 1..=63: {}, expected {expected}",
                h.quantile(q)
            ));
        }
    }

    // Spread over six decades (1 µs .. 1 s), against the sorted samples themselves.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut values: Vec<u64> = (0..20_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let decades = (x % 6_000) as f64 / 1000.0;
            (1000.0 * 10f64.powf(decades)) as u64
        })
        .collect();
    let mut h = Histogram::of(&values[..10_000]);
    h.merge(&Histogram::of(&values[10_000..]));
    values.sort_unstable();
    if h.count() != values.len() as u64 {
        return Err(format!("merged histogram counts {}", h.count()));
    }
    for q in [0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
        let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
        let exact = values[rank - 1];
        let got = h.quantile(q);
        if got < exact || got - exact > exact / 32 {
            return Err(format!(
                "quantile {q}: {got}, exact {exact} (more than 1/32 apart)"
            ));
        }
    }
    let points = h.cdf();
    if points.last().map(|p| p.1) != Some(1.0)
        || points.last().map(|p| p.0) != values.last().copied()
    {
        return Err(format!("cdf ends at {:?}", points.last()));
    }
    for &(at, share) in &points {
        let exact = values.partition_point(|&v| v <= at) as f64 / values.len() as f64;
        if (share - exact).abs() > 1e-12 {
            return Err(format!("cdf at {at} ns: {share}, exact {exact}"));
        }
    }
    if points
        .windows(2)
        .any(|w| w[0].0 >= w[1].0 || w[0].1 >= w[1].1)
    {
        return Err("cdf points do not rise".into());
    }
    Ok(())
}
