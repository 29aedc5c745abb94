//! The statistics of a comparison: per-profile shares, Welch's t-test per function, and
//! Holm's correction over every function tested.
//!
//! The unit of evidence is the profile. Samples within one profile are not independent
//! (a function that runs for 50 ms shows up in five consecutive 10 ms samples), so a test
//! over samples would call every wobble significant. For each profile, each function's
//! self value is divided by that profile's total: its *share* in that profile. Across a
//! side's profiles, the shares of one function are one sample of independent
//! observations, whose mean and variance are all a Welch test needs. Profiles where a
//! function never ran count as share 0, so the sums below only visit functions that ran.
//!
//! Welch's t-test does not assume equal variances or equal counts on the two sides;
//! with log-normal noise of σ = 0.3 on each share, 12 profiles a side are enough for its
//! p-values to hold (`kiln bench insight` measures how often they do not). Testing
//! hundreds of functions at once would produce a few "significant" ones by chance at any
//! fixed level, so p-values are corrected with Holm's step-down method, which keeps the
//! chance of *any* false finding below `alpha` whatever the dependence between functions
//! (shares are compositional: when one grows, the others shrink together).

use std::collections::HashMap;

use serde::Serialize;

/// One function's sums over one side's profiles.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FunctionSums {
    /// Self value summed over the profiles.
    pub value: i64,
    /// Σ share, where share = self value / the profile's total.
    pub share: f64,
    /// Σ share², for the variance.
    pub share_sq: f64,
}

impl FunctionSums {
    pub fn add(&mut self, other: &FunctionSums) {
        self.value = self.value.saturating_add(other.value);
        self.share += other.share;
        self.share_sq += other.share_sq;
    }

    /// Adds one profile in which the function's self value is `value` of `total`.
    pub fn add_profile(&mut self, value: i64, total: i64) {
        let share = value as f64 / total as f64;
        self.value = self.value.saturating_add(value);
        self.share += share;
        self.share_sq += share * share;
    }
}

/// What one side's profiles say: how many there were, their summed total, and per
/// function (by name) the sums a Welch test needs. Partial sums of disjoint sets of
/// profiles add up, so datasets are summed in parallel and merged.
#[derive(Debug, Clone, Default)]
pub struct SideSums {
    /// Profiles with a non-zero total (a profile with nothing in it has no shares).
    pub profiles: u64,
    pub total: i64,
    pub functions: HashMap<String, FunctionSums>,
}

impl SideSums {
    /// Adds one profile given each function's self value in it (one entry per function).
    pub fn add_profile<'a>(
        &mut self,
        self_values: impl IntoIterator<Item = (&'a str, i64)> + Clone,
    ) {
        let total = self_values
            .clone()
            .into_iter()
            .fold(0i64, |sum, (_, value)| sum.saturating_add(value));
        if total <= 0 {
            return;
        }
        self.profiles += 1;
        self.total = self.total.saturating_add(total);
        for (name, value) in self_values {
            if value != 0 {
                match self.functions.get_mut(name) {
                    Some(sums) => sums.add_profile(value, total),
                    None => {
                        let mut sums = FunctionSums::default();
                        sums.add_profile(value, total);
                        self.functions.insert(name.to_string(), sums);
                    }
                }
            }
        }
    }

    pub fn merge(&mut self, other: SideSums) {
        self.profiles += other.profiles;
        self.total = self.total.saturating_add(other.total);
        for (name, sums) in other.functions {
            self.functions.entry(name).or_default().add(&sums);
        }
    }
}

/// How sure a finding must be, and when not to answer at all.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Method {
    /// Family-wise error rate: the chance that any function is called significant when
    /// nothing changed, at most. 0.001 by default: at 0.01, one comparison in ~130 with
    /// nothing changed still reported a change (`kiln bench insight`, 2,000 trials), and
    /// an automatic watcher that cries wolf gets muted; 0.001 cost 2 points of power there.
    pub alpha: f64,
    /// Fewer profiles than this on either side: no p-values, and the answer says why.
    pub min_profiles: u64,
}

impl Default for Method {
    fn default() -> Self {
        Method {
            alpha: 0.001,
            min_profiles: 10,
        }
    }
}

/// One function's change between the sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionChange {
    pub name: String,
    pub left_value: i64,
    pub right_value: i64,
    /// Self value as a fraction of the side's total.
    pub left_share: f64,
    pub right_share: f64,
    /// `right_share - left_share`.
    pub delta_share: f64,
    /// Welch's t of the per-profile shares (right minus left); `None` when refused.
    pub t: Option<f64>,
    /// Two-sided p-value of this function's test alone.
    pub p_value: Option<f64>,
    /// Holm-adjusted p-value: compare it with `alpha`.
    pub p_adjusted: Option<f64>,
    /// `1 - p_adjusted`.
    pub confidence: Option<f64>,
    pub significant: bool,
}

/// Every function of either side, most important change first: the significant ones by
/// the size of their change, then the others by p-value (the next most likely real).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranking {
    pub functions: Vec<FunctionChange>,
    /// Functions tested (the m of the correction).
    pub tested: usize,
    /// Why no p-values were computed, when so; the changes are then ranked by size only.
    pub refused: Option<String>,
}

/// Welch's t-test of two samples given by count, Σx and Σx²: (t, two-sided p).
pub fn welch(n1: u64, sum1: f64, sq1: f64, n2: u64, sum2: f64, sq2: f64) -> (f64, f64) {
    let (n1f, n2f) = (n1 as f64, n2 as f64);
    let (mean1, mean2) = (sum1 / n1f, sum2 / n2f);
    // Σx² - n·mean² loses precision to cancellation; a tiny negative is a zero variance.
    let var1 = ((sq1 - n1f * mean1 * mean1) / (n1f - 1.0)).max(0.0);
    let var2 = ((sq2 - n2f * mean2 * mean2) / (n2f - 1.0)).max(0.0);
    let (a, b) = (var1 / n1f, var2 / n2f);
    let se2 = a + b;
    let delta = mean2 - mean1;
    // Shares are at most 1; below this, both sides are constant.
    if se2 <= 1e-24 {
        return if delta.abs() <= 1e-12 {
            (0.0, 1.0)
        } else {
            (delta.signum() * f64::INFINITY, 0.0)
        };
    }
    let t = delta / se2.sqrt();
    let denominator = a * a / (n1f - 1.0) + b * b / (n2f - 1.0);
    let df = if denominator > 0.0 {
        se2 * se2 / denominator
    } else {
        n1f + n2f - 2.0
    };
    (t, t_two_sided(t, df))
}

/// Two-sided p-value of Student's t with `df` (any real df > 0, as Welch's is):
/// `I_x(df/2, 1/2)` at `x = df / (df + t²)`, so a tiny p is computed directly, without a
/// `1 - cdf` cancellation.
///
/// Written here rather than taken from a crate: `statrs` brings nalgebra into the build,
/// and `distrs` (Hill's 1970 algorithm) approximates non-integer degrees of freedom by an
/// asymptotic series and, in the fuzz target, overflowed its loop counter.
pub fn t_two_sided(t: f64, df: f64) -> f64 {
    if t.is_nan() || df.is_nan() || df <= 0.0 {
        return 1.0;
    }
    if t.is_infinite() {
        return 0.0;
    }
    let x = df / (df + t * t);
    regularized_beta(x, df / 2.0, 0.5).clamp(0.0, 1.0)
}

/// `ln Γ(z)` for z > 0: Stirling's series from z ≥ 8, reached by `Γ(z+1) = z Γ(z)`.
fn ln_gamma(mut z: f64) -> f64 {
    let mut shift = 0.0;
    while z < 8.0 {
        shift -= z.ln();
        z += 1.0;
    }
    let inv = 1.0 / z;
    let inv2 = inv * inv;
    let series = inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0 - inv2 / 1680.0)));
    shift + (z - 0.5) * z.ln() - z + 0.5 * (2.0 * std::f64::consts::PI).ln() + series
}

/// The regularized incomplete beta function `I_x(a, b)`, by its continued fraction
/// (DLMF 8.17.22) evaluated with Lentz's method; where the fraction converges slowly
/// (x above the mean), through `I_x(a, b) = 1 - I_{1-x}(b, a)`.
fn regularized_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - regularized_beta(1.0 - x, b, a);
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp() / a;
    const TINY: f64 = 1e-300;
    let mut c = 1.0f64;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    d = if d.abs() < TINY { TINY } else { d };
    d = 1.0 / d;
    let mut fraction = d;
    for m in 1..=500 {
        let m = m as f64;
        // The even step, then the odd one.
        for numerator in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + numerator * d;
            d = if d.abs() < TINY { TINY } else { d };
            c = 1.0 + numerator / c;
            c = if c.abs() < TINY { TINY } else { c };
            d = 1.0 / d;
            fraction *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-15 {
            break;
        }
    }
    front * fraction
}

/// Holm's step-down adjustment: adjusted p-values in the input's order.
pub fn holm(p_values: &[f64]) -> Vec<f64> {
    let m = p_values.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|a, b| p_values[*a].total_cmp(&p_values[*b]));
    let mut adjusted = vec![1.0; m];
    let mut running = 0.0f64;
    for (rank, index) in order.into_iter().enumerate() {
        running = running.max(((m - rank) as f64 * p_values[index]).min(1.0));
        adjusted[index] = running;
    }
    adjusted
}

/// Compares the sides function by function.
pub fn rank(left: &SideSums, right: &SideSums, method: &Method) -> Ranking {
    let share = |value: i64, total: i64| {
        if total > 0 {
            value as f64 / total as f64
        } else {
            0.0
        }
    };
    let mut names: Vec<&String> = left
        .functions
        .keys()
        .chain(right.functions.keys())
        .collect();
    names.sort_unstable();
    names.dedup();
    let empty = FunctionSums::default();
    let mut functions: Vec<FunctionChange> = names
        .into_iter()
        .map(|name| {
            let l = left.functions.get(name).unwrap_or(&empty);
            let r = right.functions.get(name).unwrap_or(&empty);
            let (left_share, right_share) =
                (share(l.value, left.total), share(r.value, right.total));
            FunctionChange {
                name: name.clone(),
                left_value: l.value,
                right_value: r.value,
                left_share,
                right_share,
                delta_share: right_share - left_share,
                t: None,
                p_value: None,
                p_adjusted: None,
                confidence: None,
                significant: false,
            }
        })
        .collect();
    let tested = functions.len();
    let min = method.min_profiles.max(2);
    if left.profiles < min || right.profiles < min {
        functions.sort_by(|a, b| {
            b.delta_share
                .abs()
                .total_cmp(&a.delta_share.abs())
                .then_with(|| a.name.cmp(&b.name))
        });
        return Ranking {
            functions,
            tested: 0,
            refused: Some(format!(
                "too few profiles to test: the left side has {}, the right side {}; at least {min} a side are needed, so no change is called significant",
                left.profiles, right.profiles
            )),
        };
    }
    let mut p_values = Vec::with_capacity(tested);
    for change in &mut functions {
        let l = left.functions.get(&change.name).unwrap_or(&empty);
        let r = right.functions.get(&change.name).unwrap_or(&empty);
        let (t, p) = welch(
            left.profiles,
            l.share,
            l.share_sq,
            right.profiles,
            r.share,
            r.share_sq,
        );
        change.t = Some(t);
        change.p_value = Some(p);
        p_values.push(p);
    }
    for (change, adjusted) in functions.iter_mut().zip(holm(&p_values)) {
        change.p_adjusted = Some(adjusted);
        change.confidence = Some(1.0 - adjusted);
        change.significant = adjusted <= method.alpha;
    }
    functions.sort_by(|a, b| {
        b.significant
            .cmp(&a.significant)
            .then_with(|| {
                if a.significant {
                    b.delta_share.abs().total_cmp(&a.delta_share.abs())
                } else {
                    a.p_value
                        .unwrap_or(1.0)
                        .total_cmp(&b.p_value.unwrap_or(1.0))
                        .then_with(|| b.delta_share.abs().total_cmp(&a.delta_share.abs()))
                }
            })
            .then_with(|| a.name.cmp(&b.name))
    });
    Ranking {
        functions,
        tested,
        refused: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(samples: &[f64]) -> (u64, f64, f64) {
        (
            samples.len() as u64,
            samples.iter().sum(),
            samples.iter().map(|x| x * x).sum(),
        )
    }

    #[test]
    fn welch_matches_published_values() {
        // Welch's own kind of example: t = 2.4554, df = 24.99, two-sided p = 0.02138
        // (the t density integrated numerically).
        let a = [
            27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7,
            21.4,
        ];
        let b = [
            27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5,
            24.4,
        ];
        let (n1, s1, q1) = sums(&a);
        let (n2, s2, q2) = sums(&b);
        let (t, p) = welch(n1, s1, q1, n2, s2, q2);
        assert!((t - 2.4554).abs() < 1e-3, "t = {t}");
        assert!((p - 0.02138).abs() < 1e-4, "p = {p}");
    }

    #[test]
    fn the_t_distribution_has_the_tabled_critical_values() {
        // Two-sided critical values of t with 10 degrees of freedom.
        for (t, p) in [(2.228, 0.05), (3.169, 0.01), (4.587, 0.001)] {
            let got = t_two_sided(t, 10.0);
            assert!((got - p).abs() / p < 0.001, "t = {t}: p = {got}, want {p}");
        }
        // One degree of freedom is the Cauchy distribution: p = 1 - 2·atan(t)/π.
        for t in [0.5, 1.0, 3.0, 100.0] {
            let want = 1.0 - 2.0 * f64::atan(t) / std::f64::consts::PI;
            let got = t_two_sided(t, 1.0);
            assert!((got - want).abs() / want < 1e-9, "t = {t}: {got} vs {want}");
        }
        // Two: p = 1 - t / sqrt(2 + t²); and a non-integer df lies between its neighbours.
        for t in [0.3f64, 2.0, 7.0] {
            let want = 1.0 - t / (2.0 + t * t).sqrt();
            assert!((t_two_sided(t, 2.0) - want).abs() / want < 1e-9);
            let (low, mid, high) = (
                t_two_sided(t, 2.0),
                t_two_sided(t, 2.5),
                t_two_sided(t, 3.0),
            );
            assert!(low > mid && mid > high, "{low} {mid} {high}");
        }
        // Tiny p-values keep their precision (no 1 - cdf), and extremes stay in [0, 1].
        let tiny = t_two_sided(20.0, 20.0);
        assert!(tiny > 0.0 && tiny < 1e-13, "{tiny}");
        assert_eq!(t_two_sided(0.0, 7.3), 1.0);
        assert_eq!(t_two_sided(f64::INFINITY, 3.0), 0.0);
        assert_eq!(
            t_two_sided(1e300, 1e-300),
            t_two_sided(1e300, 1e-300).clamp(0.0, 1.0)
        );
        // Many degrees of freedom: the normal distribution's 1.96 → 0.05.
        assert!((t_two_sided(1.959964, 1e7) - 0.05).abs() < 1e-6);
    }

    #[test]
    fn holm_adjusts_in_order_and_stays_monotone() {
        let adjusted = holm(&[0.01, 0.04, 0.03, 0.005]);
        // Sorted: 0.005·4, 0.01·3, 0.03·2, 0.04·1 → 0.02, 0.03, 0.06, 0.06.
        let want = [0.03, 0.06, 0.06, 0.02];
        for (got, want) in adjusted.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{adjusted:?}");
        }
    }

    fn side(profiles: &[&[(&str, i64)]]) -> SideSums {
        let mut side = SideSums::default();
        for profile in profiles {
            side.add_profile(profile.iter().copied());
        }
        side
    }

    #[test]
    fn equal_sides_give_nothing_significant_and_a_real_change_is_found() {
        let noisy = |i: i64| -> Vec<(&'static str, i64)> {
            vec![
                ("a", 500 + 7 * (i % 5)),
                ("b", 300 - 5 * (i % 3)),
                ("c", 200 + 3 * (i % 4)),
            ]
        };
        let profiles: Vec<Vec<_>> = (0..12).map(noisy).collect();
        let refs: Vec<&[(&str, i64)]> = profiles.iter().map(Vec::as_slice).collect();
        let left = side(&refs);
        let same = rank(&left, &left.clone(), &Method::default());
        assert_eq!(same.tested, 3);
        assert!(same.functions.iter().all(|f| !f.significant), "{same:?}");
        assert!(same.functions.iter().all(|f| f.p_value == Some(1.0)));

        let grown: Vec<Vec<_>> = (0..12)
            .map(|i| {
                let mut profile = noisy(i + 1);
                profile[2].1 += 150;
                profile
            })
            .collect();
        let refs: Vec<&[(&str, i64)]> = grown.iter().map(Vec::as_slice).collect();
        let ranking = rank(&left, &side(&refs), &Method::default());
        let top = &ranking.functions[0];
        assert_eq!(top.name, "c");
        assert!(top.significant && top.delta_share > 0.1, "{top:?}");
        assert!(top.confidence.unwrap() > 0.99);
    }

    #[test]
    fn too_few_profiles_refuse_instead_of_calling_anything_significant() {
        let left = side(&[&[("a", 10)], &[("a", 10)], &[("a", 10)]]);
        let profile: &[(&str, i64)] = &[("a", 1), ("b", 100)];
        let right = side(&[profile; 3]);
        let ranking = rank(&left, &right, &Method::default());
        let reason = ranking.refused.as_deref().unwrap();
        assert!(
            reason.contains("left side has 3, the right side 3"),
            "{reason}"
        );
        assert!(reason.contains("at least 10"), "{reason}");
        assert!(ranking
            .functions
            .iter()
            .all(|f| !f.significant && f.p_value.is_none()));
        // Still ranked by size: b went from 0 to 99% and a from 100% to 1%.
        let delta: Vec<f64> = ranking.functions.iter().map(|f| f.delta_share).collect();
        assert!((delta[0].abs() - 100.0 / 101.0).abs() < 1e-9, "{delta:?}");
    }
}
