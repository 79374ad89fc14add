//! The stages that reshape columns, `select`, `rename` and `cast`: their settings and their
//! build steps against the input schema (their kernels are in `kernels`).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use super::{Build, BuiltStage, StageKind, column_index, kernels, owned_fields};
use crate::error::Result;
use crate::types::DataTypeName;

/// `type: select`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SelectConfig {
    /// Columns to keep, in output order.
    pub columns: Vec<String>,
}

/// `type: rename`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RenameConfig {
    /// `old_name: new_name` pairs.
    pub columns: BTreeMap<String, String>,
}

/// `type: cast`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CastConfig {
    /// `column: type` pairs. Types: `bool`, `int8`…`int64`, `uint8`…`uint64`, `float16`,
    /// `float32`, `float64`, `string`, `large_string`, `binary`, `date32`, `timestamp_ms`,
    /// `timestamp_us`. For a list column a scalar type applies to its elements. A value that
    /// cannot be converted stops the run with the column, value and row named.
    pub columns: BTreeMap<String, DataTypeName>,
}

impl StageKind for SelectConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let mut indices = Vec::with_capacity(self.columns.len());
        for name in &self.columns {
            let i = column_index(b.stage, b.input, name)?;
            if indices.contains(&i) {
                return Err(b.err(format!("column `{name}` is selected twice")));
            }
            indices.push(i);
        }
        let schema = Arc::new(
            b.input
                .project(&indices)
                .map_err(|e| b.err(e.to_string()))?,
        );
        Ok((
            BuiltStage::Map(Arc::new(kernels::Select {
                indices,
                schema: schema.clone(),
            })),
            schema,
        ))
    }
}

impl StageKind for RenameConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let mut fields = owned_fields(b.input);
        for (old, new) in &self.columns {
            let i = column_index(b.stage, b.input, old)?;
            fields[i] = fields[i].clone().with_name(new);
        }
        let mut seen = std::collections::HashSet::new();
        for f in &fields {
            if !seen.insert(f.name().clone()) {
                return Err(b.err(format!(
                    "renaming would create two columns named `{}`",
                    f.name()
                )));
            }
        }
        let schema = Arc::new(Schema::new(fields));
        Ok((
            BuiltStage::Map(Arc::new(kernels::Replace::rename(
                b.stage.clone(),
                schema.clone(),
            ))),
            schema,
        ))
    }
}

impl StageKind for CastConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let mut targets = Vec::new();
        let mut fields = owned_fields(b.input);
        for (name, ty) in &self.columns {
            let i = column_index(b.stage, b.input, name)?;
            let from = b.input.field(i).data_type();
            let to = kernels::elementwise_type(from, ty.data_type());
            if !arrow::compute::can_cast_types(from, &to) {
                return Err(b.err(format!("column `{name}`: cannot cast {from} to {ty}")));
            }
            fields[i] = fields[i].clone().with_data_type(to.clone());
            targets.push((i, to));
        }
        let schema = Arc::new(Schema::new(fields));
        Ok((
            BuiltStage::Map(Arc::new(kernels::Cast {
                stage: b.stage.clone(),
                targets,
                schema: schema.clone(),
            })),
            schema,
        ))
    }
}
