//! MIG actuation: make the GPU's partitioning what a binding's MIG step says
//! (create an instance in free slices; re-partition: destroy idle instances, then
//! create), idempotent and resumable.
//!
//! The protocol: the intent is written to a journal (and synced) before the first
//! change; each change is applied only if the live state still needs it (an instance
//! already there is not created twice, one already gone is not destroyed twice); the
//! intent is removed once done. After a crash, [`Actuator::reconcile`] finishes what
//! the journal still holds. An instance a running task holds is never destroyed: the
//! step is refused, naming it. Without a backend (no NVML, no `nvidia-smi`) every step
//! that would change something is a no-op with that reason.
//!
//! Backends sit behind [`MigBackend`]: [`FakeMig`] (in memory, with a crash point, for
//! tests) and [`NvidiaSmiMig`] (`nvidia-smi mig -cgi/-dci/-dgi`: the `nvml-wrapper`
//! crate has no safe call to create GPU instances). A lent GPU is for read-only
//! checks only: nothing here ever runs against one in this project's tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tessera_model::{MigRef, MigStep};

/// One GPU instance (with its compute instance) as the backend reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub profile: String,
    pub start: u8,
    pub gi: u32,
}

/// A MIG backend failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    #[error("GPU {gpu}: {message}")]
    Backend { gpu: u32, message: String },
    #[error(
        "GPU {gpu}: refusing to destroy MIG instance {instance}: task {task} holds it; the step waits until it ends"
    )]
    Held {
        gpu: u32,
        instance: String,
        task: String,
    },
    #[error("MIG journal {path}: {message}")]
    Journal { path: String, message: String },
}

/// What a MIG backend can do on one GPU.
pub trait MigBackend: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    fn list(&self, gpu: u32) -> Result<Vec<Instance>, MigError>;
    /// Creates a GPU instance of `profile` at `start` and its default compute instance.
    fn create(&self, gpu: u32, profile: &str, start: u8) -> Result<Instance, MigError>;
    /// Destroys the GPU instance `gi` (its compute instances first).
    fn destroy(&self, gpu: u32, gi: u32) -> Result<(), MigError>;
}

/// What applying a step did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    /// Nothing to change: the instance is there.
    Present,
    /// Changes made: instances destroyed, then created.
    Changed {
        destroyed: Vec<String>,
        created: Option<String>,
    },
    /// Not applied, and why (no backend on this node).
    Skipped(String),
}

/// One pending step in the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// Who asked (the task key), for diagnostics.
    pub owner: String,
    pub gpu: u32,
    pub step: MigStep,
}

/// Applies MIG steps through a backend, with a journal for crash recovery.
#[derive(Debug)]
pub struct Actuator {
    backend: Option<Arc<dyn MigBackend>>,
    journal: PathBuf,
    lock: Mutex<()>,
}

/// Instances held by running tasks: (GPU, profile, start) -> task.
pub type Held = std::collections::BTreeMap<(u32, String, u8), String>;

impl Actuator {
    /// `journal`: a file this node keeps (made on first use).
    pub fn new(backend: Option<Arc<dyn MigBackend>>, journal: PathBuf) -> Self {
        Actuator {
            backend,
            journal,
            lock: Mutex::new(()),
        }
    }

    pub fn backend(&self) -> Option<&Arc<dyn MigBackend>> {
        self.backend.as_ref()
    }

    /// The steps the journal holds (not yet finished).
    pub fn pending(&self) -> Result<Vec<Intent>, MigError> {
        read_journal(&self.journal)
    }

    /// Makes GPU `gpu`'s instances what `step` says.
    pub fn apply(
        &self,
        owner: &str,
        gpu: u32,
        step: &MigStep,
        held: &Held,
    ) -> Result<Applied, MigError> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = &self.backend else {
            return Ok(if step.create || !step.destroy.is_empty() {
                Applied::Skipped(format!(
                    "no MIG backend on this node (no NVML driver / nvidia-smi): the step {} on GPU {gpu} was not applied",
                    describe(step)
                ))
            } else {
                Applied::Present
            });
        };
        // Refuse before recording anything: a held instance is never touched.
        for d in &step.destroy {
            if let Some(t) = held.get(&(gpu, d.profile.clone(), d.start)) {
                return Err(MigError::Held {
                    gpu,
                    instance: d.to_string(),
                    task: t.clone(),
                });
            }
        }
        let live = b.list(gpu)?;
        let present =
            |p: &str, s: u8, l: &[Instance]| l.iter().any(|i| i.profile == p && i.start == s);
        if present(&step.profile, step.start, &live)
            && step
                .destroy
                .iter()
                .all(|d| !present(&d.profile, d.start, &live))
        {
            return Ok(Applied::Present);
        }
        let intent = Intent {
            owner: owner.to_string(),
            gpu,
            step: step.clone(),
        };
        let mut j = read_journal(&self.journal)?;
        if !j.contains(&intent) {
            j.push(intent.clone());
            write_journal(&self.journal, &j)?;
        }
        let r = run_step(b.as_ref(), gpu, step, held)?;
        let mut j = read_journal(&self.journal)?;
        j.retain(|i| i != &intent);
        write_journal(&self.journal, &j)?;
        Ok(r)
    }

    /// Finishes the steps a crash left in the journal. Returns what each did, or why
    /// it could not (a held instance, a backend error: the intent stays).
    pub fn reconcile(&self, held: &Held) -> Vec<(Intent, Result<Applied, MigError>)> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let pending = match read_journal(&self.journal) {
            Ok(p) => p,
            Err(e) => {
                return vec![(
                    Intent {
                        owner: String::new(),
                        gpu: 0,
                        step: MigStep {
                            profile: String::new(),
                            start: 0,
                            create: false,
                            destroy: vec![],
                        },
                    },
                    Err(e),
                )];
            }
        };
        let mut out = Vec::new();
        let mut left = Vec::new();
        for i in pending {
            let r = match &self.backend {
                None => Ok(Applied::Skipped("no MIG backend on this node".into())),
                Some(b) => run_step(b.as_ref(), i.gpu, &i.step, held),
            };
            if r.is_err() {
                left.push(i.clone());
            }
            out.push((i, r));
        }
        if let Err(e) = write_journal(&self.journal, &left) {
            out.push((
                left.first().cloned().unwrap_or_else(|| out[0].0.clone()),
                Err(e),
            ));
        }
        out
    }
}

fn describe(step: &MigStep) -> String {
    let mut s = format!("{}@{}", step.profile, step.start);
    if !step.destroy.is_empty() {
        let d: Vec<String> = step.destroy.iter().map(MigRef::to_string).collect();
        s = format!("destroy {} then create {s}", d.join(", "));
    } else if step.create {
        s = format!("create {s}");
    }
    s
}

/// Runs a step against the live state: each change only where still needed.
fn run_step(
    b: &dyn MigBackend,
    gpu: u32,
    step: &MigStep,
    held: &Held,
) -> Result<Applied, MigError> {
    let live = b.list(gpu)?;
    let mut destroyed = Vec::new();
    for d in &step.destroy {
        if let Some(t) = held.get(&(gpu, d.profile.clone(), d.start)) {
            return Err(MigError::Held {
                gpu,
                instance: d.to_string(),
                task: t.clone(),
            });
        }
        if let Some(i) = live
            .iter()
            .find(|i| i.profile == d.profile && i.start == d.start)
        {
            b.destroy(gpu, i.gi)?;
            destroyed.push(d.to_string());
        }
    }
    let live = b.list(gpu)?;
    let created = if live
        .iter()
        .any(|i| i.profile == step.profile && i.start == step.start)
    {
        None
    } else {
        b.create(gpu, &step.profile, step.start)?;
        Some(format!("{}@{}", step.profile, step.start))
    };
    Ok(if destroyed.is_empty() && created.is_none() {
        Applied::Present
    } else {
        Applied::Changed { destroyed, created }
    })
}

fn read_journal(path: &Path) -> Result<Vec<Intent>, MigError> {
    match std::fs::read(path) {
        Ok(b) if b.is_empty() => Ok(vec![]),
        Ok(b) => serde_json::from_slice(&b).map_err(|e| MigError::Journal {
            path: path.display().to_string(),
            message: format!("unreadable ({e}); move it aside to start afresh"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(MigError::Journal {
            path: path.display().to_string(),
            message: e.to_string(),
        }),
    }
}

/// Writes the journal durably: a temporary file, synced, renamed over the old one.
fn write_journal(path: &Path, j: &[Intent]) -> Result<(), MigError> {
    let err = |e: std::io::Error| MigError::Journal {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(err)?;
    }
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&serde_json::to_vec_pretty(j).unwrap_or_default())
            .map_err(err)?;
        f.sync_all().map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)?;
    if let Some(d) = path.parent()
        && let Ok(dir) = std::fs::File::open(d)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// An in-memory MIG backend for tests: instances per GPU, every call logged, and a
/// crash point (`crash_after` more changes, then every change fails as if the
/// process had died there).
#[derive(Debug, Default)]
pub struct FakeMig {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    gpus: std::collections::BTreeMap<u32, Vec<Instance>>,
    next_gi: u32,
    log: Vec<String>,
    crash_after: Option<u32>,
}

impl FakeMig {
    pub fn new() -> Arc<FakeMig> {
        Arc::new(FakeMig::default())
    }
    /// Puts an instance there (setup).
    pub fn insert(&self, gpu: u32, profile: &str, start: u8) {
        let mut s = self.state.lock().unwrap();
        s.next_gi += 1;
        let gi = s.next_gi;
        s.gpus.entry(gpu).or_default().push(Instance {
            profile: profile.into(),
            start,
            gi,
        });
    }
    /// After `n` more successful changes, every change fails.
    pub fn crash_after(&self, n: u32) {
        self.state.lock().unwrap().crash_after = Some(n);
    }
    /// The process "restarted": changes work again.
    pub fn recover(&self) {
        self.state.lock().unwrap().crash_after = None;
    }
    /// Every change made, in order (`create 3g.40gb@4`, `destroy 1g.10gb@0`).
    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }
    /// The instances of `gpu`, as `profile@start`, sorted.
    pub fn layout(&self, gpu: u32) -> Vec<String> {
        let s = self.state.lock().unwrap();
        let mut v: Vec<String> = s
            .gpus
            .get(&gpu)
            .map(|l| {
                l.iter()
                    .map(|i| format!("{}@{}", i.profile, i.start))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
    fn change(&self, gpu: u32) -> Result<std::sync::MutexGuard<'_, FakeState>, MigError> {
        let mut s = self.state.lock().unwrap();
        match &mut s.crash_after {
            Some(0) => Err(MigError::Backend {
                gpu,
                message: "crashed (fake)".into(),
            }),
            Some(n) => {
                *n -= 1;
                Ok(s)
            }
            None => Ok(s),
        }
    }
}

impl MigBackend for FakeMig {
    fn name(&self) -> &str {
        "fake"
    }
    fn list(&self, gpu: u32) -> Result<Vec<Instance>, MigError> {
        Ok(self
            .state
            .lock()
            .unwrap()
            .gpus
            .get(&gpu)
            .cloned()
            .unwrap_or_default())
    }
    fn create(&self, gpu: u32, profile: &str, start: u8) -> Result<Instance, MigError> {
        let mut s = self.change(gpu)?;
        // The model's geometry decides whether the slices are free.
        let taken: BTreeSet<u8> = s
            .gpus
            .get(&gpu)
            .map(|l| {
                l.iter()
                    .flat_map(|i| {
                        let size = size_of(&i.profile);
                        i.start..i.start + size
                    })
                    .collect()
            })
            .unwrap_or_default();
        if (start..start + size_of(profile)).any(|x| taken.contains(&x)) {
            return Err(MigError::Backend {
                gpu,
                message: format!("slices of {profile}@{start} are in use"),
            });
        }
        s.next_gi += 1;
        let i = Instance {
            profile: profile.into(),
            start,
            gi: s.next_gi,
        };
        s.gpus.entry(gpu).or_default().push(i.clone());
        s.log.push(format!("create {profile}@{start}"));
        Ok(i)
    }
    fn destroy(&self, gpu: u32, gi: u32) -> Result<(), MigError> {
        let mut s = self.change(gpu)?;
        let l = s.gpus.entry(gpu).or_default();
        let Some(pos) = l.iter().position(|i| i.gi == gi) else {
            return Err(MigError::Backend {
                gpu,
                message: format!("no GPU instance {gi}"),
            });
        };
        let i = l.remove(pos);
        s.log.push(format!("destroy {}@{}", i.profile, i.start));
        Ok(())
    }
}

/// Memory slices of a profile (`3g.40gb` -> 4), from the profile's name as on
/// 7-compute / 8-memory-slice GPUs (enough for the fake's bookkeeping).
fn size_of(profile: &str) -> u8 {
    match profile.split('g').next().and_then(|n| n.parse::<u8>().ok()) {
        Some(1) if profile.contains("+me") || profile.ends_with(".20gb") => 2,
        Some(1) => 1,
        Some(2) => 2,
        Some(3) | Some(4) => 4,
        Some(7) => 8,
        _ => 1,
    }
}

/// MIG through `nvidia-smi` (root, a driver with MIG mode already on):
/// `mig -i GPU -lgi` to list, `-cgi PROFILE:START -C` to create with the default
/// compute instance, `-dci -gi ID` then `-dgi -gi ID` to destroy. Not run in this
/// project's tests (no GPU may be changed here); the parsing is.
#[derive(Debug, Clone)]
pub struct NvidiaSmiMig {
    pub program: PathBuf,
}

impl Default for NvidiaSmiMig {
    fn default() -> Self {
        NvidiaSmiMig {
            program: "nvidia-smi".into(),
        }
    }
}

impl NvidiaSmiMig {
    /// `Some` when `nvidia-smi` runs here.
    pub fn detect() -> Option<NvidiaSmiMig> {
        let b = NvidiaSmiMig::default();
        std::process::Command::new(&b.program)
            .arg("-L")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| b)
    }

    fn run(&self, gpu: u32, args: &[&str]) -> Result<String, MigError> {
        let o = std::process::Command::new(&self.program)
            .arg("mig")
            .arg("-i")
            .arg(gpu.to_string())
            .args(args)
            .output()
            .map_err(|e| MigError::Backend {
                gpu,
                message: format!("{}: {e}", self.program.display()),
            })?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if !o.status.success() {
            return Err(MigError::Backend {
                gpu,
                message: format!(
                    "nvidia-smi mig {}: {}{}",
                    args.join(" "),
                    out.trim(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            });
        }
        Ok(out)
    }
}

impl MigBackend for NvidiaSmiMig {
    fn name(&self) -> &str {
        "nvidia-smi"
    }
    fn list(&self, gpu: u32) -> Result<Vec<Instance>, MigError> {
        let out = self.run(gpu, &["-lgi"])?;
        Ok(crate::gpu::parse_mig_lgi_ids(&out)
            .into_iter()
            .filter(|(g, ..)| *g == gpu)
            .map(|(_, profile, start, gi)| Instance { profile, start, gi })
            .collect())
    }
    fn create(&self, gpu: u32, profile: &str, start: u8) -> Result<Instance, MigError> {
        let spec = format!("{profile}:{start}");
        self.run(gpu, &["-cgi", &spec, "-C"])?;
        self.list(gpu)?
            .into_iter()
            .find(|i| i.profile == profile && i.start == start)
            .ok_or_else(|| MigError::Backend {
                gpu,
                message: format!("created {spec} but it is not listed"),
            })
    }
    fn destroy(&self, gpu: u32, gi: u32) -> Result<(), MigError> {
        let id = gi.to_string();
        self.run(gpu, &["-dci", "-gi", &id])?;
        self.run(gpu, &["-dgi", "-gi", &id]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(profile: &str, start: u8, destroy: &[(&str, u8)]) -> MigStep {
        MigStep {
            profile: profile.into(),
            start,
            create: true,
            destroy: destroy
                .iter()
                .map(|(p, s)| MigRef {
                    profile: p.to_string(),
                    start: *s,
                })
                .collect(),
        }
    }

    #[test]
    fn create_is_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeMig::new();
        let a = Actuator::new(Some(fake.clone()), d.path().join("mig.json"));
        let s = step("3g.40gb", 4, &[]);
        let r = a.apply("t", 0, &s, &Held::new()).unwrap();
        assert!(matches!(r, Applied::Changed { .. }), "{r:?}");
        assert_eq!(a.apply("t", 0, &s, &Held::new()).unwrap(), Applied::Present);
        assert_eq!(fake.log(), ["create 3g.40gb@4"]);
        assert!(a.pending().unwrap().is_empty());
    }

    #[test]
    fn repartition_destroys_idle_then_creates() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeMig::new();
        fake.insert(0, "1g.10gb", 0);
        fake.insert(0, "1g.10gb", 1);
        fake.insert(0, "1g.10gb", 2);
        fake.insert(0, "1g.10gb", 3);
        let a = Actuator::new(Some(fake.clone()), d.path().join("mig.json"));
        let s = step(
            "3g.40gb",
            0,
            &[
                ("1g.10gb", 0),
                ("1g.10gb", 1),
                ("1g.10gb", 2),
                ("1g.10gb", 3),
            ],
        );
        a.apply("t", 0, &s, &Held::new()).unwrap();
        assert_eq!(fake.layout(0), ["3g.40gb@0"]);
    }

    #[test]
    fn a_held_instance_is_never_destroyed() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeMig::new();
        fake.insert(0, "1g.10gb", 0);
        fake.insert(0, "1g.10gb", 1);
        let a = Actuator::new(Some(fake.clone()), d.path().join("mig.json"));
        let mut held = Held::new();
        held.insert((0, "1g.10gb".into(), 1), "acme/j/t (attempt 1)".into());
        let s = step("2g.20gb", 0, &[("1g.10gb", 0), ("1g.10gb", 1)]);
        let e = a.apply("t", 0, &s, &held).unwrap_err();
        assert!(e.to_string().contains("acme/j/t (attempt 1)"), "{e}");
        assert!(fake.log().is_empty());
        assert_eq!(fake.layout(0), ["1g.10gb@0", "1g.10gb@1"]);
    }

    #[test]
    fn a_crash_mid_step_is_finished_by_reconcile() {
        let d = tempfile::tempdir().unwrap();
        let journal = d.path().join("mig.json");
        let fake = FakeMig::new();
        fake.insert(0, "1g.10gb", 0);
        fake.insert(0, "1g.10gb", 1);
        let s = step("2g.20gb", 0, &[("1g.10gb", 0), ("1g.10gb", 1)]);
        // The process dies after the first destroy.
        fake.crash_after(1);
        let a = Actuator::new(Some(fake.clone()), journal.clone());
        assert!(a.apply("t", 0, &s, &Held::new()).is_err());
        assert_eq!(fake.layout(0), ["1g.10gb@1"]);
        assert_eq!(a.pending().unwrap().len(), 1);
        drop(a);
        // Restart: a new actuator on the same journal finishes the step.
        fake.recover();
        let b = Actuator::new(Some(fake.clone()), journal);
        let r = b.reconcile(&Held::new());
        assert_eq!(r.len(), 1);
        assert!(r[0].1.is_ok(), "{r:?}");
        assert_eq!(fake.layout(0), ["2g.20gb@0"]);
        assert!(b.pending().unwrap().is_empty());
        // Nothing was done twice.
        assert_eq!(
            fake.log(),
            ["destroy 1g.10gb@0", "destroy 1g.10gb@1", "create 2g.20gb@0"]
        );
    }

    #[test]
    fn without_a_backend_steps_are_skipped_with_a_reason() {
        let d = tempfile::tempdir().unwrap();
        let a = Actuator::new(None, d.path().join("mig.json"));
        let r = a
            .apply("t", 0, &step("3g.40gb", 4, &[]), &Held::new())
            .unwrap();
        match r {
            Applied::Skipped(why) => assert!(why.contains("no MIG backend"), "{why}"),
            other => panic!("{other:?}"),
        }
        let reuse = MigStep {
            create: false,
            ..step("3g.40gb", 4, &[])
        };
        assert_eq!(
            a.apply("t", 0, &reuse, &Held::new()).unwrap(),
            Applied::Present
        );
    }
}
