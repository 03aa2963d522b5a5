//! Deserved shares of hierarchical queues, by water-filling over weights.
//!
//! For each parent (the implicit root owns the whole cluster), the parent's
//! deserved share is divided among its children, one resource dimension at a
//! time: every child first gets its guarantee; what is left is poured out in
//! proportion to weight, each child capped at the smaller of its capability and
//! its demand (what it holds plus what its admitted groups still ask for); what a
//! capped child cannot take flows on to the others. The result is work-conserving
//! (nothing is withheld while some queue wants it) and never above capability.

use tessera_model::{Dim, Resources};

/// One child in a water-filling round.
#[derive(Debug, Clone)]
pub struct Share {
    pub weight: u64,
    pub guarantee: u64,
    /// Upper bound: min(capability, demand).
    pub cap: u64,
}

/// Divides `total` among `shares`; returns each one's part. Deterministic; the
/// parts never exceed `total` in sum, nor any `cap`, and each is at least
/// min(guarantee, cap) as far as `total` allows (guarantees are served in order
/// when they over-subscribe `total`).
pub fn water_fill(total: u64, shares: &[Share]) -> Vec<u64> {
    let mut out = vec![0u64; shares.len()];
    let mut left = total;
    for (i, s) in shares.iter().enumerate() {
        let g = s.guarantee.min(s.cap).min(left);
        out[i] = g;
        left -= g;
    }
    loop {
        let active: Vec<usize> = (0..shares.len())
            .filter(|&i| out[i] < shares[i].cap && shares[i].weight > 0)
            .collect();
        if left == 0 || active.is_empty() {
            break;
        }
        let wsum: u128 = active.iter().map(|&i| u128::from(shares[i].weight)).sum();
        let mut given = 0u64;
        for &i in &active {
            let part = (u128::from(left) * u128::from(shares[i].weight) / wsum) as u64;
            let room = shares[i].cap - out[i];
            let g = part.min(room);
            out[i] += g;
            given += g;
        }
        if given == 0 {
            // Rounding left a remainder smaller than the number of active
            // children: hand it out one unit at a time, in order.
            for &i in &active {
                if left - given == 0 {
                    break;
                }
                if out[i] < shares[i].cap {
                    out[i] += 1;
                    given += 1;
                }
            }
        }
        left -= given;
    }
    out
}

/// Applies [`water_fill`] to every dimension of a resource vector.
pub fn water_fill_resources(
    total: &Resources,
    weights: &[u64],
    guarantees: &[Resources],
    caps: &[Resources],
) -> Vec<Resources> {
    let mut out = vec![Resources::default(); weights.len()];
    let mut dims: Vec<Dim> = total.dims().map(|(d, _)| d).collect();
    for c in caps {
        for (d, _) in c.dims() {
            if !dims.contains(&d) {
                dims.push(d);
            }
        }
    }
    for d in &dims {
        let shares: Vec<Share> = (0..weights.len())
            .map(|i| Share {
                weight: weights[i],
                guarantee: guarantees[i].get(d),
                cap: caps[i].get(d),
            })
            .collect();
        for (i, v) in water_fill(total.get(d), &shares).into_iter().enumerate() {
            if v > 0 || matches!(d, Dim::Extended(_)) && caps[i].get(d) > 0 {
                out[i].set(d, v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(weight: u64, guarantee: u64, cap: u64) -> Share {
        Share {
            weight,
            guarantee,
            cap,
        }
    }

    #[test]
    fn by_weight() {
        assert_eq!(water_fill(90, &[s(1, 0, 100), s(2, 0, 100)]), vec![30, 60]);
    }

    #[test]
    fn capped_child_overflows_to_others() {
        assert_eq!(water_fill(90, &[s(1, 0, 10), s(1, 0, 100)]), vec![10, 80]);
    }

    #[test]
    fn guarantee_first() {
        assert_eq!(
            water_fill(100, &[s(1, 60, 100), s(1, 0, 100)]),
            vec![80, 20]
        );
    }

    proptest! {
        #[test]
        fn invariants(total in 0u64..1_000_000, raw in proptest::collection::vec((0u64..10, 0u64..500_000, 0u64..800_000), 1..6)) {
            let shares: Vec<Share> = raw.iter().map(|&(w, g, c)| s(w, g, c)).collect();
            let out = water_fill(total, &shares);
            let sum: u64 = out.iter().sum();
            prop_assert!(sum <= total);
            for (o, sh) in out.iter().zip(&shares) {
                prop_assert!(*o <= sh.cap);
            }
            // Work-conserving: if something is left, every child with weight is capped.
            if sum < total {
                for (o, sh) in out.iter().zip(&shares) {
                    prop_assert!(*o == sh.cap || sh.weight == 0);
                }
            }
        }
    }
}
