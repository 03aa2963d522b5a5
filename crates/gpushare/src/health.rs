//! GPU faults, for the node runtime: Xid and ECC events from NVML
//! ([`FaultWatcher`]) and what each means ([`classify`]): a fault of one task's
//! own work (the driver has already killed that task's context, and only its;
//! its region's memory comes back through the dead-process reclaim) or a fault
//! of the GPU (report a node condition and place no more work on that GPU).
//! Fractional tasks share a GPU but not contexts: one task's illegal address or
//! hung kernel ends that task's context, not its neighbours'.

use std::path::Path;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use serde::Serialize;

use crate::nvml::UsageError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A critical Xid (`None`: NVML did not say which).
    Xid(Option<u64>),
    DoubleBitEcc,
    SingleBitEcc,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuFault {
    pub device_index: u32,
    pub uuid: Option<String>,
    pub kind: FaultKind,
}

/// What the node does about a fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// One task's own error: its context is gone, the GPU is fine. Nothing for
    /// the node to do beyond what the task's death already triggers.
    TaskOnly { reason: &'static str },
    /// The GPU needs attention (reset, replacement): set a node condition naming
    /// the GPU and stop placing work on it.
    GpuUnhealthy { reason: &'static str },
    /// Worth a metric, not an action.
    Note { reason: &'static str },
}

/// Pure: the verdict for a fault. Xids not listed are treated as the GPU's
/// (cordoning a healthy GPU costs capacity; placing work on a broken one costs
/// the work).
pub fn classify(kind: &FaultKind) -> Verdict {
    use Verdict::*;
    match kind {
        FaultKind::DoubleBitEcc => GpuUnhealthy {
            reason: "double-bit ECC error",
        },
        FaultKind::SingleBitEcc => Note {
            reason: "single-bit ECC error (corrected)",
        },
        FaultKind::Xid(None) => GpuUnhealthy {
            reason: "critical Xid of unknown number",
        },
        FaultKind::Xid(Some(x)) => match x {
            13 => TaskOnly {
                reason: "Xid 13: graphics engine exception (the application's kernel)",
            },
            31 => TaskOnly {
                reason: "Xid 31: GPU memory page fault (the application's access)",
            },
            43 => TaskOnly {
                reason: "Xid 43: GPU stopped processing the application's channel",
            },
            45 => TaskOnly {
                reason: "Xid 45: preemptive cleanup after an earlier error",
            },
            68 | 69 => TaskOnly {
                reason: "Xid 68/69: video or graphics engine exception of one context",
            },
            94 => TaskOnly {
                reason: "Xid 94: contained ECC error (only the context that used the memory is ended)",
            },
            48 => GpuUnhealthy {
                reason: "Xid 48: double-bit ECC error",
            },
            63 | 64 => GpuUnhealthy {
                reason: "Xid 63/64: ECC page retirement or row remapping",
            },
            74 => GpuUnhealthy {
                reason: "Xid 74: NVLink error",
            },
            79 => GpuUnhealthy {
                reason: "Xid 79: GPU has fallen off the bus",
            },
            92 => GpuUnhealthy {
                reason: "Xid 92: high single-bit ECC error rate",
            },
            95 => GpuUnhealthy {
                reason: "Xid 95: uncontained ECC error (GPU reset needed)",
            },
            119 | 120 => GpuUnhealthy {
                reason: "Xid 119/120: GSP firmware error or timeout",
            },
            _ => GpuUnhealthy {
                reason: "critical Xid not known to be confined to one task",
            },
        },
    }
}

/// NVML's event set for the node's GPUs.
pub struct FaultWatcher {
    // The set borrows the NVML handle; both live on the heap, the set is dropped
    // first (field order).
    set: nvml_wrapper::event::EventSet<'static>,
    _nvml: Box<Nvml>,
}

impl std::fmt::Debug for FaultWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultWatcher").finish_non_exhaustive()
    }
}

impl FaultWatcher {
    /// Watches devices `indices` of the system's NVML.
    pub fn open(indices: &[u32]) -> Result<Self, UsageError> {
        Self::with(Nvml::init()?, indices)
    }

    /// Watches devices `indices` of a given NVML library (the CI fake).
    pub fn open_library(path: &Path, indices: &[u32]) -> Result<Self, UsageError> {
        Self::with(Nvml::builder().lib_path(path.as_os_str()).init()?, indices)
    }

    fn with(nvml: Nvml, indices: &[u32]) -> Result<Self, UsageError> {
        let nvml = Box::new(nvml);
        // SAFETY: the Box's heap allocation does not move and outlives the set
        // (dropped first, field order); the 'static lifetime never escapes.
        let n: &'static Nvml = unsafe { &*(&*nvml as *const Nvml) };
        let mut set = n.create_event_set()?;
        for &i in indices {
            let dev = n.device_by_index(i)?;
            let want = EventTypes::CRITICAL_XID_ERROR
                | EventTypes::DOUBLE_BIT_ECC_ERROR
                | EventTypes::SINGLE_BIT_ECC_ERROR;
            let supported = dev.supported_event_types()?;
            set = dev
                .register_events(want & supported, set)
                .map_err(|e| UsageError::Nvml(e.error))?;
        }
        Ok(FaultWatcher { set, _nvml: nvml })
    }

    /// The next fault, or `None` after `timeout` without one.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<GpuFault>, UsageError> {
        let ms = timeout.as_millis().min(u32::MAX as u128) as u32;
        let ev = match self.set.wait(ms) {
            Ok(ev) => ev,
            Err(NvmlError::Timeout) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let kind = if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            FaultKind::Xid(match ev.event_data {
                Some(XidError::Value(v)) => Some(v),
                _ => None,
            })
        } else if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            FaultKind::DoubleBitEcc
        } else {
            FaultKind::SingleBitEcc
        };
        Ok(Some(GpuFault {
            device_index: ev.device.index()?,
            uuid: ev.device.uuid().ok(),
            kind,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_faults_stay_with_the_task_and_gpu_faults_cordon() {
        assert!(matches!(
            classify(&FaultKind::Xid(Some(31))),
            Verdict::TaskOnly { .. }
        ));
        assert!(matches!(
            classify(&FaultKind::Xid(Some(43))),
            Verdict::TaskOnly { .. }
        ));
        for x in [48, 63, 74, 79, 95, 119, 12345] {
            assert!(
                matches!(
                    classify(&FaultKind::Xid(Some(x))),
                    Verdict::GpuUnhealthy { .. }
                ),
                "{x}"
            );
        }
        assert!(matches!(
            classify(&FaultKind::DoubleBitEcc),
            Verdict::GpuUnhealthy { .. }
        ));
        assert!(matches!(
            classify(&FaultKind::SingleBitEcc),
            Verdict::Note { .. }
        ));
    }
}
