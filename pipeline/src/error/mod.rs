//! The pipeline crate's error type: one enum, one variant per kind of failure, each carrying
//! where it happened (config file line:column, object URL, row group, stage) and what to do.

use std::fmt;

pub(crate) mod config;

pub use self::config::ConfigErrors;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Identifies a stage in error messages: its position in `stages:`, its type and where it is
/// declared in the YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRef {
    /// 0-based index in the `stages:` list.
    pub index: usize,
    /// The stage's `type`.
    pub kind: &'static str,
    /// `file:line:column` of the stage in its config file, when it came from one.
    pub location: Option<String>,
}

impl fmt::Display for StageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stages[{}] ({})", self.index, self.kind)?;
        if let Some(loc) = &self.location {
            write!(f, " at {loc}")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong in `sluice-pipeline`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline description is invalid; every problem found is listed.
    #[error("{0}")]
    Config(#[from] ConfigErrors),

    /// A checkpointed state does not fit this pipeline.
    #[error("cannot resume: {0}")]
    Resume(String),

    /// A config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ConfigFile {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A path or URL that Sluice cannot turn into an object store location.
    #[error("invalid location `{url}`: {reason}")]
    InvalidUrl { url: String, reason: String },

    /// A glob or path matched nothing.
    #[error(
        "no files match `{pattern}` (looked in {listed}); check the path{}",
        if pattern.contains("://") { "" } else { ", which is resolved relative to the config file" }
    )]
    NoMatch { pattern: String, listed: String },

    /// A path given on the command line (`sluice inspect`) matched nothing.
    #[error(
        "no files match `{pattern}` (looked in {listed}); check the path{}",
        if pattern.contains("://") { "" } else { ", which is resolved relative to the current directory" }
    )]
    NoMatchHere { pattern: String, listed: String },

    /// Listing, reading or writing an object failed.
    #[error("{url}: {operation} failed: {}", storage_message(url, source))]
    Storage {
        url: String,
        operation: &'static str,
        #[source]
        source: object_store::Error,
    },

    /// The source's configuration does not fit the data (unknown column, bad setting).
    #[error("source at {at}: {message}")]
    Source { at: String, message: String },

    /// Reading part of a file or object failed: the local file system's error, or the
    /// store's last answer once its retries were spent. The hint follows `kind`.
    #[error("{url}{}: {message}. {}", place(row_group, &None), read_hint(*kind, *in_inspect))]
    Read {
        url: String,
        row_group: Option<usize>,
        message: String,
        /// What failed: a local file (and how), or the object store (and how).
        kind: ReadKind,
        /// Raised by `sluice inspect` (no config file to point at).
        in_inspect: bool,
    },

    /// A file could not be decoded as Parquet (not Parquet, truncated, corrupt). `column` is
    /// the column whose pages did not decode, when that could be told.
    #[error(
        "{url}{}: cannot decode Parquet: {source}. {hint}{}",
        place(row_group, column),
        if *in_inspect { "" } else { "; `sluice inspect` shows what can be read" }
    )]
    Parquet {
        url: String,
        row_group: Option<usize>,
        column: Option<String>,
        hint: &'static str,
        /// Raised by `sluice inspect` itself (which is not then suggested).
        in_inspect: bool,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// An encrypted Parquet file (Parquet modular encryption: an encrypted footer, or
    /// encrypted columns under a plaintext footer).
    #[error(
        "{url}: encrypted Parquet (Parquet modular encryption) is not supported; decrypt it first"
    )]
    Encrypted { url: String },

    /// Files of one source disagree on their schema.
    #[error(
        "{url}: schema differs from {first_url}: {detail}. All files of a source must share one schema"
    )]
    SchemaMismatch {
        url: String,
        first_url: String,
        detail: String,
    },

    /// A stage's configuration does not fit the data it receives (unknown column, bad type).
    #[error("{stage}: {message}")]
    Stage { stage: StageRef, message: String },

    /// A stage failed on actual data (a cast that cannot convert a value, an out-of-range
    /// class). `rows` names the rows by their origin.
    #[error("{stage}: {message} (input rows: {rows})")]
    Data {
        stage: StageRef,
        message: String,
        rows: String,
    },

    /// An Arrow kernel failed where no more precise variant applies.
    #[error("{context}: {source}")]
    Arrow {
        context: String,
        #[source]
        source: arrow::error::ArrowError,
    },

    /// Kafka could not be reached or refused the request (unknown topic, authentication).
    #[error("kafka (brokers {brokers}): {message}")]
    Kafka { brokers: String, message: String },

    /// Records could not be decoded and no dead-letter sink took them, or the error budget
    /// is spent.
    #[error("{message}")]
    BadRecords { message: String },

    /// The run was cancelled (Ctrl-C, or the consumer went away).
    #[error("cancelled")]
    Cancelled,

    /// A bug in Sluice; please report it.
    #[error("internal error (this is a bug in Sluice, please report it): {0}")]
    Internal(String),
}

/// What failed when part of a file or object could not be read: chooses the hint of
/// [`Error::Read`] (never its text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// A local file; the file system's error kind.
    Local(std::io::ErrorKind),
    /// The object store: the object is not there (any more).
    StoreNotFound,
    /// The object store: the bucket is not there (any more), e.g. a store that came back from
    /// an outage without its data.
    StoreNoBucket,
    /// The object store refused access.
    StoreDenied,
    /// The object store kept failing (after its retries).
    Store,
}

impl ReadKind {
    /// The kind of a store's error: a local store's by the file system's error kind found in
    /// its causes, a remote one's by its S3-style `code` (see [`one_line`]) and the store's
    /// error variant.
    pub(crate) fn of_store(local: bool, e: &object_store::Error, code: Option<&str>) -> Self {
        if local {
            let kind = match e {
                object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
                _ => io_kind(e).unwrap_or(std::io::ErrorKind::Other),
            };
            return ReadKind::Local(kind);
        }
        // S3 answers a missing bucket with a 404 like a missing object; only the code in its
        // body tells them apart (and a store back from an outage without its data is not
        // "deleted while being read", nor unreachable).
        if code == Some("NoSuchBucket") {
            return ReadKind::StoreNoBucket;
        }
        match e {
            object_store::Error::NotFound { .. } => ReadKind::StoreNotFound,
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => ReadKind::StoreDenied,
            _ => ReadKind::Store,
        }
    }
}

/// The file system's error kind somewhere in `e`'s chain of causes.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        next = err.source();
    }
    None
}

/// What to do about a failed read, by what failed.
fn read_hint(kind: ReadKind, in_inspect: bool) -> &'static str {
    use std::io::ErrorKind;
    match kind {
        ReadKind::Local(ErrorKind::NotFound) => {
            "The local file was removed or renamed while it was being read"
        }
        ReadKind::Local(ErrorKind::PermissionDenied) => {
            "The local file cannot be read with this user's permissions: check them"
        }
        ReadKind::Local(ErrorKind::UnexpectedEof) => {
            "The local file is shorter than its footer says: it is truncated or corrupt, or it changed while being read"
        }
        ReadKind::Local(_) => "The local file could not be read: check the disk and the file",
        ReadKind::StoreNotFound => "The object was deleted or replaced while it was being read",
        ReadKind::StoreNoBucket => {
            "The bucket does not exist (any more): check the endpoint and region; a store that came back from an outage without its data must have it restored before the run is resumed"
        }
        ReadKind::StoreDenied => {
            "Access denied: check the credentials and this principal's permissions on the object"
        }
        ReadKind::Store if in_inspect => {
            "The object store kept failing past its retries; check that it is reachable"
        }
        ReadKind::Store => {
            "The object store kept failing past the retry budget (`storage.retry` of the source); check that it is reachable"
        }
    }
}

/// ` (row group 2, column `x`)`: where in a file an error is, when known.
fn place(row_group: &Option<usize>, column: &Option<String>) -> String {
    match (row_group, column) {
        (Some(rg), Some(c)) => format!(" (row group {rg}, column `{c}`)"),
        (Some(rg), None) => format!(" (row group {rg})"),
        (None, Some(c)) => format!(" (column `{c}`)"),
        (None, None) => String::new(),
    }
}

/// Whether an error's location is a local path (`file://` URL or a plain path) rather than
/// an object-store URL.
fn is_local(url: &str) -> bool {
    url.starts_with("file:") || !url.contains("://")
}

/// Hints of [`Error::Parquet`], chosen by what the file's bytes and the error's kind say.
pub(crate) mod hint {
    /// The file does not end with Parquet's marker.
    pub(crate) const NOT_PARQUET: &str = "The file is not Parquet or is truncated (incomplete upload or copy?): it does not end with Parquet's `PAR1` marker";
    /// Fewer bytes than the footer or a page header says there are.
    pub(crate) const TRUNCATED: &str =
        "The file is truncated or corrupt (incomplete upload or copy?)";
    /// The footer ends with Parquet's marker but does not decode.
    pub(crate) const CORRUPT_FOOTER: &str =
        "The file's footer (its schema and row-group index) is corrupt";
    /// Pages that do not decode.
    pub(crate) const CORRUPT: &str = "The file is corrupt (damaged after it was written, or written by a faulty writer); restore it from a good copy";
}

/// An object store's error on one line, with what to do: an S3-style XML error body is cut
/// down to its `Code` and `Message`, and common causes get a hint. A local path's error gets
/// a hint about the file system, never one about reachability or credentials.
fn storage_message(url: &str, e: &object_store::Error) -> String {
    let text = e.to_string();
    let (mut out, code) = one_line(&text);
    let hint = if is_local(url) {
        local_hint(e).to_string()
    } else {
        remote_hint(e, code.as_deref(), &text)
    };
    if !hint.is_empty() {
        out.push_str(". ");
        out.push_str(&hint);
    }
    out
}

/// A store's error text on one line, and its S3-style code: an XML error body is cut down
/// to its `Code` and `Message`.
pub(crate) fn one_line(text: &str) -> (String, Option<String>) {
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&format!("</{name}>"))?;
        Some(text[start..start + len].trim().to_string())
    };
    let (code, message) = (tag("Code"), tag("Message"));
    let mut out = match text.find("<?xml").or_else(|| text.find("<Error>")) {
        Some(i) => text[..i].trim_end().trim_end_matches(':').to_string(),
        None => text.to_string(),
    };
    if let Some(c) = &code {
        out.push_str(&format!(
            ": {c}{}",
            message.map(|m| format!(" ({m})")).unwrap_or_default()
        ));
    }
    (out.split_whitespace().collect::<Vec<_>>().join(" "), code)
}

/// What to do about a local file system's error, by its kind.
fn local_hint(e: &object_store::Error) -> &'static str {
    use std::io::ErrorKind;
    let kind = match e {
        object_store::Error::NotFound { .. } => Some(ErrorKind::NotFound),
        _ => io_kind(e),
    };
    match kind {
        Some(ErrorKind::NotFound) => "No such file or directory: check the path",
        Some(ErrorKind::PermissionDenied) => {
            "Permission denied: check the permissions of the path and its directories"
        }
        _ => "",
    }
}

/// The TLS client's complaint about the server's certificate somewhere in `e`'s causes
/// (`invalid peer certificate: UnknownIssuer`): the store's own message says only "error
/// sending request", as for a server that is down.
fn certificate_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = e.source();
    while let Some(err) = next {
        let text = err.to_string();
        if text.contains("invalid peer certificate") {
            return Some(text);
        }
        next = err.source();
    }
    None
}

/// What to do about a remote object store's error: by its code (S3-style) and kind.
fn remote_hint(e: &object_store::Error, code: Option<&str>, text: &str) -> String {
    if let Some(why) = certificate_error(e) {
        return if why.contains("UnknownIssuer") {
            format!(
                "The server's TLS certificate is not trusted ({why}): if a private CA signed it, name that CA's PEM file in `storage.options.ca_certificate`"
            )
        } else {
            format!(
                "The server's TLS certificate was refused ({why}): check the endpoint's name and the certificate's validity"
            )
        };
    }
    let credentials = "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_*, AZURE_* or `storage.options`) and this principal's permissions on the bucket";
    let unreachable = matches!(
        io_kind(e),
        Some(
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::NotConnected
                | std::io::ErrorKind::TimedOut
                | std::io::ErrorKind::HostUnreachable
                | std::io::ErrorKind::NetworkUnreachable
        )
    );
    match (e, code) {
        (_, Some("NoSuchBucket")) => {
            "The bucket does not exist: check its name, and the endpoint and region it lives in".to_string()
        }
        (
            _,
            Some(
                "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken"
                | "InvalidToken",
            ),
        )
        | (
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. },
            _,
        ) => format!("Access denied: {credentials}"),
        (object_store::Error::NotFound { .. }, _) | (_, Some("NoSuchKey")) => {
            "Check the bucket and path".to_string()
        }
        // The HTTP client's errors carry no I/O error when the request never got an answer.
        _ if unreachable
            || text.contains("error sending request")
            || text.contains("Connection refused") =>
        {
            "The object store could not be reached: check the endpoint (AWS_ENDPOINT_URL or `storage.options`), that it is up, and the network".to_string()
        }
        _ => String::new(),
    }
}

impl Error {
    /// A Parquet reader's error on `url`: a failed read becomes [`Error::Read`] (with a hint
    /// by what failed), anything else [`Error::Parquet`] with a hint by the error's kind and
    /// where it happened (the footer, `row_group: None`, or a row group's pages).
    pub(crate) fn parquet(
        url: &str,
        row_group: Option<usize>,
        source: parquet::errors::ParquetError,
    ) -> Self {
        use parquet::errors::ParquetError as P;
        if let P::External(inner) = &source
            && let Some(read) = inner.downcast_ref::<ReadError>()
        {
            return Error::Read {
                url: url.to_string(),
                row_group,
                message: read.to_string(),
                kind: read.kind(),
                in_inspect: false,
            };
        }
        let hint = match (&source, row_group) {
            (P::EOF(_) | P::NeedMoreData(_) | P::NeedMoreDataRange(_), _) => hint::TRUNCATED,
            (_, None) => hint::CORRUPT_FOOTER,
            (_, Some(_)) => hint::CORRUPT,
        };
        Error::parquet_with(url, row_group, hint, source)
    }

    /// [`Error::Parquet`] with the given hint.
    pub(crate) fn parquet_with(
        url: &str,
        row_group: Option<usize>,
        hint: &'static str,
        source: parquet::errors::ParquetError,
    ) -> Self {
        Error::Parquet {
            url: url.to_string(),
            row_group,
            column: None,
            hint,
            in_inspect: false,
            source,
        }
    }

    /// Names the column an [`Error::Parquet`] happened in (other errors are unchanged).
    pub(crate) fn in_column(mut self, name: Option<String>) -> Self {
        if let Error::Parquet { column, .. } = &mut self {
            *column = name;
        }
        self
    }

    /// This error as `sluice inspect` reports it: no suggestion to run `inspect`, and no
    /// mention of a config file (its paths come from the command line, relative to the
    /// current directory).
    pub(crate) fn in_inspect(mut self) -> Self {
        match &mut self {
            Error::Parquet { in_inspect, .. } | Error::Read { in_inspect, .. } => {
                *in_inspect = true;
            }
            Error::NoMatch { pattern, listed } => {
                return Error::NoMatchHere {
                    pattern: std::mem::take(pattern),
                    listed: std::mem::take(listed),
                };
            }
            _ => {}
        }
        self
    }
}

/// The message for a component this build left out: what needs which cargo feature, and how
/// to build with it.
pub fn feature_off(what: &str, feature: &str) -> String {
    format!(
        "{what} needs the `{feature}` cargo feature, which this build of Sluice leaves out; build with it: `cargo build --release --features {feature}` (the default features include it)"
    )
}

/// A read that failed, in the file system or the object store (as opposed to bytes that do
/// not decode).
#[derive(Debug, Clone)]
pub(crate) struct ReadError {
    pub(crate) message: String,
    pub(crate) kind: ReadKind,
}

impl ReadError {
    /// What failed.
    pub(crate) fn kind(&self) -> ReadKind {
        self.kind
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ReadError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(source: object_store::Error) -> String {
        Error::Storage {
            url: "s3://b/x".into(),
            operation: "list",
            source,
        }
        .to_string()
    }

    /// An S3 error body is cut to its code and message, on one line, with what to do.
    #[test]
    fn storage_errors_are_one_line_with_a_hint() {
        let xml = "Error performing list request: Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\" encoding=\"utf-8\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>b</BucketName><RequestId>X</RequestId></Error>";
        let e = storage(object_store::Error::Generic {
            store: "S3",
            source: xml.into(),
        });
        assert_eq!(
            e,
            "s3://b/x: list failed: Generic S3 error: Error performing list request: Server returned non-2xx status code: 404 Not Found: NoSuchBucket (The specified bucket does not exist). The bucket does not exist: check its name, and the endpoint and region it lives in"
        );
        let e = storage(object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 403 Forbidden: <Error><Code>InvalidAccessKeyId</Code></Error>".into(),
        });
        assert!(
            e.ends_with("403 Forbidden: InvalidAccessKeyId. Access denied: check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, GOOGLE_*, AZURE_* or `storage.options`) and this principal's permissions on the bucket"),
            "{e}"
        );
        let e = storage(object_store::Error::Generic {
            store: "S3",
            source: "Error performing HEAD http://127.0.0.1:1/b in 7s, after 10 retries - HTTP error: error sending request".into(),
        });
        assert!(
            e.ends_with("error sending request. The object store could not be reached: check the endpoint (AWS_ENDPOINT_URL or `storage.options`), that it is up, and the network"),
            "{e}"
        );
    }

    /// A local path's error is the file system's: no reachability or credentials hint,
    /// whatever the error's text says.
    #[test]
    fn local_storage_errors_get_file_system_hints() {
        let local = |source: object_store::Error| {
            Error::Storage {
                url: "file:///data/x.parquet".into(),
                operation: "stat",
                source,
            }
            .to_string()
        };
        let denied = std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "Connection refused (not really)",
        );
        let e = local(object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(denied),
        });
        assert!(
            e.ends_with("Permission denied: check the permissions of the path and its directories"),
            "{e}"
        );
        assert!(
            !e.contains("could not be reached") && !e.contains("credentials"),
            "{e}"
        );
    }

    /// A failed read is blamed on what failed: a local file's error never mentions the
    /// object store or its retry budget; `inspect` is never told about a config file.
    #[test]
    fn read_hints_follow_what_failed() {
        let read = |kind, in_inspect| {
            Error::Read {
                url: "file:///d/a.parquet".into(),
                row_group: Some(1),
                message: "reading bytes 4..100 failed".into(),
                kind,
                in_inspect,
            }
            .to_string()
        };
        for k in [
            std::io::ErrorKind::NotFound,
            std::io::ErrorKind::UnexpectedEof,
            std::io::ErrorKind::Other,
        ] {
            let e = read(ReadKind::Local(k), false);
            assert!(
                e.starts_with("file:///d/a.parquet (row group 1): reading bytes"),
                "{e}"
            );
            assert!(e.contains("The local file"), "{e}");
            assert!(!e.contains("object store") && !e.contains("retry"), "{e}");
        }
        assert!(
            read(ReadKind::Store, false).contains("retry budget (`storage.retry` of the source)")
        );
        let e = read(ReadKind::Store, true);
        assert!(
            e.contains("check that it is reachable") && !e.contains("storage.retry"),
            "{e}"
        );
    }

    /// Hints of undecodable files follow the error's kind and place; `inspect` is not told
    /// to run `inspect`, nor about a config file.
    #[test]
    fn parquet_hints_follow_the_kind_and_inspect_gets_its_own() {
        use parquet::errors::ParquetError as P;
        let e = Error::parquet(
            "file:///a",
            None,
            P::EOF("file size of 4 is less than footer".into()),
        );
        assert!(e.to_string().contains(hint::TRUNCATED), "{e}");
        let e = Error::parquet("file:///a", Some(2), P::General("bad page".into()))
            .in_column(Some("x".into()));
        let text = e.to_string();
        assert!(
            text.starts_with("file:///a (row group 2, column `x`): cannot decode Parquet"),
            "{text}"
        );
        assert!(
            text.contains(hint::CORRUPT)
                && text.ends_with("`sluice inspect` shows what can be read"),
            "{text}"
        );
        let text = e.in_inspect().to_string();
        assert!(!text.contains("sluice inspect"), "{text}");
        let e = Error::NoMatch {
            pattern: "x/*.parquet".into(),
            listed: "/w/x".into(),
        }
        .in_inspect()
        .to_string();
        assert!(
            e.contains("relative to the current directory") && !e.contains("config"),
            "{e}"
        );
    }
}
