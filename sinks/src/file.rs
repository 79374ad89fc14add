//! Shared machinery of the file sinks: encode on the CPU pool into an in-memory buffer, stream
//! the encoded bytes to an object-store multipart upload, complete or abort it.
//!
//! Atomicity comes from `object_store`: a multipart upload is invisible until `complete`
//! (on local disk, `LocalFileSystem` writes a staging file next to the target and renames it
//! into place; on S3 the object appears when the upload completes). `abort` deletes the staging
//! data.

use std::io::Write;
use std::sync::{Arc, Mutex};

use object_store::{ObjectStoreExt, WriteMultipart};
use sluice_pipeline::storage::{ObjectLocation, StorageConfig, resolve};

use crate::guard::OutputLock;
use crate::{Error, Result, SinkContext};

/// Bytes produced by an encoder, waiting to be uploaded.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl SharedBuf {
    pub(crate) fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned buffer"))?
            .extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An upload in progress.
pub(crate) struct Upload {
    pub(crate) location: ObjectLocation,
    writer: WriteMultipart,
    pub(crate) bytes: u64,
}

impl Upload {
    /// Starts an upload to `path` (checking `overwrite`). Refuses, before anything is
    /// written, a local path where something other than a regular file sits (a directory
    /// above all): the local store would leave its staging file beside it and then fail.
    pub(crate) async fn start(
        path: &str,
        overwrite: bool,
        storage: &StorageConfig,
        cx: &SinkContext,
    ) -> Result<Self> {
        let location = resolve(path, &cx.base_dir, storage)?;
        crate::guard::check_replaceable(&location)?;
        if !overwrite {
            match location.store.head(&location.path).await {
                Ok(_) => {
                    return Err(Error::Exists {
                        url: location.url.to_string(),
                    });
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => {
                    return Err(Error::Storage {
                        url: location.url.to_string(),
                        source,
                    });
                }
            }
        }
        let upload = location
            .store
            .put_multipart(&location.path)
            .await
            .map_err(|source| Error::Storage {
                url: location.url.to_string(),
                source,
            })?;
        Ok(Upload {
            writer: WriteMultipart::new_with_chunk_size(upload, 8 * 1024 * 1024),
            location,
            bytes: 0,
        })
    }

    /// Uploads `data` (bounded: waits while more than 4 parts are in flight).
    pub(crate) async fn put(&mut self, data: Vec<u8>) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.writer
            .wait_for_capacity(4)
            .await
            .map_err(|source| Error::Storage {
                url: self.location.url.to_string(),
                source,
            })?;
        self.bytes += data.len() as u64;
        self.writer.write(&data);
        Ok(())
    }

    /// Completes the upload: the object becomes visible — once every part is uploaded and
    /// `lock` is still held, checked last so that no claim lapses unnoticed in between; on
    /// failure nothing is left.
    pub(crate) async fn complete(mut self, lock: &Option<OutputLock>) -> Result<(String, u64)> {
        let url = self.location.url.to_string();
        let ready = match self.writer.wait_for_capacity(0).await {
            Ok(()) => crate::guard::ensure(lock).await,
            Err(source) => Err(Error::Storage {
                url: url.clone(),
                source,
            }),
        };
        if let Err(e) = ready {
            self.abort().await;
            return Err(e);
        }
        self.writer
            .finish()
            .await
            .map_err(|source| Error::Storage {
                url: url.clone(),
                source,
            })?;
        Ok((url, self.bytes))
    }

    /// Discards the upload.
    pub(crate) async fn abort(self) {
        let url = self.location.url.to_string();
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(%url, error = %e, "could not clean up an aborted upload");
        }
    }
}
