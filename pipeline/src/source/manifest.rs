//! Manifests: a JSON list of the files of a dataset, so a source needs no listing (and, with
//! sizes, no HEAD request) before it starts reading.
//!
//! ```json
//! {"files": [{"path": "part-0.parquet", "size": 52311, "rows": 1000},
//!            {"path": "s3://other-bucket/x.parquet"}]}
//! ```
//! Relative paths resolve against the manifest's own location.

use std::path::Path;

use object_store::ObjectStoreExt;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::storage::{ListedObject, StorageConfig, resolve};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    files: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    path: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    rows: Option<u64>,
}

/// Expected row counts by URL, from the manifest (checked against the footers).
pub(crate) type ExpectedRows = Vec<(String, u64)>;

/// Reads the manifest at `spec` and resolves its entries, in manifest order.
pub(crate) async fn read(
    spec: &str,
    base_dir: &Path,
    storage: &StorageConfig,
) -> Result<(Vec<ListedObject>, ExpectedRows)> {
    let location = resolve(spec, base_dir, storage)?;
    let fetched = async { location.store.get(&location.path).await?.bytes().await };
    let bytes = fetched.await.map_err(|source| Error::Storage {
        url: location.url.to_string(),
        operation: "read manifest",
        source,
    })?;
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| Error::InvalidUrl {
        url: location.url.to_string(),
        reason: format!(
            "not a valid manifest ({e}); expected {{\"files\": [{{\"path\": …, \"size\": …, \"rows\": …}}]}}"
        ),
    })?;
    if manifest.files.is_empty() {
        return Err(Error::NoMatch {
            pattern: spec.to_string(),
            listed: "the manifest (it lists no files)".into(),
        });
    }
    // Entries resolve against the manifest's "directory".
    let url = location.url.to_string();
    let dir = &url[..url.rfind('/').map(|i| i + 1).unwrap_or(url.len())];
    let mut out = Vec::with_capacity(manifest.files.len());
    let mut rows = Vec::new();
    for e in manifest.files {
        let full = if e.path.contains("://") || e.path.starts_with('/') {
            e.path.clone()
        } else {
            format!("{dir}{}", e.path)
        };
        let full = full
            .strip_prefix("file://")
            .map(str::to_string)
            .unwrap_or(full);
        let loc = resolve(&full, base_dir, storage)?;
        let size = match e.size {
            Some(s) => s,
            None => {
                loc.store
                    .head(&loc.path)
                    .await
                    .map_err(|source| Error::Storage {
                        url: loc.url.to_string(),
                        operation: "stat",
                        source,
                    })?
                    .size
            }
        };
        if let Some(r) = e.rows {
            rows.push((loc.url.to_string(), r));
        }
        out.push(ListedObject {
            location: loc,
            size,
            entry: 0,
        });
    }
    Ok((out, rows))
}
