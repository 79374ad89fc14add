//! Hive-style partition columns (`partitioning: hive`): the `key=value` directories of a
//! path, their values typed, and a file's partition column filled for a batch.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::types::DataTypeName;

/// The `key=value` directories of an object's path, in order (values percent-decoded, as
/// pyarrow and Hive write them URI-encoded; `__HIVE_DEFAULT_PARTITION__`, Hive's null, as
/// `None`).
pub(crate) fn hive_partitions(
    location: &crate::storage::ObjectLocation,
) -> std::result::Result<Vec<(String, Option<String>)>, String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    // The names as stored: the local store keeps a file name's `%` as it is in the path,
    // the others encode it (`%25`) there.
    let names: Vec<String> = match crate::storage::local_file(location) {
        Some(file) => file
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect(),
        None => location.path.parts().map(|p| decode(p.as_ref())).collect(),
    };
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for name in names.iter().take(names.len().saturating_sub(1)) {
        let Some((key, value)) = name.split_once('=') else {
            continue;
        };
        let key = decode(key);
        if key.is_empty() {
            continue;
        }
        if out.iter().any(|(k, _)| *k == key) {
            return Err(format!(
                "the partition key `{key}` appears twice in the path"
            ));
        }
        let value = decode(value);
        out.push((
            key,
            (value != "__HIVE_DEFAULT_PARTITION__").then_some(value),
        ));
    }
    Ok(out)
}

/// Each partition value as a one-row array of its column's type (`types`, else `utf8`); a
/// key in `types` that the path does not have, or a value not of its type, is an error.
pub(super) fn typed_partitions(
    partitions: &[(String, Option<String>)],
    types: &BTreeMap<String, DataTypeName>,
) -> std::result::Result<Vec<arrow::array::ArrayRef>, String> {
    if let Some(key) = types
        .keys()
        .find(|k| !partitions.iter().any(|(p, _)| p == *k))
    {
        let keys: Vec<&str> = partitions.iter().map(|(k, _)| k.as_str()).collect();
        return Err(format!(
            "`partition_types` names `{key}`, which is not a `key=…` directory of the path; the path has [{}]{}",
            keys.join(", "),
            crate::config::did_you_mean(key, keys.iter().copied())
        ));
    }
    partitions
        .iter()
        .map(|(key, value)| {
            let text: arrow::array::ArrayRef =
                Arc::new(arrow::array::StringArray::from(vec![value.as_deref()]));
            let Some(name) = types.get(key) else {
                return Ok(text);
            };
            let options = arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow::compute::cast_with_options(&text, name.data_type(), &options).map_err(|e| {
                format!(
                    "the partition directory `{key}={}` is not a `{name}` value (`partition_types`): {e}",
                    value.as_deref().unwrap_or_default()
                )
            })
        })
        .collect()
}

/// Every row of a file's partition column: `value` repeated, or nulls.
pub(super) fn partition_column(
    value: &arrow::array::ArrayRef,
    rows: usize,
) -> std::result::Result<arrow::array::ArrayRef, arrow::error::ArrowError> {
    use arrow::array::Array;
    if value.is_null(0) {
        return Ok(arrow::array::new_null_array(value.data_type(), rows));
    }
    if let Some(s) = value.as_any().downcast_ref::<arrow::array::StringArray>() {
        return Ok(Arc::new(arrow::array::StringArray::from_iter_values(
            std::iter::repeat_n(s.value(0), rows),
        )));
    }
    let zeros = arrow::array::UInt32Array::from(vec![0u32; rows]);
    arrow::compute::take(value.as_ref(), &zeros, None)
}
