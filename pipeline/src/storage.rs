//! Turning the paths and URLs of a config into object-store locations, and listing globs.
//!
//! Everything goes through `object_store`, so local files and (later) S3/GCS/Azure share one
//! code path. Relative paths resolve against the config file's directory.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::error::{Error, Result};

/// One object: the store holding it, its path there and its URL for messages and lineage.
#[derive(Debug, Clone)]
pub struct ObjectLocation {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// Path within the store.
    pub path: ObjectPath,
    /// Full URL, e.g. `file:///data/a.parquet`.
    pub url: Arc<str>,
}

/// A listed object and its size.
#[derive(Debug, Clone)]
pub struct ListedObject {
    /// Where it is.
    pub location: ObjectLocation,
    /// Size in bytes.
    pub size: u64,
}

fn local_store() -> Arc<dyn ObjectStore> {
    static STORE: std::sync::OnceLock<Arc<dyn ObjectStore>> = std::sync::OnceLock::new();
    STORE
        .get_or_init(|| Arc::new(LocalFileSystem::new()))
        .clone()
}

/// Resolves `spec` (a path or `file://` URL) against `base_dir` to an absolute local path.
fn local_path(spec: &str, base_dir: &Path) -> Result<PathBuf> {
    let raw = if let Some(rest) = spec.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(Error::InvalidUrl {
                url: spec.to_string(),
                reason: "a file:// URL needs an absolute path (file:///data/x.parquet)".into(),
            });
        }
        PathBuf::from(rest)
    } else if let Some((scheme, _)) = spec.split_once("://") {
        return Err(Error::InvalidUrl {
            url: spec.to_string(),
            reason: format!(
                "the `{scheme}://` scheme is not supported by this build; use a local path or a file:// URL"
            ),
        });
    } else {
        let p = PathBuf::from(spec);
        if p.is_absolute() {
            p
        } else {
            let base = if base_dir.is_absolute() {
                base_dir.to_path_buf()
            } else {
                std::env::current_dir()
                    .map_err(|e| Error::InvalidUrl {
                        url: spec.to_string(),
                        reason: format!("cannot determine the current directory: {e}"),
                    })?
                    .join(base_dir)
            };
            base.join(p)
        }
    };
    Ok(normalize(&raw))
}

/// Removes `.` and `..` components without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn to_location(abs: &Path, spec: &str) -> Result<ObjectLocation> {
    let text = abs.to_str().ok_or_else(|| Error::InvalidUrl {
        url: spec.to_string(),
        reason: "path is not valid UTF-8".into(),
    })?;
    let path = ObjectPath::parse(text.trim_start_matches('/')).map_err(|e| Error::InvalidUrl {
        url: spec.to_string(),
        reason: e.to_string(),
    })?;
    Ok(ObjectLocation {
        store: local_store(),
        url: Arc::from(format!("file:///{path}")),
        path,
    })
}

/// Resolves one output location (no globs).
pub fn resolve_output(spec: &str, base_dir: &Path) -> Result<ObjectLocation> {
    let abs = local_path(spec, base_dir)?;
    to_location(&abs, spec)
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Lists the objects named by `specs` (paths, URLs, globs, directories), sorted by URL and
/// without duplicates. A spec that matches nothing is an error.
pub async fn list_objects(specs: &[String], base_dir: &Path) -> Result<Vec<ListedObject>> {
    let mut out: Vec<ListedObject> = Vec::new();
    for spec in specs {
        let abs = local_path(spec, base_dir)?;
        let text = abs.to_string_lossy().to_string();
        let found = if has_glob(&text) {
            list_glob(spec, &text).await?
        } else {
            let loc = to_location(&abs, spec)?;
            match loc.store.head(&loc.path).await {
                Ok(meta) => vec![ListedObject {
                    size: meta.size,
                    location: loc,
                }],
                Err(object_store::Error::NotFound { .. }) => {
                    // A directory: every *.parquet below it.
                    let listed = list_prefix(&loc, spec).await?;
                    listed
                        .into_iter()
                        .filter(|o| o.location.path.as_ref().ends_with(".parquet"))
                        .collect()
                }
                Err(source) => {
                    return Err(Error::Storage {
                        url: loc.url.to_string(),
                        operation: "stat",
                        source,
                    });
                }
            }
        };
        if found.is_empty() {
            return Err(Error::NoMatch {
                pattern: spec.clone(),
                listed: abs.display().to_string(),
            });
        }
        out.extend(found);
    }
    out.sort_by(|a, b| a.location.url.cmp(&b.location.url));
    out.dedup_by(|a, b| a.location.url == b.location.url);
    Ok(out)
}

async fn list_prefix(prefix: &ObjectLocation, spec: &str) -> Result<Vec<ListedObject>> {
    let metas: Vec<ObjectMeta> = match prefix.store.list(Some(&prefix.path)).try_collect().await {
        Ok(m) => m,
        Err(object_store::Error::NotFound { .. }) => Vec::new(),
        Err(source) => {
            return Err(Error::Storage {
                url: spec.to_string(),
                operation: "list",
                source,
            });
        }
    };
    Ok(metas
        .into_iter()
        .map(|m| ListedObject {
            size: m.size,
            location: ObjectLocation {
                store: prefix.store.clone(),
                url: Arc::from(format!("file:///{}", m.location)),
                path: m.location,
            },
        })
        .collect())
}

async fn list_glob(spec: &str, abs: &str) -> Result<Vec<ListedObject>> {
    let pattern = glob::Pattern::new(abs).map_err(|e| Error::InvalidUrl {
        url: spec.to_string(),
        reason: format!("invalid glob: {e}"),
    })?;
    // List below the longest directory prefix without glob characters.
    let first_glob = abs.find(['*', '?', '[']).unwrap_or(abs.len());
    let dir = &abs[..abs[..first_glob].rfind('/').unwrap_or(0)];
    let prefix = to_location(Path::new(if dir.is_empty() { "/" } else { dir }), spec)?;
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    Ok(list_prefix(&prefix, spec)
        .await?
        .into_iter()
        .filter(|o| pattern.matches_with(&format!("/{}", o.location.path), opts))
        .collect())
}
