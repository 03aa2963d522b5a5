//! Candidate selection: which nodes a worker proposes for one task.
//!
//! A worker does not look at all nodes for every task (that is what makes a batch
//! session slow) and does not copy them (that is what made more workers slower in
//! Volcano, issue #5168). It reads a window of `scan` nodes of its shard, starting
//! at its own cursor, keeps the nodes where the task fits, and proposes the best
//! `k` of them with the versions it read. Own-shard nodes always rank before
//! borrowed ones. If the window has no room at all, it scans the rest of the shard
//! before giving up, so "no candidate" means "no room", not "unlucky window".
//! Deterministic for a given table state and cursor.

use serde::{Deserialize, Serialize};

use super::shard::{Access, Owner, ShardMode};
use super::table::NodeSource;
use super::task::Demand;

/// How nodes are ranked among those where a task fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Score {
    /// Most free CPU first: spreads sandboxes, fewest conflicts between workers.
    #[default]
    Spread,
    /// Least free CPU first: fills nodes up.
    Binpack,
}

/// Selection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelectConfig {
    /// Candidates proposed per task (Volcano's default is 3).
    pub k: usize,
    /// Nodes read per task before settling for what was found.
    pub scan: usize,
    pub score: Score,
    pub mode: ShardMode,
}

impl Default for SelectConfig {
    fn default() -> Self {
        SelectConfig {
            k: 3,
            scan: 16,
            score: Score::Spread,
            mode: ShardMode::Hard,
        }
    }
}

/// A proposed node, with the version that was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub node: u32,
    pub version: u64,
    pub borrowed: bool,
}

/// A worker's position in its shard lists (it moves on after each scan, so one
/// worker does not keep proposing the same nodes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub own: usize,
    pub borrow: usize,
}

fn rank(score: Score, free: &Demand) -> u64 {
    match score {
        Score::Spread => u64::MAX - free.cpu_milli,
        Score::Binpack => free.cpu_milli,
    }
}

/// Scans `list` from `*pos`, at most `limit` nodes; pushes feasible ones into
/// `found` as (borrowed, rank, candidate). Returns nodes read.
#[allow(clippy::too_many_arguments)]
fn scan<S: NodeSource>(
    src: &S,
    list: &[u32],
    pos: &mut usize,
    limit: usize,
    d: &Demand,
    by: Owner,
    mode: ShardMode,
    score: Score,
    borrowed: bool,
    found: &mut Vec<(bool, u64, Candidate)>,
) -> usize {
    let n = list.len();
    if n == 0 {
        return 0;
    }
    let limit = limit.min(n);
    let start = *pos % n;
    for j in 0..limit {
        let node = list[(start + j) % n];
        let Some(r) = src.peek(node) else { continue };
        let ok = match r.phase.access(by, mode) {
            Access::Own => !borrowed,
            Access::Borrow => borrowed,
            Access::Denied => false,
        };
        if ok && d.fits_in(&r.free) {
            found.push((
                borrowed,
                rank(score, &r.free),
                Candidate {
                    node,
                    version: r.version,
                    borrowed,
                },
            ));
        }
    }
    *pos = (start + limit) % n;
    limit
}

/// Proposes up to `cfg.k` candidates for a task of demand `d` into `out`
/// (cleared first), best first. `own` lists the scheduler's shard; `borrow` the
/// nodes it may borrow in soft mode. `found` is scratch space.
#[allow(clippy::too_many_arguments)]
pub fn select<S: NodeSource>(
    src: &S,
    own: &[u32],
    borrow: &[u32],
    cursor: &mut Cursor,
    d: &Demand,
    by: Owner,
    cfg: &SelectConfig,
    found: &mut Vec<(bool, u64, Candidate)>,
    out: &mut Vec<Candidate>,
) {
    out.clear();
    found.clear();
    let k = cfg.k.max(1);
    let soft = cfg.mode == ShardMode::Soft;
    let read = scan(
        src,
        own,
        &mut cursor.own,
        cfg.scan,
        d,
        by,
        cfg.mode,
        cfg.score,
        false,
        found,
    );
    if found.is_empty() && read < own.len() {
        scan(
            src,
            own,
            &mut cursor.own,
            own.len() - read,
            d,
            by,
            cfg.mode,
            cfg.score,
            false,
            found,
        );
    }
    if soft && found.len() < k {
        let read = scan(
            src,
            borrow,
            &mut cursor.borrow,
            cfg.scan,
            d,
            by,
            cfg.mode,
            cfg.score,
            true,
            found,
        );
        if found.is_empty() && read < borrow.len() {
            scan(
                src,
                borrow,
                &mut cursor.borrow,
                borrow.len() - read,
                d,
                by,
                cfg.mode,
                cfg.score,
                true,
                found,
            );
        }
    }
    found.sort_unstable_by_key(|(b, r, c)| (*b, *r, c.node));
    out.extend(found.iter().take(k).map(|(_, _, c)| *c));
}
