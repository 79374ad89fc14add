//! Turning the paths and URLs of a config into object-store locations, and listing globs.
//!
//! Everything goes through `object_store`, so local files, S3 (`s3://`), GCS (`gs://`), Azure
//! (`az://`, `abfs://`, `abfss://`) and HTTP(S) share one code path. Relative paths resolve
//! against the config file's directory. Credentials and endpoints come from the standard
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `GOOGLE_SERVICE_ACCOUNT`,
//! `AZURE_STORAGE_ACCOUNT_NAME`, …) and can be set per source/sink with `storage:`; values
//! there are never logged or shown in messages.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::types::Literal;

/// How to reach an object store: `object_store` options and the retry budget.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `object_store` options for the URL's scheme, e.g. `endpoint`, `region`,
    /// `access_key_id`, `secret_access_key`, `session_token`, `allow_http`,
    /// `virtual_hosted_style_request` (S3); `service_account`, `service_account_key` (GCS);
    /// `account_name`, `access_key`, `sas_key` (Azure). They override the environment.
    #[serde(default)]
    pub options: BTreeMap<String, Literal>,
    /// Retries of transient failures (5xx, connection resets, timeouts) with exponential
    /// backoff. Default: 10 retries within 180 s.
    #[serde(default)]
    pub retry: RetrySettings,
}

impl fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may be secrets: show only the keys.
        f.debug_struct("StorageConfig")
            .field("options", &self.options.keys().collect::<Vec<_>>())
            .field("retry", &self.retry)
            .finish()
    }
}

/// Retry budget for one request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Retries per request. Default: 10.
    #[serde(default = "default_max_retries")]
    pub max_retries: usize,
    /// Give up retrying a request after this many seconds. Default: 180.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: f64,
    /// First backoff in seconds, doubled after each failure (capped at 15 s). Default: 0.1.
    #[serde(default = "default_backoff_secs")]
    pub initial_backoff_secs: f64,
}

fn default_max_retries() -> usize {
    10
}
fn default_timeout_secs() -> f64 {
    180.0
}
fn default_backoff_secs() -> f64 {
    0.1
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            max_retries: default_max_retries(),
            timeout_secs: default_timeout_secs(),
            initial_backoff_secs: default_backoff_secs(),
        }
    }
}

/// One object: the store holding it, its path there and its URL for messages and lineage.
#[derive(Debug, Clone)]
pub struct ObjectLocation {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// Path within the store.
    pub path: ObjectPath,
    /// Full URL, e.g. `file:///data/a.parquet`, `s3://bucket/a.parquet`.
    pub url: Arc<str>,
}

/// A listed object and its size.
#[derive(Debug, Clone)]
pub struct ListedObject {
    /// Where it is.
    pub location: ObjectLocation,
    /// Size in bytes.
    pub size: u64,
    /// Which of the listed specs (`path` entries) named it, counting from 0 (a file named by
    /// two is listed once, under the first).
    pub entry: usize,
}

/// A parsed location: a local absolute path or a remote URL split into store root and path.
enum Parsed {
    Local(PathBuf),
    Remote {
        scheme: String,
        /// `scheme://authority` (bucket/container/host).
        root: String,
        /// Path inside the store, without leading `/` (may contain glob characters).
        path: String,
    },
}

const REMOTE_SCHEMES: &[&str] = &[
    "s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "adl", "http", "https",
];

fn parse(spec: &str, base_dir: &Path) -> Result<Parsed> {
    if let Some(rest) = spec.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(Error::InvalidUrl {
                url: spec.to_string(),
                reason: "a file:// URL needs an absolute path (file:///data/x.parquet)".into(),
            });
        }
        return Ok(Parsed::Local(normalize(Path::new(rest))));
    }
    if let Some((scheme, rest)) = spec.split_once("://") {
        let scheme = scheme.to_ascii_lowercase();
        if !REMOTE_SCHEMES.contains(&scheme.as_str()) {
            return Err(Error::InvalidUrl {
                url: spec.to_string(),
                reason: format!(
                    "unsupported scheme `{scheme}://`; use a local path, file://, s3://, gs://, az://, abfs(s)://, http(s)://"
                ),
            });
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(Error::InvalidUrl {
                url: spec.to_string(),
                reason: "missing bucket/container/host after the scheme".into(),
            });
        }
        return Ok(Parsed::Remote {
            root: format!("{scheme}://{authority}"),
            scheme,
            path: path.to_string(),
        });
    }
    let p = PathBuf::from(spec);
    let abs = if p.is_absolute() {
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
    };
    Ok(Parsed::Local(normalize(&abs)))
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

/// Local disk. Writes are durable when they return: the staged file is fsynced before it is
/// renamed into place, and so is its directory after. A checkpoint (and the Kafka offsets
/// committed because of it), a dead-letter file or an output file must survive a power loss,
/// not only a crash of the process.
fn local_store() -> Arc<dyn ObjectStore> {
    static STORE: OnceLock<Arc<dyn ObjectStore>> = OnceLock::new();
    STORE
        .get_or_init(|| Arc::new(LocalFileSystem::new().with_fsync(true)))
        .clone()
}

/// Stores are cached per (root, options) so connections are reused across files.
fn remote_store(scheme: &str, root: &str, storage: &StorageConfig) -> Result<Arc<dyn ObjectStore>> {
    type Cache = Mutex<Vec<((String, StorageConfig), Arc<dyn ObjectStore>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (root.to_string(), storage.clone());
    if let Ok(c) = cache.lock()
        && let Some((_, s)) = c.iter().find(|(k, _)| *k == key)
    {
        return Ok(s.clone());
    }
    let store = build_remote(scheme, root, storage)?;
    if let Ok(mut c) = cache.lock() {
        c.push((key, store.clone()));
    }
    Ok(store)
}

#[cfg_attr(
    not(any(feature = "s3", feature = "gcs", feature = "azure", feature = "http")),
    allow(dead_code)
)]
fn option_error(root: &str, key: &str, e: impl fmt::Display) -> Error {
    Error::InvalidUrl {
        url: root.to_string(),
        reason: format!("storage option `{key}`: {e}"),
    }
}

/// A store's settings: `storage.options` as strings.
type Options = Vec<(String, String)>;

fn build_remote(scheme: &str, root: &str, storage: &StorageConfig) -> Result<Arc<dyn ObjectStore>> {
    let retry = &storage.retry;
    let options: Options = storage
        .options
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Literal::Str(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect();
    match scheme {
        "s3" | "s3a" => remote::s3(root, retry, options),
        "gs" => remote::gcs(root, retry, options),
        "http" | "https" => remote::http(root, retry, options),
        _ => remote::azure(root, retry, options),
    }
}

mod remote;

/// The file a `file://` object is, as the local store names it: a `%` in a file name is
/// literal there (pyarrow writes Hive values URI-encoded, `lang=en%20US`), so the URL's
/// percent-decoding would name another file. `None` for other stores.
pub fn local_file(location: &ObjectLocation) -> Option<PathBuf> {
    if !location.url.starts_with("file:") {
        return None;
    }
    LocalFileSystem::new()
        .path_to_filesystem(&location.path)
        .ok()
}

fn local_location(abs: &Path, spec: &str) -> Result<ObjectLocation> {
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

fn remote_location(
    store: Arc<dyn ObjectStore>,
    root: &str,
    path: &str,
    spec: &str,
) -> Result<ObjectLocation> {
    let path = ObjectPath::parse(path.trim_matches('/')).map_err(|e| Error::InvalidUrl {
        url: spec.to_string(),
        reason: e.to_string(),
    })?;
    Ok(ObjectLocation {
        store,
        url: Arc::from(format!("{root}/{path}")),
        path,
    })
}

/// Resolves one location (no globs), e.g. an output file.
pub fn resolve(spec: &str, base_dir: &Path, storage: &StorageConfig) -> Result<ObjectLocation> {
    match parse(spec, base_dir)? {
        Parsed::Local(abs) => local_location(&abs, spec),
        Parsed::Remote { scheme, root, path } => {
            let store = remote_store(&scheme, &root, storage)?;
            remote_location(store, &root, &path, spec)
        }
    }
}

/// Resolves one output location (no globs) with default storage settings.
pub fn resolve_output(spec: &str, base_dir: &Path) -> Result<ObjectLocation> {
    resolve(spec, base_dir, &StorageConfig::default())
}

/// Whether the source spec `spec` (a path, URL, glob or prefix, as a `path:` entry takes it)
/// names the object at `url` — whether or not that object exists yet. A sink checks its
/// output against its source's specs with this before anything is read, so a run never
/// reads (or deletes) its own output. A prefix names the `.parquet` objects under it, as
/// listing does.
pub fn spec_names(spec: &str, base_dir: &Path, url: &str) -> Result<bool> {
    let (root, path) = match parse(spec, base_dir)? {
        Parsed::Local(abs) => (
            "file://".to_string(),
            abs.to_string_lossy().trim_start_matches('/').to_string(),
        ),
        Parsed::Remote { root, path, .. } => (root, path),
    };
    let Some(object) = url.strip_prefix(&root).and_then(|r| r.strip_prefix('/')) else {
        return Ok(false);
    };
    let object = object.trim_start_matches('/');
    if has_glob(&path) {
        let pattern = glob::Pattern::new(&path).map_err(|e| Error::InvalidUrl {
            url: spec.to_string(),
            reason: format!("invalid glob: {e}"),
        })?;
        let opts = glob::MatchOptions {
            require_literal_separator: true,
            ..Default::default()
        };
        return Ok(pattern.matches_with(object, opts));
    }
    let path = path.trim_matches('/');
    Ok(object == path
        || (object.ends_with(".parquet")
            && (path.is_empty() || object.starts_with(&format!("{path}/")))))
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Lists the objects named by `specs` (paths, URLs, globs, directories/prefixes): all of
/// [`stream_objects`], collected.
pub async fn list_objects(specs: &[String], base_dir: &Path) -> Result<Vec<ListedObject>> {
    use futures::TryStreamExt;
    stream_objects(
        specs.to_vec(),
        base_dir.to_path_buf(),
        StorageConfig::default(),
    )
    .try_collect()
    .await
}

/// A stream of listed objects.
pub type ObjectStream = futures::stream::BoxStream<'static, Result<ListedObject>>;

/// Like [`list_objects`], but yields objects while listing goes on, so reading can start
/// before a large prefix is fully listed. Order: specs in the given order; within a spec, by
/// key (object stores list in key order; local directories are sorted first). Duplicates
/// across specs are skipped. A spec that matches nothing is an error.
pub fn stream_objects(
    specs: Vec<String>,
    base_dir: PathBuf,
    storage: StorageConfig,
) -> ObjectStream {
    use futures::{StreamExt, TryStreamExt};
    let per_spec = futures::stream::iter(specs.into_iter().enumerate()).then(move |(i, spec)| {
        let (base_dir, storage) = (base_dir.clone(), storage.clone());
        async move {
            let listed = stream_spec(spec, &base_dir, &storage).await?;
            Ok::<_, Error>(
                listed
                    .map_ok(move |o| ListedObject { entry: i, ..o })
                    .boxed(),
            )
        }
    });
    let mut seen = std::collections::HashSet::new();
    per_spec
        .flat_map(|r| match r {
            Ok(s) => s,
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        })
        .filter(move |r| {
            let keep = match r {
                Ok(o) => seen.insert(o.location.url.clone()),
                Err(_) => true,
            };
            futures::future::ready(keep)
        })
        .boxed()
}

async fn stream_spec(
    spec: String,
    base_dir: &Path,
    storage: &StorageConfig,
) -> Result<ObjectStream> {
    use futures::StreamExt;
    // Object stores list in key order; local directories do not, so their (cheap) listings
    // are collected and sorted before streaming.
    let (store, root, path, display, lists_in_key_order) = match parse(&spec, base_dir)? {
        Parsed::Local(abs) => {
            let text = abs.to_string_lossy().trim_start_matches('/').to_string();
            let display = abs.display().to_string();
            (local_store(), "file://".to_string(), text, display, false)
        }
        Parsed::Remote { scheme, root, path } => {
            let store = remote_store(&scheme, &root, storage)?;
            (store, root, path, spec.clone(), true)
        }
    };
    let (prefix, pattern) = if has_glob(&path) {
        let first_glob = path.find(['*', '?', '[']).unwrap_or(path.len());
        let dir = path[..path[..first_glob].rfind('/').unwrap_or(0)].to_string();
        let pattern = glob::Pattern::new(&path).map_err(|e| Error::InvalidUrl {
            url: spec.clone(),
            reason: format!("invalid glob: {e}"),
        })?;
        (dir, Some(pattern))
    } else {
        let loc = remote_location(store.clone(), &root, &path, &spec)?;
        match loc.store.head(&loc.path).await {
            Ok(meta) => {
                let one = ListedObject {
                    size: meta.size,
                    location: loc,
                    entry: 0,
                };
                return Ok(futures::stream::iter([Ok(one)]).boxed());
            }
            // A plain HTTP server cannot list (that is WebDAV's PROPFIND, which it answers
            // 501 to, after retries): a missing URL matches nothing, said at once.
            Err(object_store::Error::NotFound { .. })
                if root.starts_with("http://") || root.starts_with("https://") =>
            {
                let none = futures::stream::empty().boxed();
                return Ok(error_if_empty(none, spec, display));
            }
            Err(object_store::Error::NotFound { .. }) => (path.clone(), None),
            Err(source) => {
                return Err(Error::Storage {
                    url: loc.url.to_string(),
                    operation: "stat",
                    source,
                });
            }
        }
    };
    let prefix_path =
        ObjectPath::parse(prefix.trim_matches('/')).map_err(|e| Error::InvalidUrl {
            url: spec.clone(),
            reason: e.to_string(),
        })?;
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    // A wildcard directory level (`train/*/part-*.parquet`, `date=2026-*/…`): list its
    // matching partitions with one delimited listing, then list up to 4 partitions at once,
    // in key order. Other patterns stream one listing, so reading starts with its first page.
    let partition_segment = pattern.as_ref().and_then(|_| {
        let rest = &path[prefix.len()..].trim_start_matches('/');
        let (segment, deeper) = rest.split_once('/')?;
        (has_glob(segment) && !segment.contains("**") && !deeper.is_empty())
            .then(|| glob::Pattern::new(segment).ok())
            .flatten()
    });
    let listing = match partition_segment {
        Some(segment) => partitioned_list(store.clone(), prefix_path.clone(), segment),
        None => store.list(Some(&prefix_path)),
    };
    let listing = if lists_in_key_order {
        listing
    } else {
        let mut all: Vec<ObjectMeta> = match listing.try_collect().await {
            Ok(all) => all,
            // A directory that does not exist matches nothing.
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(source) => {
                return Err(Error::Storage {
                    url: display,
                    operation: "list",
                    source,
                });
            }
        };
        all.sort_by(|a, b| a.location.cmp(&b.location));
        futures::stream::iter(all.into_iter().map(Ok)).boxed()
    };
    let items = matching_objects(listing, pattern, opts, &spec, store, root);
    Ok(error_if_empty(items, spec, display))
}

/// The objects of a listing that `pattern` matches (without one, the `.parquet` files), with
/// their locations; an error when the store did not list in key order.
fn matching_objects(
    listing: futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>>,
    pattern: Option<glob::Pattern>,
    opts: glob::MatchOptions,
    spec: &str,
    store: Arc<dyn ObjectStore>,
    root: String,
) -> ObjectStream {
    use futures::StreamExt;
    let (spec2, spec3) = (spec.to_string(), spec.to_string());
    let mut last: Option<ObjectPath> = None;
    let items = listing
        .map(move |r| (r, spec2.clone()))
        .filter_map(move |(r, spec)| {
            let out = match r {
                Err(source) => Some(Err(Error::Storage {
                    url: spec,
                    operation: "list",
                    source,
                })),
                Ok(meta) => {
                    let keep = match &pattern {
                        Some(p) => p.matches_with(meta.location.as_ref(), opts),
                        None => meta.location.as_ref().ends_with(".parquet"),
                    };
                    keep.then(|| Ok(meta))
                }
            };
            futures::future::ready(out)
        })
        .map(move |r| {
            let meta = r?;
            if last.as_ref().is_some_and(|l| l.as_ref() >= meta.location.as_ref()) {
                return Err(Error::Internal(format!(
                    "the store did not list `{spec3}` in key order; use a manifest for a fixed order"
                )));
            }
            last = Some(meta.location.clone());
            Ok(ListedObject {
                size: meta.size,
                entry: 0,
                location: ObjectLocation {
                    store: store.clone(),
                    url: Arc::from(format!("{root}/{}", meta.location)),
                    path: meta.location,
                },
            })
        });
    items.boxed()
}

/// Passes `inner` on up to its first error; a listing that matched nothing ends with
/// [`Error::NoMatch`].
fn error_if_empty(inner: ObjectStream, spec: String, display: String) -> ObjectStream {
    use futures::StreamExt;
    // An empty match is an error, reported when the listing ends.
    struct State {
        inner: ObjectStream,
        found: usize,
        done: bool,
        spec: String,
        display: String,
    }
    let state = State {
        inner,
        found: 0,
        done: false,
        spec,
        display,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        match st.inner.next().await {
            Some(item) => {
                match &item {
                    Ok(_) => st.found += 1,
                    Err(_) => st.done = true,
                }
                Some((item, st))
            }
            None => {
                st.done = true;
                (st.found == 0).then(|| {
                    let e = Error::NoMatch {
                        pattern: st.spec.clone(),
                        listed: st.display.clone(),
                    };
                    (Err(e), st)
                })
            }
        }
    })
    .boxed()
}

/// Lists the partitions (sub-prefixes) of `prefix` whose name matches `segment`, up to 4
/// concurrently, yielding their objects in key order.
fn partitioned_list(
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    segment: glob::Pattern,
) -> futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
    use futures::StreamExt;
    futures::stream::once(async move {
        let top = store.list_with_delimiter(Some(&prefix)).await;
        (store, top)
    })
    .map(move |(store, top)| match top {
        Err(e) => futures::stream::iter([Err(e)]).boxed(),
        Ok(listing) => {
            let mut parts: Vec<(String, ObjectPath)> = listing
                .common_prefixes
                .into_iter()
                .filter(|p| p.filename().is_some_and(|name| segment.matches(name)))
                .map(|p| (format!("{p}/"), p))
                .collect();
            // Key order of the objects inside: compare "name/" so `a-b/` sorts before `a/`.
            parts.sort_by(|a, b| a.0.cmp(&b.0));
            futures::stream::iter(parts)
                .map(move |(_, p)| {
                    let store = store.clone();
                    async move { store.list(Some(&p)).try_collect::<Vec<_>>().await }
                })
                .buffered(4)
                .flat_map(|r| match r {
                    Ok(v) => futures::stream::iter(v.into_iter().map(Ok)).boxed(),
                    Err(e) => futures::stream::iter([Err(e)]).boxed(),
                })
                .boxed()
        }
    })
    .flatten()
    .boxed()
}
