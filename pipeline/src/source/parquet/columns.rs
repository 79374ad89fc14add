//! The columns a file gives: which of its roots are read, where each output column comes
//! from, the output schema, and how two files' schemas differ.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, SchemaRef};

use crate::error::Result;
use crate::types::DataTypeName;

/// Where an output column of a file comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// A decoded root column (its position among the roots read, which are in file order).
    File(usize),
    /// A partition value (index into [`ParquetFile::partitions`](super::ParquetFile::partitions)).
    Partition(usize),
}

/// Computes the root columns to read (file order), where each output column comes from (in
/// the requested order; default: the file's columns, then the partition keys), and the
/// output schema (partition columns are nullable, of their `partition_types` or `utf8`), without the file's schema
/// metadata, so files written by different tools compare equal.
pub(super) fn project(
    file_schema: &Schema,
    columns: Option<&[String]>,
    partitions: &[(String, Option<String>)],
    types: &BTreeMap<String, DataTypeName>,
) -> Result<(Vec<usize>, Vec<Slot>, SchemaRef), String> {
    if let Some((key, _)) = partitions
        .iter()
        .find(|(k, _)| file_schema.index_of(k).is_ok())
    {
        return Err(format!(
            "column `{key}` is both in the file and a partition directory (`{key}=…`) of its path; rename one, or read without `partitioning: hive`"
        ));
    }
    let all: Vec<String>;
    let names: &[String] = match columns {
        Some(c) => c,
        None => {
            all = file_schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .chain(partitions.iter().map(|(k, _)| k.clone()))
                .collect();
            &all
        }
    };
    enum Wanted {
        File(usize),
        Partition(usize),
    }
    let mut wanted = Vec::with_capacity(names.len());
    for (j, name) in names.iter().enumerate() {
        if names[..j].contains(name) {
            return Err(format!("column `{name}` is listed twice in `columns`"));
        }
        if let Ok(i) = file_schema.index_of(name) {
            wanted.push(Wanted::File(i));
        } else if let Some(k) = partitions.iter().position(|(key, _)| key == name) {
            wanted.push(Wanted::Partition(k));
        } else {
            let mut available = crate::stage::column_names(file_schema);
            available.extend(partitions.iter().map(|(k, _)| k.as_str()));
            return Err(crate::stage::no_such_column(name, &available, ""));
        }
    }
    let mut roots: Vec<usize> = wanted
        .iter()
        .filter_map(|w| match w {
            Wanted::File(i) => Some(*i),
            Wanted::Partition(_) => None,
        })
        .collect();
    roots.sort_unstable();
    // Decoded batches hold the roots in file order; position of each wanted root there:
    let slots = wanted
        .iter()
        .map(|w| match w {
            Wanted::File(i) => Slot::File(roots.iter().position(|r| r == i).unwrap_or(0)),
            Wanted::Partition(k) => Slot::Partition(*k),
        })
        .collect();
    let fields: Vec<arrow::datatypes::FieldRef> = wanted
        .iter()
        .map(|w| match w {
            Wanted::File(i) => Arc::new(file_schema.field(*i).clone()),
            Wanted::Partition(k) => Arc::new(arrow::datatypes::Field::new(
                &partitions[*k].0,
                types
                    .get(&partitions[*k].0)
                    .map_or(DataType::Utf8, |t| t.data_type().clone()),
                true,
            )),
        })
        .collect();
    Ok((roots, slots, Arc::new(Schema::new(fields))))
}

pub(super) fn schema_difference(a: &Schema, b: &Schema) -> Option<String> {
    if a.fields().len() != b.fields().len() {
        return Some(format!(
            "{} columns instead of {}",
            b.fields().len(),
            a.fields().len()
        ));
    }
    for (fa, fb) in a.fields().iter().zip(b.fields()) {
        if fa.name() != fb.name() {
            return Some(format!(
                "column `{}` where `{}` was expected",
                fb.name(),
                fa.name()
            ));
        }
        if !fa.data_type().equals_datatype(fb.data_type()) {
            return Some(format!(
                "column `{}` is {} instead of {}",
                fa.name(),
                fb.data_type(),
                fa.data_type()
            ));
        }
    }
    None
}
