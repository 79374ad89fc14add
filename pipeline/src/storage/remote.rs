//! One builder per object store, each behind its cargo feature (`s3`, `gcs`, `azure`,
//! `http`); a build without it refuses the scheme, naming the feature.

use std::sync::Arc;

use object_store::ObjectStore;

use super::{Options, RetrySettings};
use crate::error::{Error, Result};

/// A store that could not be configured (bad credentials setting, malformed URL).
#[allow(dead_code)] // unused when every remote store's feature is off
fn configured(
    root: &str,
    built: std::result::Result<Arc<dyn ObjectStore>, object_store::Error>,
) -> Result<Arc<dyn ObjectStore>> {
    built.map_err(|e| Error::InvalidUrl {
        url: root.to_string(),
        reason: format!("cannot configure the object store: {e}"),
    })
}

/// The refusal for a scheme whose store this build left out.
#[allow(dead_code)] // unused when every remote store's feature is on
fn left_out(root: &str, scheme: &str, feature: &str) -> Error {
    Error::InvalidUrl {
        url: root.to_string(),
        reason: crate::error::feature_off(&format!("`{scheme}` storage"), feature),
    }
}

#[cfg(feature = "s3")]
pub(super) fn s3(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let mut b = AmazonS3Builder::from_env()
        .with_url(root)
        .with_retry(retry.to_object_store());
    for (k, v) in options {
        let key: AmazonS3ConfigKey = k.parse().map_err(|e| super::option_error(root, &k, e))?;
        b = b.with_config(key, v);
    }
    configured(root, b.build().map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "s3"))]
pub(super) fn s3(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "s3://", "s3"))
}

#[cfg(feature = "gcs")]
pub(super) fn gcs(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    let mut b = GoogleCloudStorageBuilder::from_env()
        .with_url(root)
        .with_retry(retry.to_object_store());
    for (k, v) in options {
        let key: GoogleConfigKey = k.parse().map_err(|e| super::option_error(root, &k, e))?;
        b = b.with_config(key, v);
    }
    configured(root, b.build().map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "gcs"))]
pub(super) fn gcs(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "gs://", "gcs"))
}

#[cfg(feature = "http")]
pub(super) fn http(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    if let Some((k, _)) = options.into_iter().next() {
        return Err(super::option_error(
            root,
            &k,
            "http(s) stores take no options",
        ));
    }
    // An `http://` URL is the user's choice of plain HTTP: the client refuses it otherwise
    // (every `http://` read failed with "builder error" before the suite had an HTTP server).
    let plain = root.starts_with("http://");
    let built = object_store::http::HttpBuilder::new()
        .with_url(root)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(plain))
        .with_retry(retry.to_object_store())
        .build();
    configured(root, built.map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "http"))]
pub(super) fn http(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "http(s)://", "http"))
}

#[cfg(feature = "azure")]
pub(super) fn azure(
    root: &str,
    retry: &RetrySettings,
    options: Options,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
    let mut b = MicrosoftAzureBuilder::from_env()
        .with_url(root)
        .with_retry(retry.to_object_store());
    for (k, v) in options {
        let key: AzureConfigKey = k.parse().map_err(|e| super::option_error(root, &k, e))?;
        b = b.with_config(key, v);
    }
    configured(root, b.build().map(|s| Arc::new(s) as _))
}

#[cfg(not(feature = "azure"))]
pub(super) fn azure(root: &str, _: &RetrySettings, _: Options) -> Result<Arc<dyn ObjectStore>> {
    Err(left_out(root, "az:// / abfs(s)://", "azure"))
}

#[cfg(any(feature = "s3", feature = "gcs", feature = "azure", feature = "http"))]
impl RetrySettings {
    /// As `object_store`'s remote stores take it (it has no retry settings without one).
    fn to_object_store(&self) -> object_store::RetryConfig {
        use std::time::Duration;
        object_store::RetryConfig {
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_secs_f64(self.initial_backoff_secs.max(0.001)),
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: Duration::from_secs_f64(self.timeout_secs.max(0.0)),
        }
    }
}
