//! Job and queue files as people write them.
//!
//! The stored form of a job is [`crate::wire::JobSpec`] with one canonical spelling per
//! field. A file may use the scenario format's shorter words, which are folded into that
//! form here: `gpu: 8` for eight whole GPUs, `gpu_milli: 250` (and `gpu_memory: 20Gi`)
//! for a fraction of one, `mig: 3g.40gb` for a MIG instance, `gpu_models: [H100-80GB]`
//! with any of them, `replicas: 64` for 64 tasks alike, and `cpu: 4` / `memory: 16Gi`
//! in resources. The canonical forms (`gpu: {whole: {count: 8}}`, YAML's
//! `gpu: !whole {count: 8}`, `cpu_milli: 4000`) stay accepted.
//!
//! Everything here is parsing: an error names the field and the value and says what to
//! write instead.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use tessera_model::{GpuRequest, Resources, quantity};

/// The most tasks a job may have, `replicas` counted.
pub const MAX_TASKS: u32 = 10_000;

/// `gpu:` on a task: a whole-GPU count, `none`, or the canonical tagged form.
pub fn gpu_as_written<'de, D: Deserializer<'de>>(d: D) -> Result<GpuRequest, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = GpuRequest;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(
                "a number of whole GPUs (gpu: 8), none, or {whole: {count: N}} / \
                 {shared: {milli: M}} / {mig: {profile: P}} (for a fraction write \
                 gpu_milli: M, for MIG mig: PROFILE)",
            )
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<GpuRequest, E> {
            match u32::try_from(n) {
                Ok(0) => Ok(GpuRequest::None),
                Ok(count) => Ok(GpuRequest::Whole {
                    count,
                    models: Vec::new(),
                }),
                Err(_) => Err(E::custom(format!("{n} GPUs is more than any node has"))),
            }
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<GpuRequest, E> {
            match u64::try_from(n) {
                Ok(n) => self.visit_u64(n),
                Err(_) => Err(E::custom(format!(
                    "{n} is not a number of GPUs: give 0 or more"
                ))),
            }
        }
        fn visit_f64<E: de::Error>(self, x: f64) -> Result<GpuRequest, E> {
            if x.fract() == 0.0 && x >= 0.0 && x <= f64::from(u32::MAX) {
                return self.visit_u64(x as u64);
            }
            Err(E::custom(format!(
                "{x} is not a whole number of GPUs: for a fraction of one GPU write \
                 gpu_milli: {} instead",
                (x.fract().abs() * 1000.0).round()
            )))
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<GpuRequest, E> {
            match s {
                "none" => Ok(GpuRequest::None),
                _ => match s.parse::<u64>() {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "{:?} is not a GPU request: write a number of whole GPUs \
                         (gpu: 8), mig: {} for a MIG instance, or gpu_milli: M for a \
                         fraction",
                        crate::problem::quote(s),
                        if s.contains('g') { s } else { "3g.40gb" }
                    ))),
                },
            }
        }
        fn visit_unit<E: de::Error>(self) -> Result<GpuRequest, E> {
            Ok(GpuRequest::None)
        }
        fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<GpuRequest, A::Error> {
            GpuRequest::deserialize(de::value::MapAccessDeserializer::new(map))
        }
        fn visit_enum<A: de::EnumAccess<'de>>(self, e: A) -> Result<GpuRequest, A::Error> {
            GpuRequest::deserialize(de::value::EnumAccessDeserializer::new(e))
        }
    }
    d.deserialize_any(V)
}

/// A number, or a quantity with a unit, as a job or scenario file writes it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Amount {
    Int(u64),
    Float(f64),
    Text(String),
}

impl Amount {
    fn bytes(&self, field: &str) -> Result<u64, String> {
        match self {
            Amount::Int(n) => Ok(*n),
            Amount::Float(x) if x.fract() == 0.0 && *x >= 0.0 => Ok(*x as u64),
            Amount::Float(x) => Err(format!(
                "{field}: {x} is not a number of bytes: write bytes or a unit, e.g. 16Gi or 512M"
            )),
            Amount::Text(s) => quantity::parse_bytes(s).map_err(|e| format!("{field}: {e}")),
        }
    }
    fn milli(&self, field: &str) -> Result<u64, String> {
        match self {
            Amount::Int(n) => n
                .checked_mul(1000)
                .ok_or_else(|| format!("{field}: {n} is too large")),
            Amount::Float(x) if x.is_finite() && *x >= 0.0 && *x < 1e15 => {
                Ok((x * 1000.0).round() as u64)
            }
            Amount::Float(x) => Err(format!("{field}: {x} is not a quantity: give 0 or more")),
            Amount::Text(s) => quantity::parse_cpu_milli(s).map_err(|e| format!("{field}: {e}")),
        }
    }
}

/// `resources:` (and a queue's `guarantee`/`capability`) with the scenario format's words
/// beside the canonical ones.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ResourcesAsWritten {
    /// Cores: `4`, `0.5`, `"500m"`.
    cpu: Option<Amount>,
    cpu_milli: Option<u64>,
    /// Bytes or a quantity: `16Gi`, `512M`.
    memory: Option<Amount>,
    /// GPUs, fractions allowed (quotas): `8`, `0.5`.
    gpu: Option<Amount>,
    gpu_milli: Option<u64>,
    gpu_memory: Option<Amount>,
    pods: Option<u64>,
    extended: BTreeMap<String, u64>,
}

impl ResourcesAsWritten {
    fn into_resources(self) -> Result<Resources, String> {
        fn one<T>(a: Option<T>, b: Option<u64>, names: (&str, &str)) -> Result<(), String> {
            if a.is_some() && b.is_some() {
                return Err(format!(
                    "{} and {} say the same thing: give one of them",
                    names.0, names.1
                ));
            }
            Ok(())
        }
        one(self.cpu.as_ref(), self.cpu_milli, ("cpu", "cpu_milli"))?;
        one(self.gpu.as_ref(), self.gpu_milli, ("gpu", "gpu_milli"))?;
        let cpu_milli = match (&self.cpu, self.cpu_milli) {
            (Some(c), _) => c.milli("cpu")?,
            (None, m) => m.unwrap_or(0),
        };
        let gpu_milli = match (&self.gpu, self.gpu_milli) {
            (Some(g), _) => g.milli("gpu")?,
            (None, m) => m.unwrap_or(0),
        };
        Ok(Resources {
            cpu_milli,
            memory: self
                .memory
                .map(|m| m.bytes("memory"))
                .transpose()?
                .unwrap_or(0),
            gpu_milli,
            gpu_memory: self
                .gpu_memory
                .map(|m| m.bytes("gpu_memory"))
                .transpose()?
                .unwrap_or(0),
            pods: self.pods.unwrap_or(0),
            extended: self.extended,
        })
    }
}

/// Resources in either spelling (`cpu: 4` or `cpu_milli: 4000`, `memory: 16Gi` or bytes).
pub fn resources_as_written<'de, D: Deserializer<'de>>(d: D) -> Result<Resources, D::Error> {
    ResourcesAsWritten::deserialize(d)?
        .into_resources()
        .map_err(de::Error::custom)
}

/// The same for an optional field.
pub fn opt_resources_as_written<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Resources>, D::Error> {
    Option::<ResourcesAsWritten>::deserialize(d)?
        .map(ResourcesAsWritten::into_resources)
        .transpose()
        .map_err(de::Error::custom)
}

/// A task's short GPU words, before [`crate::wire::JobSpec::normalize`] folds them into
/// `gpu`. Never stored: a normalized task has none of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuShorthand {
    pub gpu_milli: Option<u32>,
    pub gpu_memory: Option<Amount>,
    pub gpu_models: Option<Vec<String>>,
    pub mig: Option<String>,
}

impl GpuShorthand {
    pub fn is_empty(&self) -> bool {
        *self == GpuShorthand::default()
    }

    /// The canonical request from `gpu` and these words; an error is (field, message).
    pub fn fold(self, gpu: GpuRequest) -> Result<GpuRequest, (&'static str, String)> {
        let models = self.gpu_models.unwrap_or_default();
        let gpu_memory = match &self.gpu_memory {
            Some(m) => Some(m.bytes("gpu_memory").map_err(|e| ("gpu_memory", e))?),
            None => None,
        };
        let given = !matches!(gpu, GpuRequest::None);
        match (self.gpu_milli, self.mig) {
            (Some(_), Some(_)) => Err((
                "mig",
                "mig and gpu_milli ask for different things: a MIG instance or a \
                 fraction of a whole GPU; give one"
                    .into(),
            )),
            (Some(_), None) | (None, Some(_)) if given => Err((
                "gpu",
                "gpu and gpu_milli/mig together: give gpu for whole GPUs, gpu_milli for \
                 a fraction of one, or mig for a MIG instance"
                    .into(),
            )),
            (Some(milli), None) => {
                if !(1..=999).contains(&milli) {
                    return Err((
                        "gpu_milli",
                        format!(
                            "{milli} is not a fraction of a GPU: use 1 to 999 (for whole \
                             GPUs write gpu: {})",
                            milli.div_ceil(1000)
                        ),
                    ));
                }
                Ok(GpuRequest::Shared {
                    milli,
                    memory: gpu_memory.unwrap_or(0),
                    models,
                })
            }
            (None, Some(profile)) => {
                if gpu_memory.is_some() {
                    return Err((
                        "gpu_memory",
                        "a MIG instance's memory is its profile's: drop gpu_memory".into(),
                    ));
                }
                Ok(GpuRequest::Mig { profile, models })
            }
            (None, None) => {
                if gpu_memory.is_some() {
                    return Err((
                        "gpu_memory",
                        "gpu_memory without gpu_milli: give the fraction too (gpu_milli: \
                         1 to 999)"
                            .into(),
                    ));
                }
                match gpu {
                    GpuRequest::None if !models.is_empty() => Err((
                        "gpu_models",
                        "gpu_models without a GPU request: add gpu, gpu_milli or mig".into(),
                    )),
                    g if models.is_empty() => Ok(g),
                    GpuRequest::Whole { count, models: m } if m.is_empty() => {
                        Ok(GpuRequest::Whole { count, models })
                    }
                    _ => Err((
                        "gpu_models",
                        "the GPU models are given twice (gpu_models and inside gpu): give \
                         them once"
                            .into(),
                    )),
                }
            }
        }
    }
}
