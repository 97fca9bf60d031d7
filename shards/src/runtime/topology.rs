//! Which CPUs this process may use, how many shards to run, and where to pin them.
//!
//! The shard count defaults to the CPUs the scheduler lets us run on, capped by the cgroup CPU
//! quota (a pod limited to 1 CPU on a 64-CPU node gets one shard). Shards are pinned one per CPU
//! in NUMA order so neighbouring shards share a node. Parsing is pure and tested on strings; the
//! thin `detect` shell reads the kernel files.

use std::fs;

/// What the kernel tells us about where we may run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuBudget {
    /// CPUs in the scheduler affinity mask, in NUMA order (node 0's CPUs first).
    pub cpus: Vec<usize>,
    /// The cgroup CPU quota in whole CPUs (rounded up), if one is set.
    pub quota: Option<usize>,
}

/// Where the shards go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Number of shards to run.
    pub shards: usize,
    /// CPU to pin each shard to; `None` when pinning would be wrong (quota below the mask).
    pub pins: Option<Vec<usize>>,
    /// Why pinning is off, for the start-up log.
    pub unpinned_reason: Option<&'static str>,
}

impl CpuBudget {
    /// Reads the affinity mask, NUMA topology and cgroup quota of this process.
    pub fn detect() -> CpuBudget {
        let mut cpus = affinity_cpus();
        if cpus.is_empty() {
            // The syscall cannot fail for our own pid; fall back to what std sees, just in case.
            let count = std::thread::available_parallelism().map_or(1, |n| n.get());
            cpus = (0..count).collect();
        }
        let nodes = numa_nodes();
        let quota = cgroup_quota();
        CpuBudget {
            cpus: numa_order(&cpus, &nodes),
            quota,
        }
    }

    /// Usable CPUs: the affinity mask capped by the quota, at least one.
    pub fn usable(&self) -> usize {
        let mask = self.cpus.len().max(1);
        self.quota.map_or(mask, |quota| quota.clamp(1, mask))
    }

    /// Decides the shard count (`requested` overrides the default) and the pins.
    pub fn place(&self, requested: Option<usize>) -> Placement {
        let shards = requested.unwrap_or_else(|| self.usable()).max(1);
        if self.cpus.is_empty() {
            return Placement {
                shards,
                pins: None,
                unpinned_reason: Some("no CPU list"),
            };
        }
        // With a quota smaller than the mask the kernel time-slices us across all CPUs of the
        // mask; pinning N shards onto N fixed CPUs would fight that and other tenants.
        if self.quota.is_some_and(|quota| quota < self.cpus.len()) {
            return Placement {
                shards,
                pins: None,
                unpinned_reason: Some("cgroup CPU quota is below the affinity mask"),
            };
        }
        let pins = (0..shards)
            .map(|i| self.cpus[i % self.cpus.len()])
            .collect();
        Placement {
            shards,
            pins: Some(pins),
            unpinned_reason: None,
        }
    }
}

/// Parses a kernel CPU list such as `0-3,8,10-11`. Bad pieces are skipped.
pub fn parse_cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for piece in text.trim().split(',').filter(|p| !p.is_empty()) {
        match piece.split_once('-') {
            Some((low, high)) => {
                if let (Ok(low), Ok(high)) =
                    (low.trim().parse::<usize>(), high.trim().parse::<usize>())
                {
                    if low <= high && high - low < 65_536 {
                        cpus.extend(low..=high);
                    }
                }
            }
            None => {
                if let Ok(cpu) = piece.trim().parse() {
                    cpus.push(cpu);
                }
            }
        }
    }
    cpus
}

/// Parses cgroup v2 `cpu.max` (`"max 100000"` or `"150000 100000"`) into whole CPUs, rounded up.
pub fn parse_cpu_max(text: &str) -> Option<usize> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period: u64 = parts.next()?.parse().ok()?;
    if quota == "max" || period == 0 {
        return None;
    }
    let quota: u64 = quota.parse().ok()?;
    Some(quota.div_ceil(period).max(1) as usize)
}

/// Parses cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
pub fn parse_cfs_quota(quota: &str, period: &str) -> Option<usize> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: i64 = period.trim().parse().ok()?;
    if quota <= 0 || period <= 0 {
        return None;
    }
    Some((quota as u64).div_ceil(period as u64).max(1) as usize)
}

/// Orders `cpus` by NUMA node (nodes given as lists of their CPUs), CPUs without a node last.
pub fn numa_order(cpus: &[usize], nodes: &[Vec<usize>]) -> Vec<usize> {
    let node_of = |cpu: usize| {
        nodes
            .iter()
            .position(|node| node.contains(&cpu))
            .unwrap_or(usize::MAX)
    };
    let mut ordered = cpus.to_vec();
    ordered.sort_by_key(|&cpu| (node_of(cpu), cpu));
    ordered.dedup();
    ordered
}

fn affinity_cpus() -> Vec<usize> {
    // /proc/self/status carries the same mask as sched_getaffinity, without unsafe code.
    let Ok(status) = fs::read_to_string("/proc/self/status") else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .map(parse_cpu_list)
        .unwrap_or_default()
}

fn numa_nodes() -> Vec<Vec<usize>> {
    let Ok(entries) = fs::read_dir("/sys/devices/system/node") else {
        return Vec::new();
    };
    let mut nodes: Vec<(usize, Vec<usize>)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let id: usize = name.strip_prefix("node")?.parse().ok()?;
            let list = fs::read_to_string(entry.path().join("cpulist")).ok()?;
            Some((id, parse_cpu_list(&list)))
        })
        .collect();
    nodes.sort();
    nodes.into_iter().map(|(_, cpus)| cpus).collect()
}

/// The cgroup memory limit of this process in bytes, if one is set (cgroup v2 `memory.max`, v1
/// `memory.limit_in_bytes`). What the connection, head and queue caps must fit in.
pub fn memory_limit() -> Option<u64> {
    let membership = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let candidates = if controllers.is_empty() {
            vec![
                format!("/sys/fs/cgroup{path}/memory.max"),
                "/sys/fs/cgroup/memory.max".to_string(),
            ]
        } else if controllers.split(',').any(|c| c == "memory") {
            vec![
                format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"),
                "/sys/fs/cgroup/memory/memory.limit_in_bytes".to_string(),
            ]
        } else {
            continue;
        };
        for file in candidates {
            if let Ok(text) = fs::read_to_string(&file) {
                return parse_memory_limit(&text);
            }
        }
    }
    None
}

/// Parses a cgroup memory limit: `max` (v2) or a value at or beyond 2⁶² bytes (v1's way of
/// saying none, `9223372036854771712`) is no limit.
pub fn parse_memory_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse::<u64>().ok().filter(|&bytes| bytes < 1 << 62)
}

fn cgroup_quota() -> Option<usize> {
    let membership = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if controllers.is_empty() {
            // cgroup v2: a single unified hierarchy.
            let file = format!("/sys/fs/cgroup{path}/cpu.max");
            let text =
                fs::read_to_string(&file).or_else(|_| fs::read_to_string("/sys/fs/cgroup/cpu.max"));
            if let Ok(text) = text {
                return parse_cpu_max(&text);
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            for base in [
                format!("/sys/fs/cgroup/cpu,cpuacct{path}"),
                format!("/sys/fs/cgroup/cpu{path}"),
                "/sys/fs/cgroup/cpu".to_string(),
            ] {
                let quota = fs::read_to_string(format!("{base}/cpu.cfs_quota_us"));
                let period = fs::read_to_string(format!("{base}/cpu.cfs_period_us"));
                if let (Ok(quota), Ok(period)) = (quota, period) {
                    return parse_cfs_quota(&quota, &period);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_ranges_and_singles() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("5"), vec![5]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("3-1,x,2"), vec![2]);
    }

    #[test]
    fn cgroup_v2_quota_rounds_up_and_max_means_unlimited() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("100000 100000"), Some(1));
        assert_eq!(parse_cpu_max("150000 100000"), Some(2));
        assert_eq!(parse_cpu_max("30000 100000"), Some(1));
        assert_eq!(parse_cpu_max("garbage"), None);
    }

    #[test]
    fn a_memory_limit_is_bytes_and_max_or_v1_huge_means_none() {
        assert_eq!(parse_memory_limit("629145600\n"), Some(629_145_600));
        assert_eq!(parse_memory_limit("max\n"), None);
        assert_eq!(parse_memory_limit("9223372036854771712"), None);
        assert_eq!(parse_memory_limit("garbage"), None);
    }

    #[test]
    fn cgroup_v1_quota_of_minus_one_is_unlimited() {
        assert_eq!(parse_cfs_quota("-1", "100000"), None);
        assert_eq!(parse_cfs_quota("200000\n", "100000\n"), Some(2));
    }

    #[test]
    fn numa_order_groups_cpus_by_node() {
        let nodes = vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]];
        assert_eq!(numa_order(&[7, 0, 1, 2, 9], &nodes), vec![0, 2, 1, 7, 9]);
    }

    #[test]
    fn shard_count_is_mask_capped_by_quota() {
        let budget = CpuBudget {
            cpus: vec![0, 1, 2, 3],
            quota: Some(2),
        };
        assert_eq!(budget.usable(), 2);
        let placement = budget.place(None);
        assert_eq!(placement.shards, 2);
        assert_eq!(placement.pins, None, "a quota below the mask must not pin");

        let exclusive = CpuBudget {
            cpus: vec![2, 3],
            quota: Some(2),
        };
        assert_eq!(exclusive.place(None).pins, Some(vec![2, 3]));
        assert_eq!(
            exclusive.place(Some(3)).pins,
            Some(vec![2, 3, 2]),
            "extra shards wrap around"
        );

        let no_quota = CpuBudget {
            cpus: vec![0],
            quota: None,
        };
        assert_eq!(
            no_quota.place(None),
            Placement {
                shards: 1,
                pins: Some(vec![0]),
                unpinned_reason: None
            }
        );
    }
}
