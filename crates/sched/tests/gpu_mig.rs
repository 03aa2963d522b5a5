//! MIG placement legality: every legal layout of every model is accepted, and a
//! set of illegal layouts per model is rejected with the reason.

use tessera_model::mig::{self, MigError, MigInstance, MigLayout, Occupancy};

fn layout(items: &[(&str, u8)]) -> MigLayout {
    MigLayout {
        instances: items
            .iter()
            .map(|(p, s)| MigInstance {
                profile: p.to_string(),
                start: *s,
                in_use: false,
            })
            .collect(),
    }
}

/// Independent brute force: every subset of (profile, start) placements whose
/// memory-slice masks do not overlap and whose compute fits.
fn brute_force_count(g: &mig::MigGeometry) -> usize {
    let pairs: Vec<(u16, u8)> = g
        .profiles
        .iter()
        .flat_map(|p| p.starts.iter().map(move |&s| (p.mask(s), p.compute)))
        .collect();
    assert!(pairs.len() < 24);
    (0u32..(1 << pairs.len()))
        .filter(|set| {
            let mut used = 0u16;
            let mut compute = 0u8;
            for (k, (m, c)) in pairs.iter().enumerate() {
                if set & (1 << k) != 0 {
                    if used & m != 0 {
                        return false;
                    }
                    used |= m;
                    compute += c;
                }
            }
            compute <= g.compute_slices
        })
        .count()
}

#[test]
fn every_legal_layout_is_accepted_and_all_are_found() {
    for g in mig::GEOMETRIES {
        let all = g.all_layouts();
        assert_eq!(all.len(), brute_force_count(g), "{}", g.model);
        for l in &all {
            let occ = g
                .check(&layout(l))
                .unwrap_or_else(|e| panic!("{}: {l:?}: {e}", g.model));
            let slices: u32 = l
                .iter()
                .map(|(p, _)| u32::from(g.profile(p).unwrap().slices))
                .sum();
            assert_eq!(occ.slices.count_ones(), slices, "{}: {l:?}", g.model);
            assert!(occ.slices < (1 << g.memory_slices));
        }
    }
}

#[test]
fn layout_counts_per_model() {
    let counts: Vec<(&str, usize)> = mig::GEOMETRIES
        .iter()
        .map(|g| (g.model, g.all_layouts().len()))
        .collect();
    // The five 8-slice models share one geometry; A30 has 4 slices.
    let eight = counts[0].1;
    for (m, c) in &counts[..5] {
        assert_eq!(*c, eight, "{m}");
    }
    assert!(eight > 100, "{eight}");
    // A30: empty (1), 1g on any non-empty subset of 4 slots (15), 2g at 0 or 2
    // with 1g on any subset of the other half (2 x 4), 2g + 2g (1), 4g (1).
    assert_eq!(counts[5], ("A30-24GB", 26));
}

#[test]
fn the_h100_table_matches_the_issue() {
    let g = mig::geometry("H100-80GB").unwrap();
    let starts = |p: &str| g.profile(p).unwrap().starts.to_vec();
    assert_eq!(starts("1g.10gb"), vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(starts("1g.20gb"), vec![0, 2, 4, 6]);
    assert_eq!(starts("2g.20gb"), vec![0, 2, 4]);
    assert_eq!(starts("3g.40gb"), vec![0, 4]);
    assert_eq!(starts("4g.40gb"), vec![0]);
    assert_eq!(starts("7g.80gb"), vec![0]);
    let size = |p: &str| g.profile(p).unwrap().slices;
    assert_eq!(
        [
            size("1g.10gb"),
            size("1g.20gb"),
            size("2g.20gb"),
            size("3g.40gb"),
            size("4g.40gb"),
            size("7g.80gb")
        ],
        [1, 2, 2, 4, 4, 8]
    );
    assert!(std::ptr::eq(
        mig::geometry("nvidia-h100-80gb-hbm3").unwrap(),
        g
    ));
    assert!(mig::geometry("T4").is_none());
}

#[test]
fn illegal_layouts_are_rejected_with_the_reason() {
    for g in mig::GEOMETRIES {
        let ps = g.profiles;
        let small = ps[0].name; // 1 slice
        let whole = ps.last().unwrap().name; // all slices
        let half = ps
            .iter()
            .find(|p| p.slices == g.memory_slices / 2 && p.starts.len() > 1);
        // Unknown profile.
        assert!(matches!(
            g.check(&layout(&[("9g.999gb", 0)])),
            Err(MigError::UnknownProfile { .. })
        ));
        // A start slot that is not legal for the profile.
        assert!(matches!(
            g.check(&layout(&[(whole, 1)])),
            Err(MigError::BadStart { .. })
        ));
        // Overlap: the whole-GPU profile and anything else.
        assert!(matches!(
            g.check(&layout(&[(whole, 0), (small, 1)])),
            Err(MigError::Overlap { .. })
        ));
        // The same slice twice.
        assert!(matches!(
            g.check(&layout(&[(small, 0), (small, 0)])),
            Err(MigError::Overlap { .. })
        ));
        if let Some(h) = half {
            // A half-GPU profile at a start between the halves.
            assert!(matches!(
                g.check(&layout(&[(h.name, 1)])),
                Err(MigError::BadStart { .. })
            ));
            assert!(
                g.check(&layout(&[(h.name, 0), (h.name, g.memory_slices / 2)]))
                    .is_ok()
            );
        }
        // The last memory slice cannot hold a 1-slice instance on 7-compute GPUs.
        if g.compute_slices == 7 {
            assert!(matches!(
                g.check(&layout(&[(small, 7)])),
                Err(MigError::BadStart { .. })
            ));
        }
    }
}

#[test]
fn best_start_keeps_room_for_bigger_profiles() {
    let g = mig::geometry("A100-80GB").unwrap();
    // A 1g.10gb on an empty GPU goes where it blocks the fewest placements: not at
    // slice 0 (which would kill 7g, 4g and one 3g start).
    let s = g.best_start(Occupancy::default(), "1g.10gb").unwrap();
    assert_ne!(s, 0);
    let occ = g.add(Occupancy::default(), "1g.10gb", s).unwrap();
    assert!(!g.free_starts(occ, "3g.40gb").is_empty() || !g.free_starts(occ, "4g.40gb").is_empty());
    // A full GPU has no start for anything.
    let full = g.add(Occupancy::default(), "7g.80gb", 0).unwrap();
    assert_eq!(g.best_start(full, "1g.10gb"), None);
    assert_eq!(g.room(full), 0);
}
