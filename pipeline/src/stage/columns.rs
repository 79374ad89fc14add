//! Building the stages that reshape columns, `select`, `rename` and `cast`, against their
//! input schema (their kernels are in `kernels`).

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};

use super::{Build, BuildStage, BuiltStage, column_index, kernels, owned_fields};
use crate::config::{CastConfig, RenameConfig, SelectConfig};
use crate::error::Result;

impl BuildStage for SelectConfig {
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

impl BuildStage for RenameConfig {
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

impl BuildStage for CastConfig {
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
