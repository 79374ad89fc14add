//! `type: parquet`.

use async_trait::async_trait;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sluice_pipeline::{Batch, CpuPool};

use crate::config::{ParquetCompression, ParquetSinkConfig};
use crate::file::{SharedBuf, Upload};
use crate::{Error, Result, Sink, SinkContext, SinkReport};

pub(crate) struct ParquetSink {
    writer: Option<ArrowWriter<SharedBuf>>,
    buf: SharedBuf,
    upload: Upload,
    pool: CpuPool,
    rows: u64,
    batches: u64,
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
        let upload = Upload::start(&c.path, c.overwrite, &c.storage, cx).await?;
        let buf = SharedBuf::default();
        let writer =
            ArrowWriter::try_new(buf.clone(), cx.schema.clone(), Some(props)).map_err(|e| {
                Error::Encode {
                    url: upload.location.url.to_string(),
                    message: e.to_string(),
                }
            })?;
        Ok(ParquetSink {
            writer: Some(writer),
            buf,
            upload,
            pool: cx.pool.clone(),
            rows: 0,
            batches: 0,
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
impl Sink for ParquetSink {
    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let mut writer = self
            .writer
            .take()
            .ok_or_else(|| Error::Internal("parquet writer used after an error".into()))?;
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
        let Some(writer) = self.writer.take() else {
            self.upload.abort().await;
            return Err(Error::Internal("parquet writer used after an error".into()));
        };
        let closed = self.pool.run(move || writer.close().map(|_| ())).await;
        if let Err(e) = closed
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            let err = self.encode_err(e);
            self.upload.abort().await;
            return Err(err);
        }
        let bytes = self.buf.take();
        let this = *self;
        let mut upload = this.upload;
        if let Err(e) = upload.put(bytes).await {
            upload.abort().await;
            return Err(e);
        }
        let (url, written) = upload.complete().await?;
        Ok(SinkReport {
            rows: this.rows,
            batches: this.batches,
            bytes: written,
            location: Some(url),
        })
    }

    async fn abort(self: Box<Self>) {
        self.upload.abort().await;
    }
}
