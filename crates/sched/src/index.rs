//! An index of nodes by free capacity, so that placement looks at a handful of
//! buckets instead of every node.
//!
//! Nodes are grouped by *class* (identical labels, taints and GPU models, so that
//! selectors and tolerations are decided once per class), then bucketed by the
//! number of wholly free GPUs and by the binary magnitude of free milli-CPU. A
//! task needing `g` whole GPUs and `c` milli-CPU only looks at buckets with at
//! least `g` free GPUs and a CPU magnitude of at least `c`'s; every node in a
//! higher CPU magnitude fits the CPU request, so the scan is bounded by the
//! nodes of one magnitude that fall short, not by the cluster size.
//!
//! Hot path: no allocation on update; O(1) move between buckets (swap-remove
//! with a position table).

/// Where a node sits in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos {
    class: u32,
    gpus: u32,
    cpu: u32,
    at: u32,
    present: bool,
}

/// Magnitude of a CPU quantity: 0 for 0, else 1 + floor(log2(v)).
pub fn cpu_mag(v: u64) -> u32 {
    64 - v.leading_zeros()
}

const CPU_MAGS: usize = 65;

#[derive(Debug, Clone, Default)]
pub struct NodeIndex {
    /// `buckets[class][gpus][cpu_mag]` = node ids.
    buckets: Vec<Vec<Vec<Vec<u32>>>>,
    pos: Vec<Pos>,
    max_gpus: u32,
}

impl NodeIndex {
    pub fn new(classes: usize, max_gpus: u32, nodes: usize) -> Self {
        NodeIndex {
            buckets: vec![vec![vec![Vec::new(); CPU_MAGS]; max_gpus as usize + 1]; classes],
            pos: vec![
                Pos {
                    class: 0,
                    gpus: 0,
                    cpu: 0,
                    at: 0,
                    present: false
                };
                nodes
            ],
            max_gpus,
        }
    }

    pub fn max_gpus(&self) -> u32 {
        self.max_gpus
    }

    /// Puts `node` in the bucket for (`class`, `free_gpus`, `free_cpu`), moving it
    /// if it was elsewhere.
    pub fn set(&mut self, node: u32, class: u32, free_gpus: u32, free_cpu: u64) {
        let g = free_gpus.min(self.max_gpus);
        let c = cpu_mag(free_cpu);
        let p = self.pos[node as usize];
        if p.present && p.class == class && p.gpus == g && p.cpu == c {
            return;
        }
        self.remove(node);
        let b = &mut self.buckets[class as usize][g as usize][c as usize];
        self.pos[node as usize] = Pos {
            class,
            gpus: g,
            cpu: c,
            at: b.len() as u32,
            present: true,
        };
        b.push(node);
    }

    /// Takes `node` out of the index (it will not be offered again).
    pub fn remove(&mut self, node: u32) {
        let p = self.pos[node as usize];
        if !p.present {
            return;
        }
        let b = &mut self.buckets[p.class as usize][p.gpus as usize][p.cpu as usize];
        b.swap_remove(p.at as usize);
        if let Some(&moved) = b.get(p.at as usize) {
            self.pos[moved as usize].at = p.at;
        }
        self.pos[node as usize].present = false;
    }

    /// The nodes of one bucket.
    pub fn bucket(&self, class: u32, gpus: u32, cpu: u32) -> &[u32] {
        &self.buckets[class as usize][gpus as usize][cpu as usize]
    }

    /// The highest CPU magnitude.
    pub const MAX_CPU_MAG: u32 = (CPU_MAGS - 1) as u32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_between_buckets() {
        let mut ix = NodeIndex::new(1, 8, 3);
        ix.set(0, 0, 8, 1000);
        ix.set(1, 0, 8, 1000);
        ix.set(2, 0, 4, 1000);
        assert_eq!(ix.bucket(0, 8, cpu_mag(1000)), &[0, 1]);
        ix.set(0, 0, 4, 1000);
        assert_eq!(ix.bucket(0, 8, cpu_mag(1000)), &[1]);
        assert_eq!(ix.bucket(0, 4, cpu_mag(1000)), &[2, 0]);
        ix.remove(2);
        assert_eq!(ix.bucket(0, 4, cpu_mag(1000)), &[0]);
        ix.remove(2);
        ix.set(1, 0, 8, 0);
        assert_eq!(ix.bucket(0, 8, 0), &[1]);
    }

    #[test]
    fn magnitudes_bound_the_request() {
        for v in [0u64, 1, 2, 3, 999, 1000, 1024, 96_000] {
            let m = cpu_mag(v);
            // Everything in a higher magnitude is strictly larger than v.
            if m < 64 {
                assert!((1u64 << m) > v);
            }
        }
    }
}
