//! GPU faults at the node: Xid and ECC events (NVML's event set, behind
//! [`FaultSource`] so tests inject them) classified by
//! [`tessera_gpushare::health::classify`]. A fault confined to one task's context
//! is counted and left to that task's end; a fault of the GPU marks it unhealthy
//! in the node's [`FaultBook`]: the node reports a `GpuUnhealthy` condition
//! naming it, refuses to start work on it, and the server marks the GPU in the
//! node record (`GpuDevice::unhealthy`) so the scheduler places nothing new there.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

pub use tessera_gpushare::health::{FaultKind, GpuFault, Verdict, classify};

use crate::health::{Condition, ConditionKind};

/// Where fault events come from.
pub trait FaultSource: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    /// The events since the last call (does not block).
    fn poll(&self) -> Result<Vec<GpuFault>, String>;
}

/// NVML's Xid / ECC event set for the node's GPUs.
#[derive(Debug)]
pub struct NvmlFaults(Mutex<tessera_gpushare::health::FaultWatcher>);

impl NvmlFaults {
    /// Watches GPUs `indices`; `Err` where NVML or its events are not there.
    pub fn open(indices: &[u32]) -> Result<NvmlFaults, String> {
        tessera_gpushare::health::FaultWatcher::open(indices)
            .map(|w| NvmlFaults(Mutex::new(w)))
            .map_err(|e| e.to_string())
    }
}

impl FaultSource for NvmlFaults {
    fn name(&self) -> &str {
        "nvml"
    }
    fn poll(&self) -> Result<Vec<GpuFault>, String> {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        // Bounded: a storm of events is read over several heartbeats.
        while out.len() < 256 {
            match w.next(Duration::ZERO).map_err(|e| e.to_string())? {
                Some(f) => out.push(f),
                None => break,
            }
        }
        Ok(out)
    }
}

/// Events a test pushes.
#[derive(Debug, Default)]
pub struct FakeFaults(Mutex<Vec<GpuFault>>);

impl FakeFaults {
    pub fn push(&self, f: GpuFault) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(f);
    }
}

impl FaultSource for FakeFaults {
    fn name(&self) -> &str {
        "fake"
    }
    fn poll(&self) -> Result<Vec<GpuFault>, String> {
        Ok(std::mem::take(
            &mut *self.0.lock().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

/// What the node knows of its GPUs' faults.
#[derive(Debug, Default)]
pub struct FaultBook {
    unhealthy: Mutex<BTreeMap<u32, String>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl FaultBook {
    /// Takes one fault in; returns its verdict.
    pub fn record(&self, f: &GpuFault) -> Verdict {
        let v = classify(&f.kind);
        let (bucket, reason) = match &v {
            Verdict::TaskOnly { reason } => ("task_only", *reason),
            Verdict::GpuUnhealthy { reason } => ("gpu_unhealthy", *reason),
            Verdict::Note { reason } => ("note", *reason),
        };
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(bucket)
            .or_default() += 1;
        if matches!(v, Verdict::GpuUnhealthy { .. }) {
            self.unhealthy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(f.device_index)
                .or_insert_with(|| reason.to_string());
        }
        v
    }

    /// GPUs marked unhealthy, by index, with the first reason.
    pub fn unhealthy(&self) -> BTreeMap<u32, String> {
        self.unhealthy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Faults seen, by verdict (`task_only`, `gpu_unhealthy`, `note`).
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The `GpuUnhealthy` condition for the GPUs marked. Pure.
pub fn condition(unhealthy: &BTreeMap<u32, String>) -> Condition {
    if unhealthy.is_empty() {
        return Condition {
            kind: ConditionKind::GpuUnhealthy,
            status: false,
            reason: "NoGpuFaults".into(),
            message: String::new(),
        };
    }
    Condition {
        kind: ConditionKind::GpuUnhealthy,
        status: true,
        reason: "GpuFault".into(),
        message: unhealthy
            .iter()
            .map(|(i, r)| format!("GPU {i}: {r}"))
            .collect::<Vec<_>>()
            .join("; ")
            + "; no new work is placed on it until an operator clears the mark",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(gpu: u32, kind: FaultKind) -> GpuFault {
        GpuFault {
            device_index: gpu,
            uuid: None,
            kind,
        }
    }

    #[test]
    fn gpu_faults_mark_the_gpu_and_task_faults_do_not() {
        let src = FakeFaults::default();
        src.push(fault(0, FaultKind::Xid(Some(31))));
        src.push(fault(1, FaultKind::Xid(Some(79))));
        src.push(fault(2, FaultKind::SingleBitEcc));
        src.push(fault(1, FaultKind::DoubleBitEcc));
        let book = FaultBook::default();
        for f in src.poll().unwrap() {
            book.record(&f);
        }
        assert!(src.poll().unwrap().is_empty(), "drained");
        let u = book.unhealthy();
        assert_eq!(u.keys().copied().collect::<Vec<_>>(), [1]);
        assert!(u[&1].contains("Xid 79"), "the first reason stays: {u:?}");
        let c = condition(&u);
        assert!(c.status && c.message.contains("GPU 1: Xid 79"), "{c:?}");
        assert!(!condition(&BTreeMap::new()).status);
        let n = book.counts();
        assert_eq!((n["task_only"], n["gpu_unhealthy"], n["note"]), (1, 2, 1));
    }
}
