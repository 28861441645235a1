//! What `bench` reads from `/proc`: CPU time and bytes written per thread, and CPU pinning.

use super::*;

/// CPU time of the serve process by thread kind, from `/proc/<pid>/task/*`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadCpu {
    /// Tokio workers: HTTP, decoding, the consumer, logs (and blocking reads).
    pub runtime: f64,
    /// The SQLite writer: every write job and commit.
    pub sqlite_writer: f64,
    /// The SQLite syncer: WAL `fdatasync`s and waking the answers.
    pub sqlite_syncer: f64,
    /// Everything else (checkpointer, read pool, main thread).
    pub other: f64,
}

/// Bytes written (`wchar` of `/proc/<pid>/task/<tid>/io`) by the SQLite threads that write.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ThreadIo {
    /// The writer: WAL frames of every commit (and WAL headers when the WAL restarts).
    pub(super) wal_writer: f64,
    /// The checkpointer: pages copied into the database file.
    pub(super) checkpointer: f64,
}

pub(super) fn io_wchar(task: &Path) -> Option<f64> {
    let io = std::fs::read_to_string(task.join("io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// CPU time of one thread in microseconds: `schedstat`'s time on CPU (nanoseconds), or
/// `stat`'s user + system ticks (10 ms) where schedstat is not available.
pub(super) fn task_cpu_us(task: &Path) -> Option<f64> {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ns| ns / 1000.0)
        .or_else(|| stat_cpu_us(&task.join("stat")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ThreadKind {
    Runtime,
    Writer,
    Syncer,
    Checkpointer,
    Other,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct TaskSample {
    pub(super) kind: ThreadKind,
    pub(super) cpu_us: f64,
    pub(super) wchar: f64,
}

/// The live threads of a process, each with its CPU time and bytes written so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Tasks(pub(super) std::collections::HashMap<u64, TaskSample>);

impl Tasks {
    pub(super) fn of(pid: u32) -> Self {
        let mut tasks = Tasks::default();
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return tasks;
        };
        for task in entries.flatten() {
            let path = task.path();
            let (Some(tid), Ok(comm), Some(cpu_us)) = (
                task.file_name()
                    .to_str()
                    .and_then(|t| t.parse::<u64>().ok()),
                std::fs::read_to_string(path.join("comm")),
                task_cpu_us(&path),
            ) else {
                continue;
            };
            let kind = match comm.trim() {
                "tokio-rt-worker" => ThreadKind::Runtime,
                "sqlite-writer" => ThreadKind::Writer,
                "sqlite-syncer" => ThreadKind::Syncer,
                // Thread names are cut to 15 bytes.
                "sqlite-checkpoi" | "sqlite-checkpointer" => ThreadKind::Checkpointer,
                _ => ThreadKind::Other,
            };
            let wchar = match kind {
                ThreadKind::Writer | ThreadKind::Checkpointer => io_wchar(&path).unwrap_or(0.0),
                _ => 0.0,
            };
            tasks.0.insert(
                tid,
                TaskSample {
                    kind,
                    cpu_us,
                    wchar,
                },
            );
        }
        tasks
    }

    /// What the threads did since `before`. A thread that exited meanwhile is left out
    /// (only its time within the phase is lost: tokio's blocking threads exit after 10 s
    /// idle), and one that started counts from zero.
    pub(super) fn since(&self, before: &Tasks) -> (f64, ThreadCpu, ThreadIo) {
        let (mut total, mut cpu, mut io) = (0.0, ThreadCpu::default(), ThreadIo::default());
        for (tid, now) in &self.0 {
            let (cpu_before, wchar_before) = before
                .0
                .get(tid)
                .map_or((0.0, 0.0), |b| (b.cpu_us, b.wchar));
            let (d_cpu, d_wchar) = (now.cpu_us - cpu_before, now.wchar - wchar_before);
            total += d_cpu;
            *match now.kind {
                ThreadKind::Runtime => &mut cpu.runtime,
                ThreadKind::Writer => &mut cpu.sqlite_writer,
                ThreadKind::Syncer => &mut cpu.sqlite_syncer,
                ThreadKind::Checkpointer | ThreadKind::Other => &mut cpu.other,
            } += d_cpu;
            match now.kind {
                ThreadKind::Writer => io.wal_writer += d_wchar,
                ThreadKind::Checkpointer => io.checkpointer += d_wchar,
                _ => {}
            }
        }
        (total, cpu, io)
    }
}

impl ThreadCpu {
    pub(super) fn combine(self, other: ThreadCpu, f: impl Fn(f64, f64) -> f64) -> ThreadCpu {
        ThreadCpu {
            runtime: f(self.runtime, other.runtime),
            sqlite_writer: f(self.sqlite_writer, other.sqlite_writer),
            sqlite_syncer: f(self.sqlite_syncer, other.sqlite_syncer),
            other: f(self.other, other.other),
        }
    }

    pub(super) fn per(self, messages: f64) -> ThreadCpu {
        ThreadCpu {
            runtime: per(self.runtime, messages),
            sqlite_writer: per(self.sqlite_writer, messages),
            sqlite_syncer: per(self.sqlite_syncer, messages),
            other: per(self.other, messages),
        }
    }
}

/// CPU time from a thread's `stat` file: user + system in USER_HZ ticks, which Linux
/// fixes at 100 per second.
pub(super) fn stat_cpu_us(path: &Path) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name may contain spaces; fields are counted after its closing ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 10_000.0)
}

/// The CPUs this process may run on.
pub(super) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Restricts every thread of this process to `cpus` (threads started later inherit the
/// mask of the thread that starts them).
pub(super) fn pin_this_process(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: as in allowed_cpus; sched_setaffinity only reads the set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    for task in std::fs::read_dir("/proc/self/task")?.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if unsafe { libc::sched_setaffinity(tid, size, &set) } != 0 {
            let error = std::io::Error::last_os_error();
            // A thread that exited meanwhile is not an error.
            if error.raw_os_error() != Some(libc::ESRCH) {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// One core for `serve`, another for the load generator, if there are two.
pub(super) fn plan_pinning(disabled: bool) -> Pinning {
    let cpus = allowed_cpus();
    if disabled {
        return Pinning {
            serve_cpu: None,
            generator_cpu: None,
            warning: Some("pinning off (--no-pin): serve and the generator share the cores".into()),
        };
    }
    match cpus.as_slice() {
        [generator, serve, ..] => Pinning {
            serve_cpu: Some(*serve),
            generator_cpu: Some(*generator),
            warning: None,
        },
        _ => Pinning {
            serve_cpu: None,
            generator_cpu: None,
            warning: Some(format!(
                "WARNING: {} core(s) available ({cpus:?}); serve and the load generator cannot be \
                 pinned apart and share them",
                cpus.len()
            )),
        },
    }
}

/// Pins this process (the load generator) for the throughput phases and restores the
/// previous CPUs when dropped.
pub(super) struct GeneratorPin {
    pub(super) restore: Vec<usize>,
}

impl GeneratorPin {
    pub(super) fn new(pinning: &Pinning) -> anyhow::Result<Option<Self>> {
        let Some(cpu) = pinning.generator_cpu else {
            return Ok(None);
        };
        let restore = allowed_cpus();
        pin_this_process(&[cpu]).context("cannot pin the load generator")?;
        Ok(Some(GeneratorPin { restore }))
    }
}

impl Drop for GeneratorPin {
    fn drop(&mut self) {
        let _ = pin_this_process(&self.restore);
    }
}
