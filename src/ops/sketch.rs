//! A relative-error sketch of latencies (the idea of DDSketch): bucket `i` holds the values
//! in `(γ^(i-1), γ^i]` with γ = 1.02, so each bucket is 2% wider than the one below it, and a
//! quantile answered with its bucket's midpoint `2γ^i / (γ + 1)` is within 1% of the true
//! value, from a microsecond to hours alike. Only the buckets that values fell in are kept.
//! Pure.

use std::collections::BTreeMap;

/// The ratio between consecutive bucket bounds.
pub const GAMMA: f64 = 1.02;

/// Values at or below this many seconds share the lowest bucket (a nanosecond).
const FLOOR: f64 = 1e-9;

/// Latencies in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sketch {
    buckets: BTreeMap<i32, u64>,
    count: u64,
    sum: f64,
    max: f64,
}

/// A latency in seconds and its natural logarithm, worked out once for every sketch it goes
/// in (anything not a positive finite number counts as the floor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    seconds: f64,
    ln: f64,
}

impl Latency {
    /// `seconds` as a latency.
    pub fn of(seconds: f64) -> Latency {
        let seconds = match seconds.is_finite() && seconds > FLOOR {
            true => seconds,
            false => FLOOR,
        };
        Latency {
            seconds,
            ln: seconds.ln(),
        }
    }

    /// The seconds (at least the floor).
    pub fn seconds(self) -> f64 {
        self.seconds
    }

    /// Their natural logarithm.
    pub fn ln(self) -> f64 {
        self.ln
    }
}

/// The least integer at or above `v`, for `v` well inside `i32` (a bucket's index).
pub fn ceil_index(v: f64) -> i32 {
    let t = v as i32;
    match f64::from(t) < v {
        true => t + 1,
        false => t,
    }
}

impl Sketch {
    /// Adds one value (seconds; anything not a positive finite number counts as the floor).
    pub fn add(&mut self, seconds: f64) {
        self.add_latency(Latency::of(seconds));
    }

    /// Adds one value whose logarithm is known.
    pub fn add_latency(&mut self, latency: Latency) {
        let x = latency.seconds;
        *self.buckets.entry(index(latency)).or_default() += 1;
        self.count += 1;
        self.sum += x;
        self.max = self.max.max(x);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Sketch) {
        for (&i, &n) in &other.buckets {
            *self.buckets.entry(i).or_default() += n;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// Values added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their sum.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// The largest.
    pub fn max(&self) -> f64 {
        self.max
    }

    /// The `q` quantile (0 to 1): the value of rank `ceil(q·n)`, within 1% (`None` when
    /// empty).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        if rank >= self.count {
            // The largest value is kept as it was.
            return Some(self.max);
        }
        let mut seen = 0;
        for (&i, &n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(midpoint(i).min(self.max));
            }
        }
        Some(self.max)
    }

    /// Buckets kept.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

/// The bucket of `x` (> 0): the least `i` with `x <= γ^i`.
fn index(x: Latency) -> i32 {
    ceil_index(x.ln / GAMMA.ln())
}

/// The value a bucket stands for: within `(γ-1)/(γ+1)` (under 1%) of every value in it.
fn midpoint(i: i32) -> f64 {
    2.0 * GAMMA.powi(i) / (GAMMA + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The exact `q` quantile of `values`, as [`Sketch::quantile`] ranks it.
    fn exact(values: &mut [f64], q: f64) -> f64 {
        values.sort_by(f64::total_cmp);
        let rank = ((q * values.len() as f64).ceil() as usize).max(1);
        values[rank - 1]
    }

    proptest! {
        #[test]
        fn every_quantile_is_within_one_percent(
            mut values in prop::collection::vec(1e-6f64..1e4, 1..400),
            q in 0.0f64..1.0,
        ) {
            let mut s = Sketch::default();
            for v in &values {
                s.add(*v);
            }
            let got = s.quantile(q).unwrap();
            let want = exact(&mut values, q);
            prop_assert!((got - want).abs() <= 0.01 * want, "q {} got {} want {}", q, got, want);
        }
    }

    proptest! {
        #[test]
        fn a_bucket_index_is_the_ceiling(v in -40_000.0f64..40_000.0) {
            prop_assert_eq!(ceil_index(v), v.ceil() as i32);
        }
    }

    #[test]
    fn a_bucket_index_is_the_ceiling_at_and_near_whole_numbers() {
        for v in [
            -3.0,
            -2.5,
            -0.5,
            -0.0,
            0.0,
            1e-300,
            0.5,
            1.0,
            7.0,
            7.000000000000001,
        ] {
            assert_eq!(ceil_index(v), v.ceil() as i32, "{v}");
        }
        let below = f64::from_bits(7.0f64.to_bits() - 1);
        assert_eq!(ceil_index(below), 7);
    }

    #[test]
    fn two_sketches_merged_answer_as_one_of_all_their_values() {
        let (mut a, mut b, mut all) = (Sketch::default(), Sketch::default(), Sketch::default());
        for i in 1..=200u32 {
            let v = f64::from(i) * 1e-4;
            match i % 3 {
                0 => a.add(v),
                _ => b.add(v),
            }
            all.add(v);
        }
        a.merge(&b);
        assert_eq!(
            (a.count(), a.buckets(), a.max()),
            (all.count(), all.buckets(), all.max())
        );
        assert!((a.sum() - all.sum()).abs() < 1e-9);
        for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
            assert_eq!(a.quantile(q), all.quantile(q), "q {q}");
        }
    }

    #[test]
    fn a_known_mix_gives_its_percentiles_and_few_buckets() {
        let mut s = Sketch::default();
        // 90 runs of 1 ms, 9 of 50 ms, 1 of 2 s.
        for (n, v) in [(90, 0.001), (9, 0.05), (1, 2.0)] {
            for _ in 0..n {
                s.add(v);
            }
        }
        let near = |q: f64, want: f64| {
            let got = s.quantile(q).unwrap();
            assert!((got - want).abs() <= 0.01 * want, "q {q}: {got} vs {want}");
        };
        near(0.5, 0.001);
        near(0.9, 0.001);
        near(0.95, 0.05);
        near(0.99, 0.05);
        near(1.0, 2.0);
        assert_eq!(s.count(), 100);
        // The largest value is exact: one run's every percentile is its own time.
        let mut one = Sketch::default();
        one.add(0.8687);
        assert_eq!(one.quantile(0.5), Some(0.8687));
        assert_eq!(s.buckets(), 3);
        assert!(Sketch::default().quantile(0.5).is_none());
        // A microsecond and an hour both fit, each within 1%.
        let mut wide = Sketch::default();
        wide.add(1e-6);
        wide.add(3600.0);
        assert!((wide.quantile(0.0).unwrap() - 1e-6).abs() <= 1e-8);
        assert!((wide.quantile(1.0).unwrap() - 3600.0).abs() <= 36.0);
        wide.add(f64::NAN);
        assert_eq!(wide.count(), 3);
    }
}
