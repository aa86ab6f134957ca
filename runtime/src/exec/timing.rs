//! Launch timing of the [`Executor`](super::Executor): the host time spent
//! issuing launches ([`HostTime`], always on) and the per-kernel wall-time
//! profile (`DRAFTC_PROFILE=1`, [`Profile`]).

/// Host work per launch: launches issued by [`Executor::run`](super::Executor::run) and the wall
/// time spent issuing them (argument checks, metadata and scratch
/// allocations, queueing), measured around each launch call without
/// waiting for the device, so it excludes kernel time unless the runtime
/// blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTime {
    pub launches: u64,
    pub issue_s: f64,
    /// Passes run (eager, recorded or replayed).
    pub passes: u64,
}

impl HostTime {
    /// Mean host microseconds per launch.
    pub fn us_per_launch(&self) -> f64 {
        1e6 * self.issue_s / self.launches.max(1) as f64
    }

    /// The work done since `earlier`.
    pub fn since(&self, earlier: &HostTime) -> HostTime {
        HostTime {
            launches: self.launches - earlier.launches,
            issue_s: self.issue_s - earlier.issue_s,
            passes: self.passes - earlier.passes,
        }
    }
}

/// Wall time per kernel family, measured by synchronising the device after
/// every launch (so the totals are the device time plus launch overhead;
/// profiling itself slows the run down). The first launch of each family
/// and shape compiles its kernel, which on lavapipe costs more than
/// hundreds of launches; it is kept apart (`first_s`) and left out of the
/// families and the pass total, so short runs show the steady state.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// `(family and pass rows, launches, seconds)` in first-seen order,
    /// without each one's first launch.
    pub families: Vec<(String, usize, f64)>,
    /// Passes run and their wall time (launches plus host work between
    /// them), less the first launches.
    pub passes: usize,
    pub total_s: f64,
    /// First launches (kernel compilation included) and their wall time.
    pub first: usize,
    pub first_s: f64,
}

impl Profile {
    pub(super) fn add(&mut self, family: &str, s: f64) {
        match self.families.iter_mut().find(|f| f.0 == family) {
            Some(f) => {
                f.1 += 1;
                f.2 += s;
            }
            None => {
                self.families.push((family.to_string(), 0, 0.0));
                self.first += 1;
                self.first_s += s;
                self.total_s -= s;
            }
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "profile: {} passes, {:.3} s ({:.1} ms per pass)",
            self.passes,
            self.total_s,
            1e3 * self.total_s / self.passes.max(1) as f64
        )?;
        writeln!(
            f,
            "  (left out: the first launch of each of {} kernel shapes, {:.3} s with compilation)",
            self.first, self.first_s
        )?;
        let mut rows = self.families.clone();
        rows.sort_by(|a, b| b.2.total_cmp(&a.2));
        for (name, n, s) in rows.into_iter().filter(|r| r.1 > 0) {
            writeln!(
                f,
                "  {name:<52} {n:>7} launches {:>9.1} ms {:>5.1}%",
                1e3 * s,
                100.0 * s / self.total_s.max(1e-12)
            )?;
        }
        Ok(())
    }
}
