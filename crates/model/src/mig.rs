//! NVIDIA Multi-Instance GPU (MIG) geometry as data.
//!
//! A MIG-capable GPU has a fixed number of *memory slices* (8 on A100, H100 and
//! H200; 4 on A30) and compute slices (7; 4 on A30). A GPU instance of a profile
//! occupies a run of memory slices that must start at one of the profile's legal
//! start slots. A GPU's layout is therefore an *occupancy bitmap* over its memory
//! slices, not a count: two free 1-slice holes do not make room for a 2-slice
//! profile unless they are adjacent and aligned.
//!
//! The tables follow NVIDIA's MIG user guide ("Supported MIG profiles").

use std::fmt;

use serde::{Deserialize, Serialize};

/// One MIG profile of a GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfile {
    /// Profile name, e.g. `3g.40gb`.
    pub name: &'static str,
    /// Compute slices (the `Ng` in the name).
    pub compute: u8,
    /// Memory slices occupied.
    pub slices: u8,
    /// Memory slices on which an instance may start.
    pub starts: &'static [u8],
}

impl MigProfile {
    /// The occupancy mask of an instance starting at `start`.
    pub fn mask(&self, start: u8) -> u16 {
        (((1u32 << self.slices) - 1) << start) as u16
    }
}

/// The MIG geometry of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigGeometry {
    /// Canonical model name, e.g. `H100-80GB`.
    pub model: &'static str,
    /// Other names the model goes by (product strings as drivers report them).
    pub aliases: &'static [&'static str],
    pub memory_slices: u8,
    pub compute_slices: u8,
    pub profiles: &'static [MigProfile],
}

const SEVEN_ONES: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN: &[u8] = &[0, 2, 4, 6];
const EVEN3: &[u8] = &[0, 2, 4];
const HALVES: &[u8] = &[0, 4];
const FIRST: &[u8] = &[0];

const fn p(name: &'static str, compute: u8, slices: u8, starts: &'static [u8]) -> MigProfile {
    MigProfile {
        name,
        compute,
        slices,
        starts,
    }
}

/// Every MIG-capable model Tessera knows.
pub const GEOMETRIES: &[MigGeometry] = &[
    MigGeometry {
        model: "A100-40GB",
        aliases: &["A100-SXM4-40GB", "A100-PCIE-40GB", "NVIDIA-A100-SXM4-40GB"],
        memory_slices: 8,
        compute_slices: 7,
        profiles: &[
            p("1g.5gb", 1, 1, SEVEN_ONES),
            p("1g.10gb", 1, 2, EVEN),
            p("2g.10gb", 2, 2, EVEN3),
            p("3g.20gb", 3, 4, HALVES),
            p("4g.20gb", 4, 4, FIRST),
            p("7g.40gb", 7, 8, FIRST),
        ],
    },
    MigGeometry {
        model: "A100-80GB",
        aliases: &[
            "A100-SXM4-80GB",
            "A100-PCIE-80GB",
            "NVIDIA-A100-SXM4-80GB",
            "NVIDIA-A100-80GB-PCIe",
        ],
        memory_slices: 8,
        compute_slices: 7,
        profiles: &[
            p("1g.10gb", 1, 1, SEVEN_ONES),
            p("1g.20gb", 1, 2, EVEN),
            p("2g.20gb", 2, 2, EVEN3),
            p("3g.40gb", 3, 4, HALVES),
            p("4g.40gb", 4, 4, FIRST),
            p("7g.80gb", 7, 8, FIRST),
        ],
    },
    MigGeometry {
        model: "H100-80GB",
        aliases: &[
            "H100-SXM5-80GB",
            "H100-PCIE-80GB",
            "NVIDIA-H100-80GB-HBM3",
            "H100",
        ],
        memory_slices: 8,
        compute_slices: 7,
        profiles: &[
            p("1g.10gb", 1, 1, SEVEN_ONES),
            p("1g.20gb", 1, 2, EVEN),
            p("2g.20gb", 2, 2, EVEN3),
            p("3g.40gb", 3, 4, HALVES),
            p("4g.40gb", 4, 4, FIRST),
            p("7g.80gb", 7, 8, FIRST),
        ],
    },
    MigGeometry {
        model: "H100-NVL",
        aliases: &["H100-NVL-94GB", "NVIDIA-H100-NVL"],
        memory_slices: 8,
        compute_slices: 7,
        profiles: &[
            p("1g.12gb", 1, 1, SEVEN_ONES),
            p("1g.24gb", 1, 2, EVEN),
            p("2g.24gb", 2, 2, EVEN3),
            p("3g.47gb", 3, 4, HALVES),
            p("4g.47gb", 4, 4, FIRST),
            p("7g.94gb", 7, 8, FIRST),
        ],
    },
    MigGeometry {
        model: "H200-141GB",
        aliases: &["H200", "NVIDIA-H200", "H200-SXM-141GB"],
        memory_slices: 8,
        compute_slices: 7,
        profiles: &[
            p("1g.18gb", 1, 1, SEVEN_ONES),
            p("1g.35gb", 1, 2, EVEN),
            p("2g.35gb", 2, 2, EVEN3),
            p("3g.71gb", 3, 4, HALVES),
            p("4g.71gb", 4, 4, FIRST),
            p("7g.141gb", 7, 8, FIRST),
        ],
    },
    MigGeometry {
        model: "A30-24GB",
        aliases: &["A30", "NVIDIA-A30"],
        memory_slices: 4,
        compute_slices: 4,
        profiles: &[
            p("1g.6gb", 1, 1, &[0, 1, 2, 3]),
            p("2g.12gb", 2, 2, &[0, 2]),
            p("4g.24gb", 4, 4, FIRST),
        ],
    },
];

/// The geometry of a model by canonical name or alias (case-insensitive).
pub fn geometry(model: &str) -> Option<&'static MigGeometry> {
    GEOMETRIES.iter().find(|g| {
        g.model.eq_ignore_ascii_case(model)
            || g.aliases.iter().any(|a| a.eq_ignore_ascii_case(model))
    })
}

/// What one instance of `profile` counts against quotas, in milli-GPU: its
/// share of the GPU's compute slices (rounded down, so that a full layout never
/// counts more than the GPU). The first known model with that profile decides,
/// among `models` when they are given; an unknown profile counts 0 (it fits
/// nowhere anyway).
pub fn profile_milli(profile: &str, models: &[String]) -> u64 {
    GEOMETRIES
        .iter()
        .filter(|g| {
            models.is_empty()
                || models.iter().any(|m| {
                    g.model.eq_ignore_ascii_case(m)
                        || g.aliases.iter().any(|a| a.eq_ignore_ascii_case(m))
                })
        })
        .find_map(|g| {
            g.profile(profile)
                .map(|p| u64::from(p.compute) * 1000 / u64::from(g.compute_slices))
        })
        .unwrap_or(0)
}

/// One GPU instance in a layout.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    pub profile: String,
    /// First memory slice.
    pub start: u8,
    /// Whether a task holds this instance (an idle instance may be re-partitioned).
    #[serde(default)]
    pub in_use: bool,
}

/// A GPU's current MIG partitioning.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigLayout {
    #[serde(default)]
    pub instances: Vec<MigInstance>,
}

/// Why a layout or a placement is not legal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    #[error("GPU model `{0}` has no MIG geometry")]
    UnknownModel(String),
    #[error("profile `{profile}` does not exist on {model}")]
    UnknownProfile { model: String, profile: String },
    #[error(
        "profile `{profile}` cannot start at memory slice {start} on {model} (legal: {legal:?})"
    )]
    BadStart {
        model: String,
        profile: String,
        start: u8,
        legal: Vec<u8>,
    },
    #[error(
        "`{profile}` at slice {start} overlaps memory slices already taken (occupancy {occupied:#010b})"
    )]
    Overlap {
        profile: String,
        start: u8,
        occupied: u16,
    },
    #[error("{used} compute slices used, {model} has {capacity}")]
    Compute {
        model: String,
        used: u8,
        capacity: u8,
    },
}

/// Occupancy of one GPU: memory-slice bitmap and compute slices in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Occupancy {
    pub slices: u16,
    pub compute: u8,
}

impl fmt::Display for Occupancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010b} ({} compute)", self.slices, self.compute)
    }
}

impl MigGeometry {
    pub fn profile(&self, name: &str) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    fn err_profile(&self, name: &str) -> MigError {
        MigError::UnknownProfile {
            model: self.model.to_string(),
            profile: name.to_string(),
        }
    }

    /// Adds one instance to `occ`, checking the start slot, overlap and compute.
    pub fn add(&self, occ: Occupancy, profile: &str, start: u8) -> Result<Occupancy, MigError> {
        let p = self
            .profile(profile)
            .ok_or_else(|| self.err_profile(profile))?;
        if !p.starts.contains(&start) {
            return Err(MigError::BadStart {
                model: self.model.to_string(),
                profile: profile.to_string(),
                start,
                legal: p.starts.to_vec(),
            });
        }
        let m = p.mask(start);
        if occ.slices & m != 0 {
            return Err(MigError::Overlap {
                profile: profile.to_string(),
                start,
                occupied: occ.slices,
            });
        }
        let compute = occ.compute + p.compute;
        if compute > self.compute_slices {
            return Err(MigError::Compute {
                model: self.model.to_string(),
                used: compute,
                capacity: self.compute_slices,
            });
        }
        Ok(Occupancy {
            slices: occ.slices | m,
            compute,
        })
    }

    /// Checks a whole layout and returns its occupancy.
    pub fn check(&self, layout: &MigLayout) -> Result<Occupancy, MigError> {
        layout
            .instances
            .iter()
            .try_fold(Occupancy::default(), |occ, i| {
                self.add(occ, &i.profile, i.start)
            })
    }

    /// Legal start slots where `profile` fits into `occ` now, lowest first.
    pub fn free_starts(&self, occ: Occupancy, profile: &str) -> Vec<u8> {
        let Some(p) = self.profile(profile) else {
            return Vec::new();
        };
        p.starts
            .iter()
            .copied()
            .filter(|&s| self.add(occ, profile, s).is_ok())
            .collect()
    }

    /// Chooses where a new `profile` instance goes: the legal free start that
    /// leaves the most room for other profiles afterwards (counted as the number
    /// of (profile, start) placements still possible), lowest start among equals.
    pub fn best_start(&self, occ: Occupancy, profile: &str) -> Option<u8> {
        self.free_starts(occ, profile)
            .into_iter()
            .map(|s| {
                let after = self.add(occ, profile, s).expect("free start");
                (self.room(after), s)
            })
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, s)| s)
    }

    /// How many (profile, start) placements are possible in `occ`.
    pub fn room(&self, occ: Occupancy) -> usize {
        self.profiles
            .iter()
            .map(|p| self.free_starts(occ, p.name).len())
            .sum()
    }

    /// Every legal layout (as sorted (profile, start) lists), the empty one
    /// included. Small: a few hundred per model.
    pub fn all_layouts(&self) -> Vec<Vec<(&'static str, u8)>> {
        let mut out = Vec::new();
        let mut cur = Vec::new();
        self.enumerate(Occupancy::default(), 0, &mut cur, &mut out);
        out
    }

    /// Depth-first over placements in a canonical order (by start slot, then
    /// profile index), so each layout is produced once.
    fn enumerate(
        &self,
        occ: Occupancy,
        from: usize,
        cur: &mut Vec<(&'static str, u8)>,
        out: &mut Vec<Vec<(&'static str, u8)>>,
    ) {
        out.push(cur.clone());
        let placements: Vec<(u8, usize)> = (0..self.memory_slices)
            .flat_map(|s| (0..self.profiles.len()).map(move |p| (s, p)))
            .collect();
        for (k, &(start, pi)) in placements.iter().enumerate().skip(from) {
            let p = &self.profiles[pi];
            if let Ok(next) = self.add(occ, p.name, start) {
                cur.push((p.name, start));
                self.enumerate(next, k + 1, cur, out);
                cur.pop();
            }
        }
    }
}
