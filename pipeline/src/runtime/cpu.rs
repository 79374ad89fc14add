//! CPU time of the process and of the loader's own threads, from `/proc` (Linux; `None`
//! elsewhere). SPDL's rule of thumb is to keep a loader at ≤ 40 % of the host's CPU so the
//! trainer's kernel launches are not starved; in a process that also trains, only the
//! threads that are the loader's may be counted.
//!
//! The loader's threads are the CPU pool's (`sluice-cpu-N`) and the async runtime's
//! (`sluice-io`, also its blocking file reads). Pool threads end with their pipeline, so each
//! adds its own total to [`RETIRED_TICKS`] as it exits (the pool's exit handler), and a
//! reading is that sum plus the live threads'. Hand-written rather than a crate: it is two
//! `/proc` files, and the crates that read them (procfs, sysinfo) are large for this.

use std::collections::HashSet;
use std::sync::Mutex;

/// Name prefixes of the loader's threads.
const LOADER_THREADS: [&str; 2] = ["sluice-cpu-", "sluice-io"];

/// Loader threads that have exited (or are exiting): their ticks, and their thread ids so
/// that a thread still listed in `/proc` while it exits is not counted twice.
static RETIRED: Mutex<Retired> = Mutex::new(Retired {
    ticks: 0,
    tids: None,
});

struct Retired {
    ticks: u64,
    tids: Option<HashSet<u64>>,
}

/// `USER_HZ`: Linux fixes the ticks of `/proc/*/stat` at 100 per second for userspace (the
/// kernel's own HZ is converted); fixed here rather than read through `sysconf`, which needs
/// `unsafe`.
const TICKS_PER_SECOND: f64 = 100.0;

/// The command name and user + system ticks of one `stat` line (`pid (comm) state … utime
/// stime …`: after the name in parentheses, utime is field 14 and stime 15 of the line).
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((comm, user + system))
}

/// This process's CPU time so far (user + system, all its threads, finished ones included),
/// in seconds.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&stat).map(|(_, t)| t as f64 / TICKS_PER_SECOND)
}

/// How long this process has been running, in seconds (`/proc/uptime` less the process's
/// start in `/proc/self/stat`, field 22): the wall time its CPU time is spent over, setup and
/// library loading included, as [`process_cpu_seconds`] counts them.
pub fn process_wall_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: field 3 (state) is the first, so field 22 (starttime) is the 20th.
    let start: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    Some((up - start as f64 / TICKS_PER_SECOND).max(0.0))
}

/// The CPU time of the loader's threads so far (live and exited), in seconds: what the
/// loader took from a process that also trains.
pub fn loader_cpu_seconds() -> Option<f64> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut retired = RETIRED.lock().unwrap_or_else(|e| e.into_inner());
    let mut ticks = retired.ticks;
    let mut listed = HashSet::new();
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u64>().ok())
        else {
            continue;
        };
        listed.insert(tid);
        if retired.tids.as_ref().is_some_and(|r| r.contains(&tid)) {
            continue;
        }
        // A thread may exit between the listing and the read: it has retired its ticks.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let Some((comm, t)) = parse_stat(&stat)
            && LOADER_THREADS.iter().any(|p| comm.starts_with(p))
        {
            ticks += t;
        }
    }
    // Forget the ids of threads that are gone (ids are reused by later threads).
    if let Some(r) = retired.tids.as_mut() {
        r.retain(|t| listed.contains(t));
    }
    Some(ticks as f64 / TICKS_PER_SECOND)
}

/// Adds the calling thread's CPU time to the retired total; called as a loader thread exits.
pub(crate) fn retire_current_thread() {
    let Ok(stat) = std::fs::read_to_string("/proc/thread-self/stat") else {
        return;
    };
    let tid = stat
        .split_whitespace()
        .next()
        .and_then(|t| t.parse::<u64>().ok());
    if let (Some((_, t)), Some(tid)) = (parse_stat(&stat), tid) {
        let mut retired = RETIRED.lock().unwrap_or_else(|e| e.into_inner());
        retired.ticks += t;
        retired.tids.get_or_insert_with(HashSet::new).insert(tid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_name_and_ticks() {
        // A name with spaces and parentheses: only the last ')' ends it.
        let line = "4242 (sluice-cpu-0 (x)) S 1 2 3 4 5 6 7 8 9 10 250 17 0 0 20 0 3";
        assert_eq!(parse_stat(line), Some(("sluice-cpu-0 (x)", 267)));
        assert_eq!(parse_stat("4242 (x) S 1 2"), None);
    }

    /// The calling thread's own CPU seconds.
    fn thread_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
        parse_stat(&stat).expect("parse").1 as f64 / TICKS_PER_SECOND
    }

    #[tokio::test]
    async fn a_busy_pool_thread_is_counted_while_it_runs_and_after_it_exits() {
        let before = loader_cpu_seconds().expect("Linux has /proc/self/task");
        let pool = crate::runtime::CpuPool::new(Some(1)).expect("pool");
        let (tid, spent) = pool
            .run(|| {
                // 0.3 CPU-s on the pool's own thread.
                let start = thread_seconds();
                let mut x = 0u64;
                while thread_seconds() - start < 0.3 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
                let tid: u64 = stat
                    .split_whitespace()
                    .next()
                    .expect("tid")
                    .parse()
                    .expect("tid");
                (tid, thread_seconds())
            })
            .await
            .expect("run");
        let live = loader_cpu_seconds().expect("stat");
        assert!(
            live - before >= 0.3 - 0.02,
            "{before} → {live} (the thread: {spent})"
        );
        drop(pool);
        // The thread retires its ticks as it exits; however the listing and the exit
        // interleave, the total never falls (a sum over live and retired threads).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let now = loader_cpu_seconds().expect("stat");
            assert!(now >= live - 0.02, "{live} → {now}");
            // Gone from the listing: it has exited, after its exit handler ran.
            if !std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the pool's thread did not exit within 60 s of the pool's drop"
            );
            std::thread::yield_now();
        }
        let after = loader_cpu_seconds().expect("stat");
        assert!(after >= live - 0.02, "{live} → {after}");
    }
}
