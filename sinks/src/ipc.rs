//! `type: arrow_ipc`.

use arrow::ipc::CompressionType;
use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use async_trait::async_trait;
use serde::Deserialize;
use sluice_pipeline::storage::StorageConfig;
use sluice_pipeline::{Batch, CpuPool};

use crate::file::{SharedBuf, Upload};
use crate::guard::{self, OutputLock, check_replaceable};
use crate::{Error, Result, Sink, SinkContext, SinkReport};

/// Arrow IPC buffer compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IpcCompression {
    /// zstd.
    #[default]
    Zstd,
    /// LZ4 frame.
    Lz4,
    /// No compression.
    None,
}

/// `type: arrow_ipc` — one Arrow IPC *file* (random-access format, readable by
/// `pyarrow.ipc.open_file`), written atomically like the Parquet sink.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrowIpcSinkConfig {
    /// Output file: path or URL (`file://`, `s3://`, `gs://`, `az://`; relative paths resolve
    /// against the config file's directory).
    pub path: String,
    /// `zstd` (default), `lz4` or `none`.
    #[serde(default)]
    pub compression: IpcCompression,
    /// Replace an existing file. Default: true.
    #[serde(default = "crate::default_true")]
    pub overwrite: bool,
    /// How to reach the object store (options, retry budget), as for sources.
    #[serde(default)]
    pub storage: StorageConfig,
}

pub(crate) struct IpcSink {
    writer: Option<FileWriter<SharedBuf>>,
    buf: SharedBuf,
    upload: Upload,
    pool: CpuPool,
    rows: u64,
    batches: u64,
    /// This run's claim on the output, held until the sink is done.
    lock: Option<OutputLock>,
}

impl IpcSink {
    pub(crate) async fn new(c: &ArrowIpcSinkConfig, cx: &SinkContext) -> Result<Self> {
        let compression = match c.compression {
            IpcCompression::Zstd => Some(CompressionType::ZSTD),
            IpcCompression::Lz4 => Some(CompressionType::LZ4_FRAME),
            IpcCompression::None => None,
        };
        let target = sluice_pipeline::storage::resolve(&c.path, &cx.base_dir, &c.storage)?;
        check_replaceable(&target)?;
        let lock = OutputLock::acquire(&target, false).await?;
        // A sink that cannot start gives its claim back at once: a retry must not wait out
        // a lease.
        let upload = match Upload::start(&c.path, c.overwrite, &c.storage, cx).await {
            Ok(u) => u,
            Err(e) => {
                guard::release(lock).await;
                return Err(e);
            }
        };
        let url = upload.location.url.to_string();
        let enc = |e: arrow::error::ArrowError| Error::Encode {
            url: url.clone(),
            message: e.to_string(),
        };
        let buf = SharedBuf::default();
        let writer = IpcWriteOptions::default()
            .try_with_compression(compression)
            .and_then(|options| FileWriter::try_new_with_options(buf.clone(), &cx.schema, options));
        let writer = match writer {
            Ok(w) => w,
            Err(e) => {
                upload.abort().await;
                guard::release(lock).await;
                return Err(enc(e));
            }
        };
        Ok(IpcSink {
            writer: Some(writer),
            buf,
            upload,
            pool: cx.pool.clone(),
            rows: 0,
            batches: 0,
            lock,
        })
    }

    fn encode_err(&self, e: impl std::fmt::Display) -> Error {
        Error::Encode {
            url: self.upload.location.url.to_string(),
            message: e.to_string(),
        }
    }
}

#[async_trait]
impl Sink for IpcSink {
    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let mut writer = self
            .writer
            .take()
            .ok_or_else(|| Error::Internal("IPC writer used after an error".into()))?;
        let data = batch.data.clone();
        let (writer, result) = self
            .pool
            .run(move || {
                let r = writer.write(&data);
                (writer, r)
            })
            .await
            .map_err(|e| self.encode_err(e))?;
        result.map_err(|e| self.encode_err(e))?;
        self.writer = Some(writer);
        self.rows += batch.num_rows() as u64;
        self.batches += 1;
        let bytes = self.buf.take();
        self.upload.put(bytes).await
    }

    async fn finish(mut self: Box<Self>) -> Result<SinkReport> {
        let Some(mut writer) = self.writer.take() else {
            self.abort().await;
            return Err(Error::Internal("IPC writer used after an error".into()));
        };
        if let Err(e) = writer.finish() {
            let err = self.encode_err(e);
            self.abort().await;
            return Err(err);
        }
        let bytes = self.buf.take();
        let this = *self;
        let mut upload = this.upload;
        if let Err(e) = upload.put(bytes).await {
            upload.abort().await;
            guard::release(this.lock).await;
            return Err(e);
        }
        let done = upload.complete(&this.lock).await;
        guard::release(this.lock).await;
        let (url, written) = done?;
        Ok(SinkReport {
            rows: this.rows,
            batches: this.batches,
            bytes: written,
            location: Some(url),
        })
    }

    async fn abort(self: Box<Self>) {
        self.upload.abort().await;
        guard::release(self.lock).await;
    }
}
