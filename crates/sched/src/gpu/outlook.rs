//! What the `tessera` placement policy knows of the workload beyond FGD's
//! typical pods, all derived from the observed pod shapes and the nodes:
//!
//! - **the eventual waste of a GPU's free share** (lookahead on shares): a GPU
//!   with `g` milli-GPU free will, over the arrivals to come, be filled by
//!   random shares that fit, or stay as it is. `waste(g)` is that expectation:
//!   `waste(g) = (1 - q)·g + q·E[waste(g - s) | s ≤ g]` over the observed share
//!   sizes `s`, where `q = min(1, FILL_RATE·P(s ≤ g))` is how likely the gap
//!   gets a share at all; an untouched GPU wastes nothing (whole-GPU tasks take
//!   it). FGD looks one pod ahead; this looks down the whole chain of fills, so
//!   it tells a gap that future shares close (530 → 60 after a 470) from one
//!   they never will (190 behind an 810);
//! - **stranding** (CPU per GPU): GPUs a node cannot give away because the CPU
//!   left there is short of what GPU tasks ask per GPU on average
//!   (`free GPU − CPU left · GPU per CPU`, when positive). FGD only sees a GPU
//!   as fragmented when the CPU left is below one typical task's; a node with
//!   8 free GPUs and 12 cores left looks fine to it, and is not;
//! - **model pressure**: per GPU model, the demand of the tasks that accept only
//!   some models, per unit of that model's capacity (a constrained task's demand
//!   spread over the models it accepts by their capacity). A task that could run
//!   on a less contended model pays for taking a contended one.
//!
//! The weights were tuned on the Alibaba GPU trace (default pod list) and
//! checked on every pod-list variant; see `docs/bench/sched-issue20.md`.

use super::policy::{NodeState, PodShape};

/// How strongly the lookahead on shares counts (milli-GPU of expected waste
/// per unit of FGD's score).
pub const LOOKAHEAD_WEIGHT: f64 = 3.0;
/// How fast a gap is expected to be filled, per unit of probability that a
/// share fits it.
pub const FILL_RATE: f64 = 10.0;
/// How much a stranded milli-GPU counts against fragmentation (1: the same).
pub const STRANDING_WEIGHT: f64 = 1.0;
/// How much model pressure counts, per milli-GPU the task takes.
pub const PRESSURE_WEIGHT: f64 = 3.0;

/// The `tessera` policy's view of the workload; see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct Outlook {
    /// Expected eventual waste of a GPU with `g` milli-GPU free, `g` in 0..=1000.
    waste: Vec<f64>,
    /// Milli-GPU per milli-CPU that GPU tasks ask for.
    gpu_per_cpu: f64,
    /// Demand of model-constrained tasks per unit of capacity, by model id.
    pressure: [f64; 64],
    /// Models that some node has, as a bit mask.
    present: u64,
}

impl Default for Outlook {
    /// Knows nothing: no waste, no stranding, no pressure.
    fn default() -> Self {
        Outlook {
            waste: vec![0.0; 1001],
            gpu_per_cpu: 0.0,
            pressure: [0.0; 64],
            present: 0,
        }
    }
}

impl Outlook {
    /// Builds the outlook from the observed task shapes and the nodes.
    pub fn new(pods: &[PodShape], nodes: &[NodeState]) -> Self {
        let mut o = Outlook::default();
        // Share sizes.
        let shares: Vec<&PodShape> = pods.iter().filter(|p| p.is_share()).collect();
        if !shares.is_empty() {
            let mut ps = vec![0f64; 1001];
            for p in &shares {
                ps[p.milli.min(1000) as usize] += 1.0 / shares.len() as f64;
            }
            let mut cum = 0.0;
            for g in 1..1000usize {
                cum += ps[g];
                let e = if cum > 0.0 {
                    (1..=g).map(|s| ps[s] * o.waste[g - s]).sum::<f64>() / cum
                } else {
                    0.0
                };
                let q = (FILL_RATE * cum).min(1.0);
                o.waste[g] = (1.0 - q) * g as f64 + q * e;
            }
        }
        // GPU per CPU.
        let (g, c) = pods
            .iter()
            .filter(|p| p.wants_gpu())
            .fold((0.0, 0.0), |a, p| {
                (a.0 + p.total_milli() as f64, a.1 + p.cpu_req.max(0) as f64)
            });
        if c > 0.0 {
            o.gpu_per_cpu = g / c;
        }
        // Model pressure.
        let mut supply = [0f64; 64];
        for n in nodes {
            if (n.model as usize) < 64 {
                supply[n.model as usize] += n.gpu_left.len() as f64 * 1000.0;
            }
        }
        o.present = (0..64)
            .filter(|&m| supply[m] > 0.0)
            .fold(0u64, |a, m| a | (1 << m));
        let mut demand = [0f64; 64];
        for p in pods {
            if !p.wants_gpu() || p.models == 0 || p.models & o.present == o.present {
                continue;
            }
            let allowed = |m: usize| p.models & (1u64 << m) != 0;
            let total: f64 = (0..64).filter(|&m| allowed(m)).map(|m| supply[m]).sum();
            if total == 0.0 {
                continue;
            }
            for m in (0..64).filter(|&m| allowed(m)) {
                demand[m] += p.total_milli() as f64 * supply[m] / total;
            }
        }
        for m in 0..64 {
            if supply[m] > 0.0 {
                o.pressure[m] = demand[m] / supply[m];
            }
        }
        o
    }

    /// Expected eventual waste of a GPU with `free` milli-GPU free.
    pub fn waste(&self, free: u32) -> f64 {
        self.waste[free.min(1000) as usize]
    }

    /// Milli-GPU a node cannot give away for lack of CPU.
    pub fn stranded(&self, cpu_left: i64, gpu_left: &[u32]) -> f64 {
        let free: u64 = gpu_left.iter().map(|&g| u64::from(g)).sum();
        (free as f64 - cpu_left.max(0) as f64 * self.gpu_per_cpu).max(0.0)
    }

    /// What taking `pod` onto a GPU of model `model` costs in model pressure:
    /// how much more contended this model is than the least contended one the
    /// task accepts, per milli-GPU taken.
    pub fn pressure_cost(&self, pod: &PodShape, model: u16) -> f64 {
        if !pod.wants_gpu() || model as usize >= 64 {
            return 0.0;
        }
        let allowed = |m: usize| {
            self.present & (1u64 << m) != 0 && (pod.models == 0 || pod.models & (1u64 << m) != 0)
        };
        let least = (0..64)
            .filter(|&m| allowed(m))
            .map(|m| self.pressure[m])
            .fold(f64::INFINITY, f64::min);
        let here = self.pressure[model as usize];
        let least = if least.is_finite() {
            least.min(here)
        } else {
            here
        };
        PRESSURE_WEIGHT * (here - least) * pod.total_milli() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(milli: u32) -> PodShape {
        PodShape {
            cpu: 1000,
            cpu_req: 1000,
            mem: 0,
            num_gpu: 1,
            milli,
            models: 0,
        }
    }

    #[test]
    fn gaps_no_share_fits_are_wasted_and_empty_gpus_are_not() {
        let pods: Vec<PodShape> = [810, 810, 470, 470].map(share).to_vec();
        let o = Outlook::new(&pods, &[NodeState::new(8000, 1 << 30, 8, 0)]);
        assert_eq!(o.waste(1000), 0.0);
        // Nothing fits in 190: it stays.
        assert_eq!(o.waste(190), 190.0);
        // 530 is filled by a 470 (leaving 60, which nothing fills).
        assert!((o.waste(530) - 60.0).abs() < 1e-9, "{}", o.waste(530));
        assert!(o.waste(530) < o.waste(190) + 1.0);
    }

    #[test]
    fn stranding_and_pressure() {
        let mut t4 = share(1000);
        t4.models = 0b10;
        let pods = vec![share(1000), t4.clone(), t4];
        let nodes = vec![
            NodeState::new(8000, 1 << 30, 8, 0),
            NodeState::new(8000, 1 << 30, 2, 1),
        ];
        let o = Outlook::new(&pods, &nodes);
        // One GPU per core asked: 8 free GPUs and 2 cores left strand 6.
        assert!((o.stranded(2000, &[1000; 8]) - 6000.0).abs() < 1e-6);
        // Model 1 is wanted by constrained tasks; an unconstrained task pays
        // for taking it, a constrained one does not.
        assert!(o.pressure_cost(&share(1000), 1) > 0.0);
        assert_eq!(o.pressure_cost(&share(1000), 0), 0.0);
        assert_eq!(o.pressure_cost(&pods[1], 1), 0.0);
    }
}
