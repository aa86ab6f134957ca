//! The median of timing samples, rounded to a chosen side: the speedups
//! `bench spec` and `draftc generate` report, and the warm-up's plain
//! decoder step that the planner compares with.

/// Which middle value of an even count [`median`] takes.
#[derive(Clone, Copy)]
pub enum Middle {
    Lower,
    Upper,
}

/// The median of `xs` (0 when empty); of an even count, the lower or
/// upper middle value, so that a speedup over two runs each is never
/// rounded in speculation's favour (its rate lower, the baseline upper).
pub fn median(xs: &[f64], middle: Middle) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match (v.len(), middle) {
        (0, _) => 0.0,
        (n, Middle::Lower) => v[(n - 1) / 2],
        (n, Middle::Upper) => v[n / 2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_never_round_in_speculations_favour() {
        assert_eq!(median(&[3.0, 1.0, 2.0], Middle::Lower), 2.0);
        assert_eq!(median(&[3.0, 1.0, 2.0], Middle::Upper), 2.0);
        assert_eq!(median(&[4.0, 1.0], Middle::Lower), 1.0);
        assert_eq!(median(&[4.0, 1.0], Middle::Upper), 4.0);
        assert_eq!(median(&[], Middle::Lower), 0.0);
    }
}
