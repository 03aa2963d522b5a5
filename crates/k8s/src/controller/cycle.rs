//! The loop: take the watchers' changes in, and when something the
//! schedulers read changed (or a period passed), run a cycle: assemble the
//! snapshot, decide on a blocking thread, apply.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Loop, Msg, RunError, discover};

impl Loop {
    pub(super) async fn run(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Msg>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
        mut need: BTreeSet<String>,
    ) -> Result<(), RunError> {
        let mut last_gen = u64::MAX;
        let mut last_cycle = Instant::now();
        let every = self.cfg.rediscover.max(Duration::from_millis(10));
        let mut rediscover = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        rediscover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let mut wait_logged = false;
        loop {
            let mut forced = false;
            tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => self.handle(m, &mut need),
                    None => return Err(RunError::Watch("all", "watchers ended".into())),
                },
                _ = tokio::time::sleep(self.cfg.period) => forced = true,
                _ = rediscover.tick() => {
                    let now = discover(&self.writer.client).await;
                    let new = self.served.appeared(&now);
                    if !new.is_empty() {
                        return Err(RunError::ApisChanged(new.join(", ")));
                    }
                }
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                return Ok(());
            }
            while let Ok(m) = rx.try_recv() {
                self.handle(m, &mut need);
            }
            self.log_errors();
            if !need.is_empty() {
                if !wait_logged && started.elapsed() > Duration::from_secs(10) {
                    wait_logged = true;
                    eprintln!("tessera-k8s: still waiting for the first list of {need:?}");
                }
                continue;
            }
            if !self.writer.leadership.is_leader() {
                return Err(RunError::LostLease(
                    self.cfg
                        .lease
                        .as_ref()
                        .map(|l| l.name.clone())
                        .unwrap_or_default(),
                ));
            }
            self.writer.metrics.ready.store(true, Relaxed);
            if self.state.generation == last_gen
                && !(forced || last_cycle.elapsed() >= self.cfg.period)
            {
                continue;
            }
            last_gen = self.state.generation;
            last_cycle = Instant::now();
            let decide = self.cycle().await;
            // Changes caused by our own writes arrive next; take them in one
            // go. Bindings are written in the background meanwhile; waiting at
            // least as long as the decision took keeps the scheduler to half
            // of the time when changes arrive without pause.
            tokio::time::sleep(decide.max(Duration::from_millis(5))).await;
        }
    }

    fn handle(&mut self, m: Msg, need: &mut BTreeSet<String>) {
        match m {
            Msg::Change(f) => f(&mut self.state),
            Msg::Synced(n) => {
                need.remove(&n);
            }
        }
    }

    fn log_errors(&mut self) {
        for e in self.state.errors.drain(..) {
            if self.errors_logged < 100 {
                eprintln!("tessera-k8s: {e}");
            }
            self.errors_logged += 1;
        }
    }

    /// One cycle; returns how long the decision took.
    async fn cycle(&mut self) -> Duration {
        let t0 = Instant::now();
        // Patched from the last cycle's snapshot when only pods changed.
        let mut built = self.state.build_incremental();
        let snapshot = std::mem::take(&mut built.snapshot);
        let sched = self.cfg.sched.clone();
        let agent_pods = std::mem::take(&mut built.agent_pods);
        let agent_nodes = std::mem::take(&mut built.agent_nodes);
        let decided = tokio::task::spawn_blocking(move || {
            let plan = tessera_sched::schedule(&snapshot, &sched);
            let agent = crate::agent::place(&agent_pods, &agent_nodes);
            (snapshot, plan, agent, agent_pods, agent_nodes)
        })
        .await;
        let Ok((snapshot, plan, agent, agent_pods, agent_nodes)) = decided else {
            // The snapshot is lost with the thread; the next one is assembled afresh.
            eprintln!("tessera-k8s: the scheduler panicked; skipping this cycle");
            return t0.elapsed();
        };
        built.snapshot = snapshot;
        built.agent_nodes = agent_nodes;
        let m = self.writer.metrics.clone();
        let decide = t0.elapsed();
        m.decide_us.fetch_add(decide.as_micros() as u64, Relaxed);
        m.cycles.fetch_add(1, Relaxed);
        let t1 = Instant::now();
        self.apply(&built, plan, agent, &agent_pods).await;
        m.apply_us
            .fetch_add(t1.elapsed().as_micros() as u64, Relaxed);
        built.agent_pods = agent_pods;
        self.state.recycle(built);
        m.assembled_in_part
            .store(self.state.assembled_in_part(), Relaxed);
        decide
    }
}
