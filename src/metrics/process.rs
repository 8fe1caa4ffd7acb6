//! The process's own series, named as Prometheus' client libraries name them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`...),
//! so that a fleet's usual queries and dashboards over small boxes work unchanged: read
//! from `/proc/self` at each scrape (a few small reads), none when it cannot be read.

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// What `/proc/self/stat` says of the process (the fields after the command's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// User and kernel time, clock ticks.
    cpu_ticks: u64,
    threads: u64,
    /// Since boot, clock ticks.
    start_ticks: u64,
    virtual_bytes: u64,
    resident_pages: u64,
}

/// Reads a `/proc/<pid>/stat` line; `None` when it is not one.
fn parse_stat(line: &str) -> Option<Stat> {
    // The command's name is in parentheses and may hold spaces and parentheses itself:
    // the fields start after the last `)`.
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 3.. of proc(5), so field n is f[n - 3].
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        threads: field(20)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// `btime` of `/proc/stat`: when the machine booted, epoch seconds.
fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The process's series now, or an empty registry where `/proc` cannot be read.
pub(super) fn registry() -> Registry {
    let mut r = Registry::default();
    let Some(stat) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|l| parse_stat(&l))
    else {
        return r;
    };
    // SAFETY: sysconf and getrlimit only read; `limit` is a valid rlimit to fill.
    let (ticks, page, max_fds) = unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max_fds = (libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0)
            .then_some(limit.rlim_cur as f64);
        (
            libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
            libc::sysconf(libc::_SC_PAGESIZE).max(1) as f64,
            max_fds,
        )
    };
    r.register_with_unit(
        "process_cpu",
        "User and system CPU time spent",
        Unit::Seconds,
        ConstCounter::new(stat.cpu_ticks as f64 / ticks),
    );
    r.register_with_unit(
        "process_resident_memory",
        "Resident memory size",
        Unit::Bytes,
        ConstGauge::new(stat.resident_pages as f64 * page),
    );
    r.register_with_unit(
        "process_virtual_memory",
        "Virtual memory size",
        Unit::Bytes,
        ConstGauge::new(stat.virtual_bytes as f64),
    );
    r.register(
        "process_threads",
        "OS threads of the process",
        ConstGauge::new(stat.threads as f64),
    );
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        r.register(
            "process_open_fds",
            "Open file descriptors",
            ConstGauge::new(fds.count() as f64),
        );
    }
    if let Some(max) = max_fds {
        r.register(
            "process_max_fds",
            "The most file descriptors the process may open",
            ConstGauge::new(max),
        );
    }
    if let Some(btime) = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_btime(&t))
    {
        r.register_with_unit(
            "process_start_time",
            "When the process started, epoch seconds",
            Unit::Seconds,
            ConstGauge::new(btime as f64 + stat.start_ticks as f64 / ticks),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_name_with_spaces_and_parentheses() {
        let line = "4242 (tape gate) (x)) S 1 4242 4242 0 -1 4194560 1203 0 0 0 \
                    150 37 0 0 20 0 9 0 123456 25165824 1800 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 187,
                threads: 9,
                start_ticks: 123_456,
                virtual_bytes: 25_165_824,
                resident_pages: 1800,
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(
            parse_btime("cpu 1 2 3\nbtime 1764400000\nprocesses 9\n"),
            Some(1_764_400_000)
        );
    }

    #[test]
    fn the_process_series_are_served_with_the_names_fleets_query() {
        let mut text = String::new();
        prometheus_client::encoding::text::encode_registry(&mut text, &registry()).unwrap();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
                .parse()
                .unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        assert!(value("process_threads") >= 1.0);
        // Started after the machine booted, and no longer ago than it has been up.
        let since_boot = value("process_start_time_seconds")
            - parse_btime(&std::fs::read_to_string("/proc/stat").unwrap()).unwrap() as f64;
        let up: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            since_boot >= 0.0 && since_boot <= up + 1.0,
            "{since_boot} vs {up}"
        );
    }
}
