//! Compute time slicing: the pure controller. No I/O, no clock: the caller
//! passes the time between ticks and each task's measured device time.
//!
//! Each task on a device has a token bucket of device time. Every tick the
//! controller
//! 1. credits each bucket with the task's allowance × elapsed time (up to the
//!    bucket's depth) and debits the device time the task was measured to use
//!    (NVML's per-process utilisation on a real GPU);
//! 2. marks a task *throttled* when its bucket is in debt: its launches wait;
//! 3. estimates each task's demand: unbounded for a task throttled within the
//!    last few ticks (it wanted more than it got), otherwise its recent use plus a
//!    margin;
//! 4. shares the device by weighted max-min fairness over those demands
//!    ([`allocate`]): a task that wants less than its weighted share gets what it
//!    wants, the rest is split among the others by weight. Capacity no one claims
//!    is handed out by weight too, so a task alone gets the whole device
//!    (work-conserving). A [`ComputePolicy::Fixed`] task never gets more than its
//!    share.
//!
//! The interposer only gates launches on the published bucket: a launch goes
//! ahead while the bucket is not in debt.

use std::collections::{BTreeMap, VecDeque};

use crate::region::ComputePolicy;

/// Tuning of the controller. Times in nanoseconds of the caller's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerConfig {
    /// The tick period the bucket depths are expressed in.
    pub tick_ns: u64,
    /// Ticks of measured use averaged into a task's rate.
    pub window_ticks: usize,
    /// Ticks after a throttled tick during which a task still counts as wanting more.
    pub hungry_ticks: usize,
    /// Bucket depth: how much unused allowance a task may bank, in ticks of the
    /// whole device.
    pub bucket_ticks: f64,
    /// Deepest debt, in ticks of the whole device (bounds how long a task that
    /// overran is held back).
    pub debt_ticks: f64,
    /// Margin over a satisfied task's recent use that stays reserved for it
    /// (0.1: 10 %), so growing demand shows up as throttling.
    pub headroom: f64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            tick_ns: 10_000_000,
            window_ticks: 8,
            hungry_ticks: 4,
            bucket_ticks: 2.0,
            debt_ticks: 8.0,
            headroom: 0.1,
        }
    }
}

/// One task's claim on the device for [`allocate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// Relative weight (the task's milli-GPU share).
    pub weight: f64,
    /// The most the task can use now: its demand, capped by its policy
    /// (fraction of the device; `f64::INFINITY` for unbounded).
    pub limit: f64,
}

/// Weighted max-min fair shares of one device (capacity 1.0) among `claims`:
/// each task gets at most its limit; tasks that are limited by the others (not
/// by their own limit) all get the same share per unit of weight, and no task
/// gets less than `min(limit, weight / Σ weights)`. The result sums to at most
/// 1, and to exactly 1 when some limit is unbounded.
pub fn allocate(claims: &[Claim]) -> Vec<f64> {
    let mut alloc = vec![0.0; claims.len()];
    let mut open: Vec<usize> = (0..claims.len())
        .filter(|&i| claims[i].weight > 0.0 && claims[i].limit > 0.0)
        .collect();
    let mut remaining = 1.0f64;
    while !open.is_empty() && remaining > 1e-12 {
        let w: f64 = open.iter().map(|&i| claims[i].weight).sum();
        let level = remaining / w;
        let (sat, rest): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&i| claims[i].limit <= level * claims[i].weight);
        if sat.is_empty() {
            for &i in &open {
                alloc[i] = level * claims[i].weight;
            }
            break;
        }
        for &i in &sat {
            alloc[i] = claims[i].limit;
            remaining -= claims[i].limit;
        }
        open = rest;
    }
    alloc
}

#[derive(Debug, Clone)]
struct TaskCtl {
    weight_milli: u32,
    policy: ComputePolicy,
    tokens: f64,
    window: VecDeque<u64>,
    throttled: VecDeque<bool>,
    allowance: f64,
    busy_total: u64,
}

/// What the controller decided for one task at one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub task: String,
    /// Fraction of the device the task may use until the next tick.
    pub allowance: f64,
    /// The bucket after this tick (ns of device time; negative: launches wait).
    pub tokens_ns: i64,
    /// Measured use over the window, fraction of the device.
    pub rate: f64,
    pub busy_total_ns: u64,
    pub throttled: bool,
}

/// The controller of one device: tasks by key (deterministic order).
#[derive(Debug, Clone)]
pub struct Controller {
    cfg: ControllerConfig,
    tasks: BTreeMap<String, TaskCtl>,
}

impl Controller {
    pub fn new(cfg: ControllerConfig) -> Self {
        Controller {
            cfg,
            tasks: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    fn bucket_ns(&self) -> f64 {
        self.cfg.bucket_ticks * self.cfg.tick_ns as f64
    }

    /// Adds a task (or updates its weight and policy). A new task starts with a
    /// full bucket and its weighted share as allowance.
    pub fn add(&mut self, task: &str, weight_milli: u32, policy: ComputePolicy) {
        let bucket = self.bucket_ns();
        let t = self.tasks.entry(task.to_string()).or_insert(TaskCtl {
            weight_milli,
            policy,
            tokens: bucket,
            window: VecDeque::new(),
            throttled: VecDeque::new(),
            allowance: weight_milli as f64 / 1000.0,
            busy_total: 0,
        });
        t.weight_milli = weight_milli;
        t.policy = policy;
    }

    pub fn remove(&mut self, task: &str) {
        self.tasks.remove(task);
    }

    pub fn tasks(&self) -> impl Iterator<Item = &str> {
        self.tasks.keys().map(String::as_str)
    }

    /// One tick: `dt_ns` since the previous one; `busy` the device time each task
    /// used in it (missing: none).
    pub fn step(&mut self, dt_ns: u64, busy: &BTreeMap<String, u64>) -> Vec<Decision> {
        let dt = dt_ns.max(1) as f64;
        let bucket = self.bucket_ns();
        let debt = self.cfg.debt_ticks * self.cfg.tick_ns as f64;
        let mut claims = Vec::with_capacity(self.tasks.len());
        let mut rates = Vec::with_capacity(self.tasks.len());
        for (key, t) in self.tasks.iter_mut() {
            let b = busy.get(key).copied().unwrap_or(0);
            t.busy_total = t.busy_total.saturating_add(b);
            t.tokens = ((t.tokens + t.allowance * dt).min(bucket) - b as f64).max(-debt);
            t.window.push_back(b);
            while t.window.len() > self.cfg.window_ticks.max(1) {
                t.window.pop_front();
            }
            t.throttled.push_back(t.tokens < 0.0);
            while t.throttled.len() > self.cfg.hungry_ticks.max(1) {
                t.throttled.pop_front();
            }
            let rate = t.window.iter().sum::<u64>() as f64 / (t.window.len() as f64 * dt);
            let cap = match t.policy {
                ComputePolicy::WorkConserving => 1.0,
                ComputePolicy::Fixed => t.weight_milli as f64 / 1000.0,
            };
            let demand = if t.throttled.iter().any(|&x| x) {
                f64::INFINITY
            } else {
                rate * (1.0 + self.cfg.headroom)
            };
            claims.push(Claim {
                weight: t.weight_milli as f64,
                limit: demand.min(cap),
            });
            rates.push(rate);
        }
        let mut alloc = allocate(&claims);
        // Capacity nobody claims goes to the work-conserving tasks by weight.
        let spare = 1.0 - alloc.iter().sum::<f64>();
        let wc_weight: f64 = self
            .tasks
            .values()
            .filter(|t| t.policy == ComputePolicy::WorkConserving)
            .map(|t| t.weight_milli as f64)
            .sum();
        for (a, t) in alloc.iter_mut().zip(self.tasks.values()) {
            match t.policy {
                ComputePolicy::WorkConserving if spare > 1e-12 && wc_weight > 0.0 => {
                    *a = (*a + spare * t.weight_milli as f64 / wc_weight).min(1.0);
                }
                ComputePolicy::WorkConserving => {}
                ComputePolicy::Fixed => *a = t.weight_milli as f64 / 1000.0,
            }
        }
        self.tasks
            .iter_mut()
            .zip(alloc)
            .zip(rates)
            .map(|(((key, t), a), rate)| {
                t.allowance = a;
                Decision {
                    task: key.clone(),
                    allowance: a,
                    tokens_ns: t.tokens as i64,
                    rate,
                    busy_total_ns: t.busy_total,
                    throttled: t.tokens < 0.0,
                }
            })
            .collect()
    }
}

/// A device shared by time slicing, for tests and the benchmark: each tick the
/// tasks whose bucket is not in debt run, and the device splits its time
/// equally among them (what a GPU's time-slice scheduler does between
/// contexts), each up to its own demand.
#[derive(Debug, Clone)]
pub struct SimDevice {
    pub controller: Controller,
    /// Per task: the fraction of the device it would use alone.
    pub demand: BTreeMap<String, f64>,
    /// Device time each task has used.
    pub used: BTreeMap<String, u64>,
    pub elapsed: u64,
    tokens: BTreeMap<String, i64>,
}

impl SimDevice {
    pub fn new(cfg: ControllerConfig) -> Self {
        SimDevice {
            controller: Controller::new(cfg),
            demand: BTreeMap::new(),
            used: BTreeMap::new(),
            elapsed: 0,
            tokens: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, task: &str, weight_milli: u32, policy: ComputePolicy, demand: f64) {
        self.controller.add(task, weight_milli, policy);
        self.demand.insert(task.to_string(), demand);
        self.used.entry(task.to_string()).or_insert(0);
    }

    pub fn remove(&mut self, task: &str) {
        self.controller.remove(task);
        self.demand.remove(task);
        self.tokens.remove(task);
    }

    /// Runs `ticks` ticks; returns the device time each task used in them.
    pub fn run(&mut self, ticks: usize) -> BTreeMap<String, u64> {
        let dt = self.controller.config().tick_ns;
        let mut got: BTreeMap<String, u64> = self.demand.keys().map(|k| (k.clone(), 0)).collect();
        for _ in 0..ticks {
            let runnable: Vec<(&String, f64)> = self
                .demand
                .iter()
                .filter(|(k, _)| self.tokens.get(*k).is_none_or(|&t| t >= 0))
                .map(|(k, &d)| (k, d))
                .collect();
            let shares = allocate(
                &runnable
                    .iter()
                    .map(|&(_, d)| Claim {
                        weight: 1.0,
                        limit: d,
                    })
                    .collect::<Vec<_>>(),
            );
            let busy: BTreeMap<String, u64> = runnable
                .iter()
                .zip(shares)
                .map(|(&(k, _), s)| (k.clone(), (s * dt as f64) as u64))
                .collect();
            for (k, b) in &busy {
                *self.used.get_mut(k).unwrap() += b;
                *got.get_mut(k).unwrap() += b;
            }
            self.elapsed += dt;
            for d in self.controller.step(dt, &busy) {
                self.tokens.insert(d.task, d.tokens_ns);
            }
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(weight: f64, limit: f64) -> Claim {
        Claim { weight, limit }
    }

    #[test]
    fn allocate_examples() {
        let inf = f64::INFINITY;
        let a = allocate(&[c(300.0, inf), c(700.0, inf)]);
        assert!(
            (a[0] - 0.3).abs() < 1e-9 && (a[1] - 0.7).abs() < 1e-9,
            "{a:?}"
        );
        // A task that wants little gets it; the other takes the rest.
        let a = allocate(&[c(300.0, inf), c(700.0, 0.1)]);
        assert!(
            (a[0] - 0.9).abs() < 1e-9 && (a[1] - 0.1).abs() < 1e-9,
            "{a:?}"
        );
        // Shares of active tasks when the weights do not add up to the device.
        let a = allocate(&[c(300.0, inf), c(300.0, inf)]);
        assert!((a[0] - 0.5).abs() < 1e-9, "{a:?}");
        assert_eq!(allocate(&[]), Vec::<f64>::new());
        assert_eq!(allocate(&[c(500.0, 0.0)]), vec![0.0]);
    }

    /// Capacity nobody uses is handed out by weight: an idle device is all
    /// headroom, so a task that starts is not held back while it is alone.
    #[test]
    fn idle_capacity_is_handed_out_by_weight() {
        let mut c = Controller::new(ControllerConfig::default());
        c.add("a", 300, ComputePolicy::WorkConserving);
        c.add("b", 700, ComputePolicy::WorkConserving);
        c.add("f", 200, ComputePolicy::Fixed);
        let mut d = Vec::new();
        for _ in 0..10 {
            d = c.step(10_000_000, &BTreeMap::new());
        }
        let a: Vec<f64> = d.iter().map(|d| d.allowance).collect();
        assert!(
            (a[0] - 0.3).abs() < 1e-9 && (a[1] - 0.7).abs() < 1e-9,
            "{a:?}"
        );
        assert!(
            (a[2] - 0.2).abs() < 1e-9,
            "a fixed task keeps its share: {a:?}"
        );
        c.remove("b");
        c.remove("f");
        let d = c.step(10_000_000, &BTreeMap::new());
        assert!((d[0].allowance - 1.0).abs() < 1e-9, "{d:?}");
    }

    fn shares(w: &[u32], demand: &[f64], ticks: usize) -> (Vec<f64>, f64) {
        let mut d = SimDevice::new(ControllerConfig::default());
        for (i, (&w, &dm)) in w.iter().zip(demand).enumerate() {
            d.add(&format!("t{i}"), w, ComputePolicy::WorkConserving, dm);
        }
        let got = d.run(ticks);
        let total: u64 = got.values().sum();
        let elapsed = ticks as f64 * ControllerConfig::default().tick_ns as f64;
        (
            got.values()
                .map(|&g| g as f64 / elapsed)
                .collect::<Vec<_>>(),
            total as f64 / elapsed,
        )
    }

    #[test]
    fn two_saturating_tasks_converge_to_their_shares() {
        let (s, util) = shares(&[300, 700], &[1.0, 1.0], 3000);
        assert!(
            (s[0] - 0.3).abs() < 0.05 && (s[1] - 0.7).abs() < 0.05,
            "{s:?}"
        );
        assert!(util > 0.95, "device left idle: {util}");
    }

    #[test]
    fn a_task_alone_gets_the_whole_device() {
        let (s, _) = shares(&[300], &[1.0], 1000);
        assert!(s[0] > 0.97, "{s:?}");
    }

    #[test]
    fn fixed_policy_holds_a_task_alone_to_its_share() {
        let mut d = SimDevice::new(ControllerConfig::default());
        d.add("a", 300, ComputePolicy::Fixed, 1.0);
        let got = d.run(2000)["a"] as f64 / d.elapsed as f64;
        assert!((got - 0.3).abs() < 0.03, "{got}");
    }

    #[test]
    fn a_light_task_keeps_what_it_wants_and_the_other_takes_the_rest() {
        let (s, util) = shares(&[300, 700], &[1.0, 0.1], 3000);
        assert!((s[1] - 0.1).abs() < 0.02, "{s:?}");
        assert!(s[0] > 0.8, "{s:?}");
        assert!(util > 0.9, "{util}");
    }

    #[test]
    fn a_task_that_leaves_gives_its_share_back() {
        let mut d = SimDevice::new(ControllerConfig::default());
        d.add("a", 300, ComputePolicy::WorkConserving, 1.0);
        d.add("b", 700, ComputePolicy::WorkConserving, 1.0);
        d.run(1000);
        d.remove("b");
        let got = d.run(1000);
        assert!(got["a"] as f64 / (1000.0 * 1e7) > 0.95, "{got:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn allocate_is_max_min_fair(
            claims in prop::collection::vec((1u32..1000, prop_oneof![Just(f64::INFINITY), 0.0f64..1.2]), 0..6)
        ) {
            let cl: Vec<Claim> = claims.iter().map(|&(w, l)| c(w as f64, l)).collect();
            let a = allocate(&cl);
            let sum: f64 = a.iter().sum();
            prop_assert!(sum <= 1.0 + 1e-9, "sum {sum}");
            let wsum: f64 = cl.iter().map(|c| c.weight).sum();
            for (ci, &ai) in cl.iter().zip(&a) {
                prop_assert!(ai <= ci.limit + 1e-9);
                prop_assert!(ai + 1e-9 >= ci.limit.min(ci.weight / wsum), "guarantee: {ai} < min({}, {})", ci.limit, ci.weight / wsum);
            }
            if cl.iter().any(|c| c.limit.is_infinite()) {
                prop_assert!((sum - 1.0).abs() < 1e-9, "not work-conserving: {sum}");
            }
            // Tasks held below their limit share one level per unit of weight, and
            // nobody is above it.
            let levels: Vec<f64> = cl.iter().zip(&a).filter(|(c, a)| **a + 1e-9 < c.limit).map(|(c, a)| a / c.weight).collect();
            if let Some(&l) = levels.first() {
                for (ci, &ai) in cl.iter().zip(&a) {
                    prop_assert!(ai / ci.weight <= l + 1e-9);
                }
            }
        }

        #[test]
        fn saturating_tasks_converge_within_five_points(
            weights in prop::collection::vec(50u32..500, 2..5)
        ) {
            prop_assume!(weights.iter().sum::<u32>() <= 1000);
            let n = weights.len();
            let (s, util) = shares(&weights, &vec![1.0; n], 3000);
            let wsum: u32 = weights.iter().sum();
            for (w, got) in weights.iter().zip(&s) {
                let want = *w as f64 / wsum as f64;
                prop_assert!((got - want).abs() < 0.05, "weights {weights:?}: got {s:?}");
            }
            prop_assert!(util > 0.95, "util {util}");
        }
    }
}
