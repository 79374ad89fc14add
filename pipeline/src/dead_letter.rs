//! Dead-letter files: bad records as JSON lines, each write a new object under a directory
//! (local path or object-store URL), stored before the caller goes on — so a bad record is
//! durable before the good rows that came with it are handed on. Used by the Kafka source
//! (undecodable messages) and the `image` stage (`on_error: skip` with `dead_letter`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use object_store::{ObjectStoreExt, PutPayload};

use crate::config::DeadLetterFile;
use crate::error::{Error, Result};
use crate::storage::{StorageConfig, resolve};

/// An open dead-letter directory. Objects are named
/// `dead-letter-<start ms>-rank<r>-<pid>-<n>-<seq>.jsonl`, so the sinks of ranks and runs
/// sharing the directory never overwrite each other.
#[derive(Debug)]
pub(crate) struct DeadLetterFiles {
    dir: String,
    base_dir: PathBuf,
    storage: StorageConfig,
    run_id: String,
    seq: u64,
}

impl DeadLetterFiles {
    /// Opens `config`'s directory (relative paths against `base_dir`) for `rank`; fails early
    /// on a location that cannot be written to.
    pub(crate) fn open(config: &DeadLetterFile, base_dir: &Path, rank: usize) -> Result<Self> {
        let dir = config.path.trim_end_matches('/').to_string();
        resolve(&format!("{dir}/probe"), base_dir, &config.storage)?;
        Ok(DeadLetterFiles {
            dir,
            base_dir: base_dir.to_path_buf(),
            storage: config.storage.clone(),
            run_id: run_id(rank),
            seq: 0,
        })
    }

    /// Writes `lines` as one new object; returns once it is stored.
    pub(crate) async fn write(&mut self, lines: &[serde_json::Value]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut body = Vec::new();
        for line in lines {
            body.extend_from_slice(line.to_string().as_bytes());
            body.push(b'\n');
        }
        let name = format!(
            "{}/dead-letter-{}-{:06}.jsonl",
            self.dir, self.run_id, self.seq
        );
        self.seq += 1;
        let loc = resolve(&name, &self.base_dir, &self.storage)?;
        loc.store
            .put(&loc.path, PutPayload::from(body))
            .await
            .map_err(|e| Error::Storage {
                url: loc.url.to_string(),
                operation: "writing dead-letter records",
                source: e,
            })?;
        Ok(())
    }
}

/// Names the objects of one sink apart from every other sink's: the start time, the rank
/// (ranks of one job on different hosts), the process, and a count of the sinks this process
/// opened (ranks that run as threads of one process start within the same millisecond).
fn run_id(rank: usize) -> String {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}-rank{rank}-{}-{}",
        now.as_millis(),
        std::process::id(),
        OPENED.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_opened_together_name_their_objects_apart() {
        let ids: Vec<String> = [0, 0, 1, 1].into_iter().map(run_id).collect();
        let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
        assert!(ids[2].contains("-rank1-"), "{}", ids[2]);
    }
}
