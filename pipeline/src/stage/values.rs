//! The stages that work on values, `filter`, `fill_null`, `standardize`, `one_hot` and
//! `clip`: their settings and their build steps against the input schema (their kernels are
//! in `kernels`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use super::{
    Build, BuiltStage, ColumnStats, StageKind, column_index, expr, kernels, literal_array,
    owned_fields,
};
use crate::error::{Error, Result};
use crate::types::Literal;

/// `type: filter`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    /// A SQL boolean expression over columns, e.g.
    /// `label < 5 AND (weight IS NULL OR weight > 0.5)`. Supported: comparisons, `AND`/`OR`/`NOT`, `IS [NOT] NULL`, `[NOT] IN (…)`,
    /// `[NOT] BETWEEN … AND …`, `+ - * / %`, parentheses, number/string/boolean literals.
    /// Rows where it is false or NULL are removed (and counted in the run summary).
    pub predicate: String,
}

/// `type: fill_null`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FillNullConfig {
    /// `column: value` pairs; the value is converted to the column's type.
    pub columns: BTreeMap<String, Literal>,
}

/// `type: standardize`. A NaN stays NaN and ±inf stays ±inf (`(x - mean) / std`), a null
/// stays null.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StandardizeConfig {
    /// Numeric columns (or lists of numbers, standardized element-wise with one mean/std per
    /// column). Output is float32 (float64 stays float64).
    pub columns: Vec<String>,
    /// Mean to subtract. When `mean` and `std` are both absent, each column's mean and
    /// standard deviation are computed in a first pass over the source (through the stages
    /// before this one) and reported in the run summary.
    #[serde(default)]
    pub mean: Option<f64>,
    /// Standard deviation to divide by; must be > 0. A computed std of 0 becomes 1.
    #[serde(default)]
    pub std: Option<f64>,
    /// What the first pass computing `mean` and `std` does with a NaN or ±inf value (nulls
    /// are always left out). Absent means [`NonFinite::Error`]; only allowed when the
    /// statistics are computed.
    #[serde(default)]
    pub non_finite: Option<NonFinite>,
}

// Written by hand so that `non_finite` appears only when set: the resume stamp hashes a
// stage's `Debug` text (`Pipeline::order_settings`, for stages before a `shuffle`), and the
// text of a config without the key must stay what it was before the key existed, or every
// checkpoint taken by an older Sluice would be refused. (The key moves no row anyway.)
impl fmt::Debug for StandardizeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("StandardizeConfig");
        d.field("columns", &self.columns)
            .field("mean", &self.mean)
            .field("std", &self.std);
        if let Some(n) = &self.non_finite {
            d.field("non_finite", n);
        }
        d.finish()
    }
}

/// What computing `standardize` statistics does with a NaN or ±inf value.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NonFinite {
    /// Stop the run at the first one, naming its row (file, row group, row) — the default:
    /// a single NaN would otherwise make the mean, and so every output value, NaN.
    #[default]
    Error,
    /// Leave it out of the mean and standard deviation, and report how many were left out
    /// (and where the first was) in the run summary. The value itself stays NaN or ±inf in
    /// the output.
    Skip,
}

/// `type: one_hot`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OneHotConfig {
    /// An integer column of class indices in `0..num_classes`.
    pub column: String,
    /// Number of classes (vector length).
    pub num_classes: usize,
    /// Name of the output column (a fixed-size list of float32). Default: replace `column`.
    #[serde(default)]
    pub output: Option<String>,
    /// Label smoothing ε in `[0, 1)`: the class gets `1 - ε + ε/num_classes`, every other
    /// entry `ε/num_classes`. Default: 0 (plain one-hot).
    #[serde(default)]
    pub smoothing: f64,
}

/// `type: clip`. As numpy's and torch's `clip`: NaN stays NaN, `-inf`/`+inf` become the
/// bounds, a null stays null.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClipConfig {
    /// Numeric columns (or lists of numbers, clipped element-wise).
    pub columns: Vec<String>,
    /// Lower bound (optional; a number, not NaN).
    #[serde(default)]
    pub min: Option<f64>,
    /// Upper bound (optional; a number, not NaN).
    #[serde(default)]
    pub max: Option<f64>,
}

impl StageKind for FilterConfig {
    fn keeps_columns(&self) -> bool {
        true
    }

    fn removes_rows(&self) -> bool {
        true
    }

    fn removed_as(&self) -> &'static str {
        "filtered out"
    }

    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let predicate = expr::compile(&self.predicate, b.input).map_err(|m| b.err(m))?;
        Ok((
            BuiltStage::Map(Arc::new(kernels::Filter {
                stage: b.stage.clone(),
                predicate,
            })),
            b.input.clone(),
        ))
    }
}

impl StageKind for FillNullConfig {
    fn keeps_columns(&self) -> bool {
        true
    }

    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let mut fills = Vec::new();
        let mut fields = owned_fields(b.input);
        for (name, value) in &self.columns {
            let i = column_index(b.stage, b.input, name)?;
            let ty = b.input.field(i).data_type();
            let scalar =
                literal_array(value, ty).map_err(|m| b.err(format!("column `{name}`: {m}")))?;
            fields[i] = fields[i].clone().with_nullable(false);
            fills.push((i, scalar));
        }
        let schema = Arc::new(Schema::new(fields));
        Ok((
            BuiltStage::Map(Arc::new(kernels::FillNull {
                stage: b.stage.clone(),
                fills,
                schema: schema.clone(),
            })),
            schema,
        ))
    }
}

impl StageKind for StandardizeConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let stage = b.stage;
        let mut cols = Vec::new();
        let mut fields = owned_fields(b.input);
        let given = match (self.mean, self.std) {
            (Some(m), Some(s)) => {
                if !(s > 0.0 && s.is_finite() && m.is_finite()) {
                    return Err(b.err(format!(
                        "`std` must be a positive number and `mean` finite (got mean {m}, std {s})"
                    )));
                }
                if self.non_finite.is_some() {
                    return Err(b.err(
                        "`non_finite` applies only to statistics computed from the data; with `mean` and `std` given there is nothing to compute (a NaN or ±inf value stays NaN or ±inf)"
                            .into(),
                    ));
                }
                Some(ColumnStats::given(m, s))
            }
            (None, None) => None,
            _ => {
                return Err(b.err(
                    "give both `mean` and `std`, or neither (then they are computed from the data)"
                        .into(),
                ));
            }
        };
        for name in &self.columns {
            let i = column_index(stage, b.input, name)?;
            let from = b.input.field(i).data_type();
            if !kernels::is_numeric_or_numeric_list(from) {
                return Err(b.err(format!(
                    "column `{name}` is {from}; standardize needs numbers or lists of numbers"
                )));
            }
            let out_elem = if kernels::leaf_type(from) == &DataType::Float64 {
                DataType::Float64
            } else {
                DataType::Float32
            };
            let to = kernels::elementwise_type(from, &out_elem);
            fields[i] = fields[i].clone().with_data_type(to.clone());
            let st = match &given {
                Some(g) => g.clone(),
                None => b
                    .stats
                    .as_ref()
                    .and_then(|s| s.iter().find(|(n, _)| n == name))
                    .map(|(_, s)| s.clone())
                    .ok_or_else(|| {
                        Error::Internal(format!(
                            "{stage}: statistics for `{name}` were not computed"
                        ))
                    })?,
            };
            cols.push((i, to, st));
        }
        let schema = Arc::new(Schema::new(fields));
        Ok((
            BuiltStage::Map(Arc::new(kernels::Standardize {
                stage: stage.clone(),
                columns: cols,
                schema: schema.clone(),
            })),
            schema,
        ))
    }
}

impl StageKind for OneHotConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let i = column_index(b.stage, b.input, &self.column)?;
        let from = b.input.field(i).data_type();
        if !from.is_integer() {
            return Err(b.err(format!(
                "column `{}` is {from}; one_hot needs integer class indices",
                self.column
            )));
        }
        if self.num_classes == 0 || self.num_classes > i32::MAX as usize {
            return Err(b.err("`num_classes` must be between 1 and 2^31-1".into()));
        }
        if !(0.0..1.0).contains(&self.smoothing) {
            return Err(b.err(format!(
                "`smoothing` must be in [0, 1), not {}",
                self.smoothing
            )));
        }
        let off = self.smoothing / self.num_classes as f64;
        let on_off = ((1.0 - self.smoothing + off) as f32, off as f32);
        let out_name = self.output.clone().unwrap_or_else(|| self.column.clone());
        let out_type = DataType::FixedSizeList(
            Arc::new(Field::new_list_field(DataType::Float32, false)),
            self.num_classes as i32,
        );
        let mut fields = owned_fields(b.input);
        let out_index = if out_name == self.column {
            fields[i] = Field::new(&out_name, out_type, false);
            i
        } else {
            if b.input.index_of(&out_name).is_ok() {
                return Err(b.err(format!("output column `{out_name}` already exists")));
            }
            fields.push(Field::new(&out_name, out_type, false));
            fields.len() - 1
        };
        let schema = Arc::new(Schema::new(fields));
        Ok((
            BuiltStage::Map(Arc::new(kernels::OneHot {
                stage: b.stage.clone(),
                input: i,
                output: out_index,
                num_classes: self.num_classes,
                on_off,
                schema: schema.clone(),
            })),
            schema,
        ))
    }
}

impl StageKind for ClipConfig {
    fn keeps_columns(&self) -> bool {
        true
    }

    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        if self.min.is_none() && self.max.is_none() {
            return Err(b.err("give `min`, `max` or both".into()));
        }
        for (key, v) in [("min", self.min), ("max", self.max)] {
            if v.is_some_and(f64::is_nan) {
                return Err(b.err(format!(
                    "`{key}` must be a number, not NaN (leave it out for no bound)"
                )));
            }
        }
        if let (Some(lo), Some(hi)) = (self.min, self.max)
            && lo > hi
        {
            return Err(b.err(format!("`min` ({lo}) is greater than `max` ({hi})")));
        }
        let mut cols = Vec::new();
        for name in &self.columns {
            let i = column_index(b.stage, b.input, name)?;
            let from = b.input.field(i).data_type();
            if !kernels::is_numeric_or_numeric_list(from) {
                return Err(b.err(format!(
                    "column `{name}` is {from}; clip needs numbers or lists of numbers"
                )));
            }
            let leaf = kernels::leaf_type(from);
            let bound = |v: Option<f64>| -> Result<Option<ArrayRef>> {
                v.map(|v| {
                    literal_array(&Literal::Float(v), leaf)
                        .map_err(|m| b.err(format!("column `{name}`: {m}")))
                })
                .transpose()
            };
            cols.push((i, bound(self.min)?, bound(self.max)?));
        }
        Ok((
            BuiltStage::Map(Arc::new(kernels::Clip {
                stage: b.stage.clone(),
                columns: cols,
                schema: b.input.clone(),
            })),
            b.input.clone(),
        ))
    }
}
