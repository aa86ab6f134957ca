//! Symbolic dimensions: integer polynomials over the symbols that stay
//! symbolic after a target preset is applied (`t` tokens, `b` batch, `l` draft
//! length). Target symbols (`d`, `n`, …) are folded to constants, so shape
//! equality is polynomial equality and `4*d` vs `2304` compare equal.

use std::collections::BTreeMap;
use std::fmt;

/// A product of symbols, sorted (`["l", "t"]` is `l*t`); empty = constant term.
pub type Monomial = Vec<String>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    /// Non-zero coefficients by monomial.
    terms: BTreeMap<Monomial, i64>,
}

impl Dim {
    pub fn constant(c: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if c != 0 {
            terms.insert(Vec::new(), c);
        }
        Dim { terms }
    }

    pub fn symbol(name: &str) -> Dim {
        let mut terms = BTreeMap::new();
        terms.insert(vec![name.to_string()], 1);
        Dim { terms }
    }

    pub fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    pub fn terms(&self) -> impl Iterator<Item = (&Monomial, i64)> {
        self.terms.iter().map(|(m, c)| (m, *c))
    }

    /// Coefficient of the monomial (0 if absent).
    pub fn coeff(&self, mono: &[&str]) -> i64 {
        let key: Monomial = mono.iter().map(|s| s.to_string()).collect();
        self.terms.get(&key).copied().unwrap_or(0)
    }

    pub fn checked_add(&self, other: &Dim) -> Option<Dim> {
        let mut terms = self.terms.clone();
        for (m, c) in &other.terms {
            let e = terms.entry(m.clone()).or_insert(0);
            *e = e.checked_add(*c)?;
        }
        terms.retain(|_, c| *c != 0);
        Some(Dim { terms })
    }

    pub fn checked_neg(&self) -> Option<Dim> {
        let mut terms = BTreeMap::new();
        for (m, c) in &self.terms {
            terms.insert(m.clone(), c.checked_neg()?);
        }
        Some(Dim { terms })
    }

    pub fn checked_sub(&self, other: &Dim) -> Option<Dim> {
        self.checked_add(&other.checked_neg()?)
    }

    pub fn checked_mul(&self, other: &Dim) -> Option<Dim> {
        let mut terms: BTreeMap<Monomial, i64> = BTreeMap::new();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m = ma.clone();
                m.extend(mb.iter().cloned());
                m.sort();
                if m.len() > 8 {
                    return None;
                }
                let e = terms.entry(m).or_insert(0);
                *e = e.checked_add(ca.checked_mul(*cb)?)?;
            }
        }
        terms.retain(|_, c| *c != 0);
        Some(Dim { terms })
    }

    /// Exact division by a non-zero constant (every coefficient divisible).
    pub fn checked_div_exact(&self, divisor: i64) -> Option<Dim> {
        if divisor == 0 || self.terms.values().any(|c| c % divisor != 0) {
            return None;
        }
        let terms = self
            .terms
            .iter()
            .map(|(m, c)| (m.clone(), c / divisor))
            .collect();
        Some(Dim { terms })
    }

    /// Substitute values for symbols; symbols without a value stay symbolic.
    pub fn substitute(&self, values: &BTreeMap<String, i64>) -> Option<Dim> {
        let mut out = Dim::default();
        for (m, c) in &self.terms {
            let mut term = Dim::constant(*c);
            for s in m {
                let factor = match values.get(s) {
                    Some(v) => Dim::constant(*v),
                    None => Dim::symbol(s),
                };
                term = term.checked_mul(&factor)?;
            }
            out = out.checked_add(&term)?;
        }
        Some(out)
    }

    /// Evaluate with every symbol given; None if one is missing or on overflow.
    pub fn eval(&self, values: &BTreeMap<String, i64>) -> Option<i64> {
        self.substitute(values)?.as_const()
    }

    /// Every symbol this dimension mentions.
    pub fn symbols(&self) -> impl Iterator<Item = &String> {
        self.terms.keys().flat_map(|m| m.iter())
    }
}

impl From<i64> for Dim {
    fn from(c: i64) -> Dim {
        Dim::constant(c)
    }
}

impl fmt::Display for Dim {
    /// Prints in the description syntax: `4*l*t + 2`, parseable back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "0");
        }
        // Highest-degree terms first, constant last: `t*l + 1` reads naturally.
        let mut terms: Vec<_> = self.terms.iter().collect();
        terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        for (i, (m, c)) in terms.into_iter().enumerate() {
            let neg = *c < 0;
            let abs = c.unsigned_abs();
            if i == 0 {
                if neg {
                    write!(f, "-")?;
                }
            } else {
                write!(f, " {} ", if neg { "-" } else { "+" })?;
            }
            let mut parts: Vec<String> = Vec::new();
            if abs != 1 || m.is_empty() {
                parts.push(abs.to_string());
            }
            parts.extend(m.iter().cloned());
            write!(f, "{}", parts.join("*"))?;
        }
        Ok(())
    }
}

/// `[t, 4, 576]`
pub fn fmt_shape(dims: &[Dim]) -> String {
    let inner: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", inner.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_display() {
        let t = Dim::symbol("t");
        let l = Dim::symbol("l");
        let e = t
            .checked_mul(&l)
            .unwrap()
            .checked_mul(&Dim::constant(4))
            .unwrap();
        let e = e.checked_add(&Dim::constant(2)).unwrap();
        assert_eq!(e.to_string(), "4*l*t + 2");
        assert_eq!(
            e.checked_sub(&Dim::constant(2))
                .unwrap()
                .checked_div_exact(4)
                .unwrap()
                .to_string(),
            "l*t"
        );
        assert!(e.checked_div_exact(4).is_none());
        assert_eq!(Dim::constant(-3).to_string(), "-3");
        let mut v = BTreeMap::new();
        v.insert("t".to_string(), 3);
        v.insert("l".to_string(), 2);
        assert_eq!(e.eval(&v), Some(26));
    }
}
