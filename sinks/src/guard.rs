//! What a sink may touch, checked before anything is read or written:
//!
//! - never its own source's inputs ([`check_overlap`]): a sink over the files it reads would
//!   delete or replace them, and a glob that matches the output would read it back next run;
//! - never anything at its path that is not a regular file ([`check_replaceable`]): the
//!   write-then-rename that makes output atomic would replace a device, a FIFO, a socket or a
//!   symlink itself;
//! - never output another run is writing ([`OutputLock`]): two runs into one parts directory
//!   would delete and renumber each other's parts.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use object_store::path::Path as ObjectPath;
use sluice_pipeline::sources::SourceConfig;
use sluice_pipeline::storage::{ObjectLocation, local_file, resolve, spec_names};

use crate::lease::{Holder, LEASE, Lease};
use crate::{Error, Result, SinkConfig};

/// Where a sink writes, as far as its source could read it.
enum Output {
    /// One file (`parquet` without `max_rows_per_file`, `arrow_ipc`).
    File(ObjectLocation),
    /// A directory of part files.
    Parts(ObjectLocation),
}

impl Output {
    fn of(sink: &SinkConfig, base_dir: &Path) -> Result<Option<Output>> {
        Ok(match sink {
            SinkConfig::Parquet(c) if c.max_rows_per_file.is_some() => Some(Output::Parts(
                resolve(c.path.trim_end_matches('/'), base_dir, &c.storage)?,
            )),
            SinkConfig::Parquet(c) => Some(Output::File(resolve(&c.path, base_dir, &c.storage)?)),
            SinkConfig::ArrowIpc(c) => Some(Output::File(resolve(&c.path, base_dir, &c.storage)?)),
            SinkConfig::Null(_) | SinkConfig::Kafka(_) => None,
        })
    }

    /// An object this output writes: the file, or the first part file.
    fn probe(&self) -> String {
        match self {
            Output::File(l) => l.url.to_string(),
            Output::Parts(l) => format!("{}/part-00000.parquet", l.url),
        }
    }

    fn describe(&self) -> String {
        match self {
            Output::File(l) => format!("the sink's output file {}", l.url),
            Output::Parts(l) => format!("the sink's part files in {}/", l.url),
        }
    }

    fn container(&self) -> String {
        match self {
            Output::File(_) => "the sink's output file".to_string(),
            Output::Parts(l) => format!("inside the sink's parts directory {}/", l.url),
        }
    }

    /// Whether the object at `url` (local: `path`, canonical) is this output or inside it.
    fn holds(&self, url: &str, path: Option<&Path>) -> bool {
        let (own, local) = match self {
            Output::File(l) | Output::Parts(l) => (l.url.as_ref(), local_file(l)),
        };
        let canonical = local.as_deref().and_then(canonical_target);
        match self {
            Output::File(_) => url == own || path.is_some_and(|p| canonical.as_deref() == Some(p)),
            Output::Parts(_) => {
                url.starts_with(&format!("{own}/"))
                    || path.is_some_and(|p| canonical.as_deref().is_some_and(|d| p.starts_with(d)))
            }
        }
    }
}

/// The canonical path of `path`, which need not exist: its nearest existing ancestor made
/// canonical (symlinks resolved), the rest appended.
fn canonical_target(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Some(p);
    }
    let (parent, name) = (path.parent()?, path.file_name()?);
    Some(canonical_target(parent)?.join(name))
}

/// A file sink on `http(s)://` is refused before the run reads anything: the sinks upload in
/// parts, which `object_store`'s HTTP client does not do (it failed at the first write, after
/// the source had been read).
fn refuse_http_output(sink: &SinkConfig, base_dir: &Path) -> Result<()> {
    let Some(output) = Output::of(sink, base_dir)? else {
        return Ok(());
    };
    let url = output.probe();
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(Error::Location(sluice_pipeline::Error::InvalidUrl {
            url,
            reason: "a sink cannot write to http(s):// (Sluice's sinks upload in parts, which its HTTP client cannot do): write to local disk or an object store (s3://, gs://, az://)".into(),
        }));
    }
    Ok(())
}

/// Refuses a sink that would write where its source reads: the same file, a parts directory
/// holding inputs, or a source `path` (glob or prefix) that would match the output; and a file
/// sink on `http(s)://`. Called before the source is opened, so nothing has been read or
/// deleted when it refuses.
pub async fn check_overlap(
    sink: &SinkConfig,
    source: &SourceConfig,
    base_dir: &Path,
) -> Result<()> {
    refuse_http_output(sink, base_dir)?;
    match (sink, source) {
        (SinkConfig::Kafka(k), SourceConfig::Kafka(s)) => {
            let shared_broker = k.brokers.0.iter().any(|b| s.brokers.0.contains(b));
            if shared_broker && s.topic.0.contains(&k.topic) {
                return Err(Error::Overlap(format!(
                    "the sink publishes to topic `{}`, which the source reads: the run would read its own output without end; publish to another topic",
                    k.topic
                )));
            }
            Ok(())
        }
        (_, SourceConfig::Parquet(p)) => {
            let Some(output) = Output::of(sink, base_dir)? else {
                return Ok(());
            };
            let probe = output.probe();
            for spec in p.path.iter().flat_map(|p| p.0.iter()) {
                // A spec that does not parse is the source's to report.
                if spec_names(spec, base_dir, &probe).unwrap_or(false) {
                    return Err(Error::Overlap(format!(
                        "the source's `path` entry `{spec}` matches {}: the run would read its own output (and replace or delete its inputs); write somewhere the source does not read",
                        output.describe()
                    )));
                }
            }
            // Files the listing finds there now (a manifest, a symlink into the output);
            // a listing that fails is the source's to report when it opens.
            let Ok(inputs) = sluice_pipeline::input_objects(p, base_dir).await else {
                return Ok(());
            };
            for input in inputs {
                let path = local_file(&input.location).and_then(|p| p.canonicalize().ok());
                if output.holds(&input.location.url, path.as_deref()) {
                    return Err(Error::Overlap(format!(
                        "the source reads {}, which is {}: the run would replace or delete its own input; write somewhere the source does not read",
                        input.location.url,
                        output.container()
                    )));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What a local file-system entry is, in words, when it is not a regular file.
fn not_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_symlink() {
        Some("a symbolic link")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else {
        Some("not a regular file")
    }
}

/// Refuses to replace what sits at `location` unless it is a regular file or absent: the
/// staged write renames a new file into place, which would turn a device, FIFO, socket,
/// symlink or directory into a plain file. Object stores hold only objects: nothing to check.
pub fn check_replaceable(location: &ObjectLocation) -> Result<()> {
    let Some(path) = local_file(location) else {
        return Ok(());
    };
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return Ok(());
    };
    match not_regular(&meta) {
        None => Ok(()),
        Some("a directory") => Err(Error::NotAFile {
            url: location.url.to_string(),
            what: "a directory",
            hint: "give a file path, or set `max_rows_per_file` to write part files into the directory",
        }),
        Some(what) => Err(Error::NotAFile {
            url: location.url.to_string(),
            what,
            hint: "Sluice replaces only regular files; choose another path, or use `sink: {type: null}` to discard the output",
        }),
    }
}

/// Refuses a parts directory that is not a directory (symlinks to one are followed).
pub(crate) fn check_parts_dir(dir: &ObjectLocation) -> Result<()> {
    let Some(path) = local_file(dir) else {
        return Ok(());
    };
    match std::fs::metadata(&path) {
        Ok(m) if !m.is_dir() => Err(Error::NotAFile {
            url: dir.url.to_string(),
            what: not_regular(&m).unwrap_or("a file"),
            hint: "`max_rows_per_file` writes a directory of part files; give a directory path, or drop `max_rows_per_file` to write one file",
        }),
        _ => Ok(()),
    }
}

/// A sink's claim on its output: one run at a time writes a given file or parts directory.
///
/// Local disk: an advisory lock (`flock`) on `.sluice.lock` in the parts directory, or
/// `.<name>.sluice.lock` beside a single file. The kernel drops it when the process ends,
/// however it ends, so a crashed run never leaves a stale lock. The file is removed when the
/// sink is done. Object stores: a lease object of the same name, written with conditional
/// puts ([`crate::lease`]); a killed run's lease lapses after [`crate::lease::LEASE`].
#[derive(Debug)]
pub(crate) enum OutputLock {
    Local(LocalLock),
    Remote(Lease),
}

impl OutputLock {
    /// Claims `target` (a file, or with `parts` a directory); `None` on a store without
    /// conditional writes. Under a local claim, staging files an earlier killed run left for
    /// this output are removed.
    pub(crate) async fn acquire(
        target: &ObjectLocation,
        parts: bool,
    ) -> Result<Option<OutputLock>> {
        if local_file(target).is_some() {
            return Ok(LocalLock::acquire(target, parts)?.map(OutputLock::Local));
        }
        let lock = lock_name(&target.path, parts);
        let lease = Lease::acquire(target.store.clone(), lock, target.url.as_ref(), LEASE).await?;
        Ok(lease.map(OutputLock::Remote))
    }

    /// Succeeds while the claim is held; called before output is made visible.
    pub(crate) async fn ensure(&self) -> Result<()> {
        match self {
            OutputLock::Local(_) => Ok(()),
            OutputLock::Remote(lease) => lease.ensure().await,
        }
    }

    /// Gives the claim up.
    pub(crate) async fn release(self) {
        match self {
            OutputLock::Local(lock) => drop(lock),
            OutputLock::Remote(lease) => lease.release().await,
        }
    }
}

/// Checks `lock` (if any) before output becomes visible.
pub(crate) async fn ensure(lock: &Option<OutputLock>) -> Result<()> {
    match lock {
        Some(l) => l.ensure().await,
        None => Ok(()),
    }
}

/// Releases `lock` (if any).
pub(crate) async fn release(lock: Option<OutputLock>) {
    if let Some(l) = lock {
        l.release().await;
    }
}

/// The lock object of an output in a store: `<dir>/.sluice.lock` for parts, or
/// `.<name>.sluice.lock` beside one file.
fn lock_name(target: &ObjectPath, parts: bool) -> ObjectPath {
    let mut segments: Vec<String> = target.parts().map(|p| p.as_ref().to_string()).collect();
    if parts {
        segments.push(".sluice.lock".into());
    } else if let Some(name) = segments.pop() {
        segments.push(format!(".{name}.sluice.lock"));
    }
    ObjectPath::from_iter(segments)
}

/// The local-disk claim: an advisory lock on a lock file.
#[derive(Debug)]
pub(crate) struct LocalLock {
    path: PathBuf,
    _file: File,
}

impl LocalLock {
    /// Claims local `target` (a file, or with `parts` a directory).
    fn acquire(target: &ObjectLocation, parts: bool) -> Result<Option<LocalLock>> {
        let Some(path) = local_file(target) else {
            return Ok(None);
        };
        let (dir, lock_path, staged_prefix) = if parts {
            (path.clone(), path.join(".sluice.lock"), None)
        } else {
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let lock = dir.join(format!(".{name}.sluice.lock"));
            (dir, lock, Some(format!("{name}#")))
        };
        let io = |e: std::io::Error| Error::Lock {
            url: target.url.to_string(),
            message: format!("cannot take the lock {}: {e}", lock_path.display()),
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        // Open, lock, then check the path still names the locked file: a run finishing
        // removes its lock file, so one opened just before that is not the lock any more.
        let file = loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&lock_path)
                .map_err(io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
                    return Err(Error::Lock {
                        url: target.url.to_string(),
                        message: format!(
                            "another run is writing this output ({}; lock {}): wait for it to finish, or write elsewhere",
                            holder.trim(),
                            lock_path.display()
                        ),
                    });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
            let same = match (file.metadata(), std::fs::metadata(&lock_path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if same {
                break file;
            }
        };
        let mut file = file;
        // What the lock says is for the message of a refused run only.
        let holder = Holder::ours(LEASE).describe();
        let _ = file
            .set_len(0)
            .and_then(|()| file.write_all(holder.as_bytes()));
        remove_staged(&dir, staged_prefix.as_deref());
        Ok(Some(LocalLock {
            path: lock_path,
            _file: file,
        }))
    }
}

impl Drop for LocalLock {
    fn drop(&mut self) {
        // Removed while still held; the lock itself goes with the file handle.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes the staging files (`<name>#<n>`, written by the local store before its rename)
/// that a killed run left for this output: `prefix` `<name>#` for one file, every
/// `part-*.parquet#<n>` for a parts directory.
fn remove_staged(dir: &Path, prefix: Option<&str>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let (mut n, mut bytes) = (0u64, 0u64);
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((base, suffix)) = name.rsplit_once('#') else {
            continue;
        };
        let ours = match prefix {
            Some(p) => name.starts_with(p),
            None => base.starts_with("part-") && base.ends_with(".parquet"),
        };
        if !ours || suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let size = e.metadata().map(|m| m.len()).unwrap_or(0);
        if std::fs::remove_file(e.path()).is_ok() {
            n += 1;
            bytes += size;
        }
    }
    if n > 0 {
        tracing::warn!(
            "removed {n} staging file(s) ({bytes} bytes) that an earlier, killed run left in {}",
            dir.display()
        );
    }
}
