//! Resource quantities with checked arithmetic.
//!
//! All quantities are unsigned integers in their smallest unit: milli-CPU, bytes of
//! memory, milli-GPU (one whole GPU is 1000), bytes of GPU memory, pods, and named
//! extended resources. A subtraction that would go below zero is a bug in the
//! caller's accounting, so the arithmetic is checked and says so instead of wrapping.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::quantity::{format_bytes, format_milli};

/// One dimension of [`Resources`], used in reasons ("insufficient gpu").
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dim {
    Cpu,
    Memory,
    Gpu,
    GpuMemory,
    Pods,
    Extended(String),
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Cpu => f.write_str("cpu"),
            Dim::Memory => f.write_str("memory"),
            Dim::Gpu => f.write_str("gpu"),
            Dim::GpuMemory => f.write_str("gpu_memory"),
            Dim::Pods => f.write_str("pods"),
            Dim::Extended(n) => f.write_str(n),
        }
    }
}

/// A vector of resource quantities.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Resources {
    /// Milli-CPU (1000 = one core).
    pub cpu_milli: u64,
    /// Bytes of main memory.
    pub memory: u64,
    /// Milli-GPU: 1000 is one whole GPU; a fraction of one GPU is less than 1000.
    pub gpu_milli: u64,
    /// Bytes of GPU memory.
    pub gpu_memory: u64,
    /// Number of pods (tasks).
    pub pods: u64,
    /// Named extended resources (`example.com/fpga`), as counts.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, u64>,
}

impl Resources {
    pub const ZERO: Resources = Resources {
        cpu_milli: 0,
        memory: 0,
        gpu_milli: 0,
        gpu_memory: 0,
        pods: 0,
        extended: BTreeMap::new(),
    };

    pub fn new(cpu_milli: u64, memory: u64) -> Self {
        Resources {
            cpu_milli,
            memory,
            ..Default::default()
        }
    }

    pub fn with_gpu_milli(mut self, gpu_milli: u64) -> Self {
        self.gpu_milli = gpu_milli;
        self
    }

    pub fn with_pods(mut self, pods: u64) -> Self {
        self.pods = pods;
        self
    }

    pub fn is_zero(&self) -> bool {
        self.cpu_milli == 0
            && self.memory == 0
            && self.gpu_milli == 0
            && self.gpu_memory == 0
            && self.pods == 0
            && self.extended.values().all(|&v| v == 0)
    }

    /// True when this request asks for nothing but a pod slot (a best-effort task).
    pub fn is_best_effort(&self) -> bool {
        self.cpu_milli == 0
            && self.memory == 0
            && self.gpu_milli == 0
            && self.gpu_memory == 0
            && self.extended.values().all(|&v| v == 0)
    }

    /// `self + other`, or `None` on overflow.
    pub fn checked_add(&self, other: &Resources) -> Option<Resources> {
        let mut extended = self.extended.clone();
        for (k, v) in &other.extended {
            let e = extended.entry(k.clone()).or_insert(0);
            *e = e.checked_add(*v)?;
        }
        Some(Resources {
            cpu_milli: self.cpu_milli.checked_add(other.cpu_milli)?,
            memory: self.memory.checked_add(other.memory)?,
            gpu_milli: self.gpu_milli.checked_add(other.gpu_milli)?,
            gpu_memory: self.gpu_memory.checked_add(other.gpu_memory)?,
            pods: self.pods.checked_add(other.pods)?,
            extended,
        })
    }

    /// `self - other`, or `None` if any dimension would go below zero.
    pub fn checked_sub(&self, other: &Resources) -> Option<Resources> {
        let mut extended = self.extended.clone();
        for (k, v) in &other.extended {
            if *v == 0 {
                continue;
            }
            let e = extended.get_mut(k)?;
            *e = e.checked_sub(*v)?;
        }
        Some(Resources {
            cpu_milli: self.cpu_milli.checked_sub(other.cpu_milli)?,
            memory: self.memory.checked_sub(other.memory)?,
            gpu_milli: self.gpu_milli.checked_sub(other.gpu_milli)?,
            gpu_memory: self.gpu_memory.checked_sub(other.gpu_memory)?,
            pods: self.pods.checked_sub(other.pods)?,
            extended,
        })
    }

    /// Adds in place, saturating at `u64::MAX` (for totals over many objects).
    pub fn add_assign_saturating(&mut self, other: &Resources) {
        self.cpu_milli = self.cpu_milli.saturating_add(other.cpu_milli);
        self.memory = self.memory.saturating_add(other.memory);
        self.gpu_milli = self.gpu_milli.saturating_add(other.gpu_milli);
        self.gpu_memory = self.gpu_memory.saturating_add(other.gpu_memory);
        self.pods = self.pods.saturating_add(other.pods);
        for (k, v) in &other.extended {
            let e = self.extended.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
    }

    /// Subtracts in place, stopping at zero in each dimension.
    pub fn sub_assign_saturating(&mut self, other: &Resources) {
        self.cpu_milli = self.cpu_milli.saturating_sub(other.cpu_milli);
        self.memory = self.memory.saturating_sub(other.memory);
        self.gpu_milli = self.gpu_milli.saturating_sub(other.gpu_milli);
        self.gpu_memory = self.gpu_memory.saturating_sub(other.gpu_memory);
        self.pods = self.pods.saturating_sub(other.pods);
        for (k, v) in &other.extended {
            if let Some(e) = self.extended.get_mut(k) {
                *e = e.saturating_sub(*v);
            }
        }
    }

    /// True when every dimension of `self` is at most the same dimension of `other`.
    pub fn fits_in(&self, other: &Resources) -> bool {
        self.cpu_milli <= other.cpu_milli
            && self.memory <= other.memory
            && self.gpu_milli <= other.gpu_milli
            && self.gpu_memory <= other.gpu_memory
            && self.pods <= other.pods
            && self
                .extended
                .iter()
                .all(|(k, v)| *v == 0 || other.extended.get(k).is_some_and(|o| v <= o))
    }

    /// The dimensions in which `self` exceeds `other`.
    pub fn exceeding(&self, other: &Resources) -> Vec<Dim> {
        let mut out = Vec::new();
        if self.cpu_milli > other.cpu_milli {
            out.push(Dim::Cpu);
        }
        if self.memory > other.memory {
            out.push(Dim::Memory);
        }
        if self.gpu_milli > other.gpu_milli {
            out.push(Dim::Gpu);
        }
        if self.gpu_memory > other.gpu_memory {
            out.push(Dim::GpuMemory);
        }
        if self.pods > other.pods {
            out.push(Dim::Pods);
        }
        for (k, v) in &self.extended {
            if *v > other.extended.get(k).copied().unwrap_or(0) {
                out.push(Dim::Extended(k.clone()));
            }
        }
        out
    }

    /// Dimension-wise minimum.
    pub fn min(&self, other: &Resources) -> Resources {
        let mut extended = BTreeMap::new();
        for (k, v) in &self.extended {
            let o = other.extended.get(k).copied().unwrap_or(0);
            extended.insert(k.clone(), (*v).min(o));
        }
        Resources {
            cpu_milli: self.cpu_milli.min(other.cpu_milli),
            memory: self.memory.min(other.memory),
            gpu_milli: self.gpu_milli.min(other.gpu_milli),
            gpu_memory: self.gpu_memory.min(other.gpu_memory),
            pods: self.pods.min(other.pods),
            extended,
        }
    }

    /// Dimension-wise maximum.
    pub fn max(&self, other: &Resources) -> Resources {
        let mut extended = self.extended.clone();
        for (k, v) in &other.extended {
            let e = extended.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        Resources {
            cpu_milli: self.cpu_milli.max(other.cpu_milli),
            memory: self.memory.max(other.memory),
            gpu_milli: self.gpu_milli.max(other.gpu_milli),
            gpu_memory: self.gpu_memory.max(other.gpu_memory),
            pods: self.pods.max(other.pods),
            extended,
        }
    }

    /// The values of every dimension, named, in a fixed order (extended last, by name).
    pub fn dims(&self) -> impl Iterator<Item = (Dim, u64)> + '_ {
        [
            (Dim::Cpu, self.cpu_milli),
            (Dim::Memory, self.memory),
            (Dim::Gpu, self.gpu_milli),
            (Dim::GpuMemory, self.gpu_memory),
            (Dim::Pods, self.pods),
        ]
        .into_iter()
        .chain(
            self.extended
                .iter()
                .map(|(k, v)| (Dim::Extended(k.clone()), *v)),
        )
    }

    /// The value of one dimension.
    pub fn get(&self, d: &Dim) -> u64 {
        match d {
            Dim::Cpu => self.cpu_milli,
            Dim::Memory => self.memory,
            Dim::Gpu => self.gpu_milli,
            Dim::GpuMemory => self.gpu_memory,
            Dim::Pods => self.pods,
            Dim::Extended(n) => self.extended.get(n).copied().unwrap_or(0),
        }
    }

    /// Sets one dimension.
    pub fn set(&mut self, d: &Dim, v: u64) {
        match d {
            Dim::Cpu => self.cpu_milli = v,
            Dim::Memory => self.memory = v,
            Dim::Gpu => self.gpu_milli = v,
            Dim::GpuMemory => self.gpu_memory = v,
            Dim::Pods => self.pods = v,
            Dim::Extended(n) => {
                self.extended.insert(n.clone(), v);
            }
        }
    }

    /// The dominant share of `self` against `total`: the largest fraction over the
    /// dimensions in which `total` is non-zero (0.0 when nothing is used).
    /// Pods are not counted: a pod slot is not a resource anyone competes for.
    pub fn dominant_share(&self, total: &Resources) -> f64 {
        let mut share: f64 = 0.0;
        for (d, v) in self.dims() {
            if d == Dim::Pods || v == 0 {
                continue;
            }
            let t = total.get(&d);
            let s = if t == 0 {
                f64::INFINITY
            } else {
                v as f64 / t as f64
            };
            share = share.max(s);
        }
        share
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if self.cpu_milli > 0 {
            parts.push(format!("cpu {}", format_milli(self.cpu_milli)));
        }
        if self.memory > 0 {
            parts.push(format!("memory {}", format_bytes(self.memory)));
        }
        if self.gpu_milli > 0 {
            parts.push(format!("gpu {}", format_milli(self.gpu_milli)));
        }
        if self.gpu_memory > 0 {
            parts.push(format!("gpu_memory {}", format_bytes(self.gpu_memory)));
        }
        if self.pods > 0 {
            parts.push(format!("pods {}", self.pods));
        }
        for (k, v) in &self.extended {
            if *v > 0 {
                parts.push(format!("{k} {v}"));
            }
        }
        if parts.is_empty() {
            f.write_str("nothing")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn res() -> impl Strategy<Value = Resources> {
        (
            0u64..1 << 40,
            0u64..1 << 50,
            0u64..16_000,
            0u64..1 << 40,
            0u64..200,
        )
            .prop_map(|(c, m, g, gm, p)| Resources {
                cpu_milli: c,
                memory: m,
                gpu_milli: g,
                gpu_memory: gm,
                pods: p,
                extended: BTreeMap::new(),
            })
    }

    proptest! {
        #[test]
        fn add_then_sub_is_identity(a in res(), b in res()) {
            let s = a.checked_add(&b).unwrap();
            prop_assert_eq!(s.checked_sub(&b), Some(a.clone()));
            prop_assert!(a.fits_in(&s));
        }
        #[test]
        fn sub_fails_iff_not_fits(a in res(), b in res()) {
            prop_assert_eq!(a.checked_sub(&b).is_some(), b.fits_in(&a));
            prop_assert_eq!(b.exceeding(&a).is_empty(), b.fits_in(&a));
        }
    }

    #[test]
    fn overflow_is_caught() {
        let a = Resources::new(u64::MAX, 0);
        assert!(a.checked_add(&Resources::new(1, 0)).is_none());
        assert!(
            Resources::new(0, 0)
                .checked_sub(&Resources::new(1, 0))
                .is_none()
        );
    }

    #[test]
    fn extended_resources() {
        let mut a = Resources::default();
        a.extended.insert("x/fpga".into(), 2);
        let mut b = Resources::default();
        b.extended.insert("x/fpga".into(), 3);
        assert!(a.fits_in(&b));
        assert!(!b.fits_in(&a));
        assert_eq!(b.exceeding(&a), vec![Dim::Extended("x/fpga".into())]);
        assert!(b.checked_sub(&a).is_some());
        assert!(a.checked_sub(&b).is_none());
    }

    #[test]
    fn display() {
        let r = Resources::new(1500, 16 << 30).with_gpu_milli(2000);
        assert_eq!(r.to_string(), "cpu 1.5, memory 16Gi, gpu 2");
    }
}
