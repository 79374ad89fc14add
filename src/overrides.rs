//! `--set PATH=VALUE`: settings of a config file changed for one command, applied by
//! `ConfigDocument::with_overrides` (the same the Python package's `overrides=` uses).

/// `PATH=VALUE` → the pair (the value is everything after the first `=`).
pub(crate) fn parse_override(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((path, value)) if !path.trim().is_empty() => {
            Ok((path.trim().to_string(), value.to_string()))
        }
        _ => Err(format!(
            "`{s}` is not PATH=VALUE: write e.g. --set trainer.optimizer.lr=0.03"
        )),
    }
}

/// The config file at `path` with the `--set` overrides applied.
pub(crate) fn config_document(
    path: &std::path::Path,
    overrides: &[(String, String)],
) -> Result<sluice::pipeline::ConfigDocument, sluice::pipeline::Error> {
    sluice::pipeline::ConfigDocument::from_path(path)?.with_overrides(overrides)
}
