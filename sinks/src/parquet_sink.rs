//! `type: parquet`: one file, or (with `max_rows_per_file`) numbered part files that become
//! visible one by one, so a long or unbounded run has durable output while it runs and can
//! checkpoint.

use async_trait::async_trait;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::Deserialize;
use sluice_pipeline::storage::{ObjectLocation, StorageConfig, resolve};
use sluice_pipeline::{Batch, CpuPool};

use crate::file::{SharedBuf, Upload};
use crate::guard::{self, OutputLock, check_parts_dir, check_replaceable};
use crate::{Error, Result, Sink, SinkContext, SinkReport};

/// Parquet column compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ParquetCompression {
    /// zstd (level from `zstd_level`).
    #[default]
    Zstd,
    /// Snappy.
    Snappy,
    /// LZ4 (raw).
    Lz4,
    /// No compression.
    None,
}

/// `type: parquet` — one Parquet file, written atomically: the data goes to a temporary object
/// and appears under `path` only when complete. A failed or interrupted run leaves nothing
/// under `path`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParquetSinkConfig {
    /// Output file: path or URL (`file://`, `s3://`, `gs://`, `az://`; relative paths resolve
    /// against the config file's directory).
    pub path: String,
    /// Rows per row group. Default: 65536.
    #[serde(default = "default_row_group_size")]
    pub row_group_size: usize,
    /// `zstd` (default), `snappy`, `lz4` or `none`.
    #[serde(default)]
    pub compression: ParquetCompression,
    /// zstd level, 1–22. Default: 3.
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
    /// Replace an existing file (part-file mode: remove the directory's `part-*.parquet`
    /// first). Default: true.
    #[serde(default = "crate::default_true")]
    pub overwrite: bool,
    /// Write numbered part files `part-00000.parquet`, … under `path` (a directory), each
    /// closed and made visible at the first batch boundary at or past this many rows (and at
    /// every checkpoint). Needed for checkpoints and unbounded sources: output is durable
    /// while the run goes on. Default: one file.
    #[serde(default)]
    pub max_rows_per_file: Option<u64>,
    /// How to reach the object store (options, retry budget), as for sources.
    #[serde(default)]
    pub storage: StorageConfig,
}

fn default_row_group_size() -> usize {
    65536
}
fn default_zstd_level() -> i32 {
    3
}

/// One file being written.
struct Part {
    writer: Option<ArrowWriter<SharedBuf>>,
    buf: SharedBuf,
    upload: Upload,
    rows: u64,
}

impl Part {
    fn encode_err(&self, e: impl std::fmt::Display) -> Error {
        Error::Encode {
            url: self.upload.location.url.to_string(),
            message: e.to_string(),
        }
    }

    async fn write(&mut self, pool: &CpuPool, batch: &Batch) -> Result<()> {
        let mut writer = self
            .writer
            .take()
            .ok_or_else(|| Error::Internal("parquet writer used after an error".into()))?;
        let data = batch.data.clone();
        let (writer, result) = pool
            .run(move || {
                let r = writer.write(&data);
                (writer, r)
            })
            .await
            .map_err(|e| self.encode_err(e))?;
        result.map_err(|e| self.encode_err(e))?;
        self.writer = Some(writer);
        self.rows += batch.num_rows() as u64;
        let bytes = self.buf.take();
        self.upload.put(bytes).await
    }

    /// Closes the file and makes it visible while `lock` is held; on failure nothing is left.
    async fn complete(
        mut self,
        pool: &CpuPool,
        lock: &Option<OutputLock>,
    ) -> Result<(String, u64)> {
        let Some(writer) = self.writer.take() else {
            self.upload.abort().await;
            return Err(Error::Internal("parquet writer used after an error".into()));
        };
        let closed = pool.run(move || writer.close().map(|_| ())).await;
        if let Err(e) = closed
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            let err = self.encode_err(e);
            self.upload.abort().await;
            return Err(err);
        }
        let bytes = self.buf.take();
        let mut upload = self.upload;
        if let Err(e) = upload.put(bytes).await {
            upload.abort().await;
            return Err(e);
        }
        upload.complete(lock).await
    }
}

pub(crate) struct ParquetSink {
    config: ParquetSinkConfig,
    cx: SinkContext,
    props: WriterProperties,
    current: Option<Part>,
    /// Part-file mode: the directory and the number of the next part.
    parts: Option<(String, u64)>,
    rows: u64,
    batches: u64,
    bytes: u64,
    files: u64,
    /// This run's claim on the output, held until the sink is done.
    lock: Option<OutputLock>,
}

/// Name of part `n` under `dir`.
fn part_name(dir: &str, n: u64) -> String {
    format!("{dir}/part-{n:05}.parquet")
}

/// Part files already under `dir`: (number, location).
async fn existing_parts(
    dir: &str,
    c: &ParquetSinkConfig,
    cx: &SinkContext,
) -> Result<Vec<(u64, ObjectLocation)>> {
    let probe = resolve(&part_name(dir, 0), &cx.base_dir, &c.storage)?;
    let prefix = probe.path.parts().collect::<Vec<_>>();
    let parent: object_store::path::Path = prefix[..prefix.len().saturating_sub(1)]
        .iter()
        .cloned()
        .collect();
    let listed: Vec<object_store::ObjectMeta> =
        match probe.store.list(Some(&parent)).try_collect().await {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(source) => {
                return Err(Error::Storage {
                    url: dir.to_string(),
                    source,
                });
            }
        };
    let mut out = Vec::new();
    for m in listed {
        let Some(name) = m.location.filename() else {
            continue;
        };
        if let Some(n) = name
            .strip_prefix("part-")
            .and_then(|r| r.strip_suffix(".parquet"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push((n, resolve(&part_name(dir, n), &cx.base_dir, &c.storage)?));
        }
    }
    out.sort_by_key(|(n, _)| *n);
    Ok(out)
}

impl ParquetSink {
    pub(crate) async fn new(c: &ParquetSinkConfig, cx: &SinkContext) -> Result<Self> {
        let compression = match c.compression {
            ParquetCompression::Zstd => {
                Compression::ZSTD(ZstdLevel::try_new(c.zstd_level).map_err(|e| Error::Encode {
                    url: c.path.clone(),
                    message: format!("zstd_level: {e}"),
                })?)
            }
            ParquetCompression::Snappy => Compression::SNAPPY,
            ParquetCompression::Lz4 => Compression::LZ4_RAW,
            ParquetCompression::None => Compression::UNCOMPRESSED,
        };
        if c.row_group_size == 0 {
            return Err(Error::Encode {
                url: c.path.clone(),
                message: "row_group_size must be at least 1".into(),
            });
        }
        let props = WriterProperties::builder()
            .set_compression(compression)
            .set_max_row_group_row_count(Some(c.row_group_size))
            .build();
        let mut sink = ParquetSink {
            config: c.clone(),
            cx: cx.clone(),
            props,
            current: None,
            parts: None,
            rows: 0,
            batches: 0,
            bytes: 0,
            files: 0,
            lock: None,
        };
        // A sink that cannot start gives its claim back at once: a retry must not wait out
        // a lease.
        if let Err(e) = sink.open(c, cx).await {
            guard::release(sink.lock.take()).await;
            return Err(e);
        }
        Ok(sink)
    }

    /// Claims the output and prepares it: the one file started, or the parts directory
    /// cleared from where this run writes.
    async fn open(&mut self, c: &ParquetSinkConfig, cx: &SinkContext) -> Result<()> {
        match c.max_rows_per_file {
            None => {
                let target = resolve(&c.path, &cx.base_dir, &c.storage)?;
                check_replaceable(&target)?;
                self.lock = OutputLock::acquire(&target, false).await?;
                // One file: started now, so a location problem shows before any data is read.
                self.current = Some(self.start(&c.path, c.overwrite).await?);
            }
            Some(0) => {
                return Err(Error::Encode {
                    url: c.path.clone(),
                    message: "max_rows_per_file must be at least 1".into(),
                });
            }
            Some(_) => {
                let dir = c.path.trim_end_matches('/').to_string();
                let target = resolve(&dir, &cx.base_dir, &c.storage)?;
                check_parts_dir(&target)?;
                // Claimed before anything in it is listed or deleted.
                self.lock = OutputLock::acquire(&target, true).await?;
                let existing = existing_parts(&dir, c, cx).await?;
                for (_, loc) in &existing {
                    check_replaceable(loc)?;
                }
                let next = match cx.resume.as_ref().and_then(|s| s.get("next_part")) {
                    Some(n) => n.as_u64().ok_or_else(|| {
                        Error::Internal(format!("checkpoint has a bad sink state: {n}"))
                    })?,
                    None => {
                        if !existing.is_empty() && !c.overwrite {
                            return Err(Error::Exists {
                                url: existing[0].1.url.to_string(),
                            });
                        }
                        0
                    }
                };
                // The parts the checkpoint covers should all be there; a downstream job may
                // have moved some away on purpose, so a gap is said, not refused.
                let kept = existing.iter().filter(|(n, _)| *n < next).count() as u64;
                if cx.resume.is_some() && kept < next {
                    tracing::warn!(
                        "resuming into {dir}/: the checkpoint covers part files 0..{next}, but {} of them are not there (moved or deleted?): the output holds every row only with them; this run writes from part-{next:05}",
                        next - kept
                    );
                }
                // Parts at or after `next` were written after the checkpoint (or by an
                // earlier run being overwritten): they are written again.
                for (n, loc) in existing {
                    if n >= next {
                        loc.store
                            .delete(&loc.path)
                            .await
                            .map_err(|source| Error::Storage {
                                url: loc.url.to_string(),
                                source,
                            })?;
                    }
                }
                self.parts = Some((dir, next));
            }
        }
        Ok(())
    }

    fn start(
        &self,
        path: &str,
        overwrite: bool,
    ) -> impl Future<Output = Result<Part>> + Send + use<> {
        start_part(
            path.to_string(),
            overwrite,
            self.config.clone(),
            self.cx.clone(),
            self.props.clone(),
        )
    }

    async fn complete_current(&mut self) -> Result<Option<String>> {
        let Some(part) = self.current.take() else {
            return Ok(None);
        };
        let pool = self.cx.pool.clone();
        let (url, bytes) = part.complete(&pool, &self.lock).await?;
        self.bytes += bytes;
        self.files += 1;
        if let Some((_, next)) = self.parts.as_mut() {
            *next += 1;
        }
        Ok(Some(url))
    }
}

async fn start_part(
    path: String,
    overwrite: bool,
    config: ParquetSinkConfig,
    cx: SinkContext,
    props: WriterProperties,
) -> Result<Part> {
    {
        let upload = Upload::start(&path, overwrite, &config.storage, &cx).await?;
        let buf = SharedBuf::default();
        let writer =
            ArrowWriter::try_new(buf.clone(), cx.schema.clone(), Some(props)).map_err(|e| {
                Error::Encode {
                    url: upload.location.url.to_string(),
                    message: e.to_string(),
                }
            })?;
        Ok(Part {
            writer: Some(writer),
            buf,
            upload,
            rows: 0,
        })
    }
}

#[async_trait]
impl Sink for ParquetSink {
    async fn write(&mut self, batch: &Batch) -> Result<()> {
        if self.current.is_none()
            && let Some((dir, next)) = &self.parts
        {
            let name = part_name(dir, *next);
            self.current = Some(self.start(&name, true).await?);
        }
        let part = self
            .current
            .as_mut()
            .ok_or_else(|| Error::Internal("parquet sink has no open file".into()))?;
        let pool = self.cx.pool.clone();
        part.write(&pool, batch).await?;
        self.rows += batch.num_rows() as u64;
        self.batches += 1;
        if let Some(max) = self.config.max_rows_per_file
            && part.rows >= max
        {
            self.complete_current().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<bool> {
        if self.parts.is_none() {
            return Ok(false);
        }
        self.complete_current().await?;
        Ok(true)
    }

    fn state(&self) -> Option<serde_json::Value> {
        self.parts
            .as_ref()
            .map(|(_, next)| serde_json::json!({ "next_part": next }))
    }

    async fn finish(mut self: Box<Self>) -> Result<SinkReport> {
        let url = self.complete_current().await;
        guard::release(self.lock.take()).await;
        let url = url?;
        let location = match &self.parts {
            Some((dir, _)) => Some(format!("{dir}/ ({} part files)", self.files)),
            None => url,
        };
        Ok(SinkReport {
            rows: self.rows,
            batches: self.batches,
            bytes: self.bytes,
            location,
        })
    }

    async fn abort(mut self: Box<Self>) {
        if let Some(part) = self.current.take() {
            part.upload.abort().await;
        }
        guard::release(self.lock.take()).await;
    }
}
