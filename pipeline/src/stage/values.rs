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
    Build, BuiltStage, StageKind, column_index, expr, kernels, literal_array, owned_fields,
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
    /// Numeric columns, or lists of numbers (standardized element-wise: with one mean/std for
    /// every element, or one per element — see `per_element`). Output is float32 (float64
    /// stays float64).
    pub columns: Vec<String>,
    /// Mean to subtract: a number, or a list with one per element of `fixed_size_list`
    /// columns (scikit-learn's `StandardScaler.mean_`). When `mean` and `std` are both absent,
    /// they are computed in a first pass over the source (through the stages before this
    /// one) and reported in the run summary.
    #[serde(default)]
    pub mean: Option<NumberOrList>,
    /// Standard deviation to divide by (a number or a list, as `mean`); each must be > 0. A
    /// computed std of 0 becomes 1.
    #[serde(default)]
    pub std: Option<NumberOrList>,
    /// What the first pass computing `mean` and `std` does with a NaN or ±inf value (nulls
    /// are always left out). Absent means [`NonFinite::Error`]; only allowed when the
    /// statistics are computed.
    #[serde(default)]
    pub non_finite: Option<NonFinite>,
    /// Compute one mean and std per element of each `fixed_size_list` column (per feature,
    /// as `StandardScaler` does) instead of one over all its values. Only with computed
    /// statistics. Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_element: bool,
}

/// A number, or a list of numbers with one per list element (`standardize`'s `mean`/`std`,
/// `clip`'s `min`/`max`).
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(
    untagged,
    expecting = "a number, or a list of numbers with one per element of the list columns"
)]
pub enum NumberOrList {
    /// The same for every element.
    One(f64),
    /// One per element.
    Each(Vec<f64>),
}

impl NumberOrList {
    /// The values, one or one per element.
    pub fn values(&self) -> &[f64] {
        match self {
            NumberOrList::One(v) => std::slice::from_ref(v),
            NumberOrList::Each(v) => v,
        }
    }
}

// The resume stamp hashes a stage's `Debug` text: a number prints as the `f64` it was before
// lists were allowed, so the stamps of existing configs do not change.
impl fmt::Debug for NumberOrList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumberOrList::One(v) => v.fmt(f),
            NumberOrList::Each(v) => v.fmt(f),
        }
    }
}

// Written by hand so that `non_finite` and `per_element` appear only when set: the resume
// stamp hashes a stage's `Debug` text (`Pipeline::order_settings`, for stages before a
// `shuffle`), and the text of a config without the keys must stay what it was before the
// keys existed, or every checkpoint taken by an older Sluice would be refused. (`non_finite`
// moves no row anyway.)
impl fmt::Debug for StandardizeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("StandardizeConfig");
        d.field("columns", &self.columns)
            .field("mean", &self.mean)
            .field("std", &self.std);
        if let Some(n) = &self.non_finite {
            d.field("non_finite", n);
        }
        if self.per_element {
            d.field("per_element", &true);
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
    /// Lower bound (optional; a number, not NaN), or a list with one per element of
    /// `fixed_size_list` columns.
    #[serde(default)]
    pub min: Option<NumberOrList>,
    /// Upper bound (optional), as `min`.
    #[serde(default)]
    pub max: Option<NumberOrList>,
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
        let given = self.given(b)?;
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
            let (mean, std) = match &given {
                Some((m, s)) => (m.clone(), s.clone()),
                None => {
                    let computed = b
                        .stats
                        .as_ref()
                        .and_then(|s| s.iter().find(|(n, _)| n == name))
                        .map(|(_, s)| s)
                        .ok_or_else(|| {
                            Error::Internal(format!(
                                "{stage}: statistics for `{name}` were not computed"
                            ))
                        })?;
                    if computed.is_empty() {
                        // A placeholder (the list size was not known yet): checks only.
                        (vec![0.0], vec![1.0])
                    } else {
                        computed.iter().map(|s| (s.mean, s.std())).unzip()
                    }
                }
            };
            if mean.len() > 1 || std.len() > 1 || self.per_element {
                let width = per_element_width(from).ok_or_else(|| {
                    b.err(format!(
                        "column `{name}` is {from}: one mean/std per element needs a fixed_size_list of numbers (a variable-length list has no fixed element positions); give single numbers, or cast the column first"
                    ))
                })?;
                for (key, v) in [("mean", &mean), ("std", &std)] {
                    if v.len() > 1 && v.len() != width {
                        return Err(b.err(format!(
                            "`{key}` has {} values but column `{name}` has {width} elements per row: give one per element, or a single number",
                            v.len()
                        )));
                    }
                }
            }
            cols.push(kernels::StandardizeColumn {
                index: i,
                to,
                mean,
                std,
            });
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

impl StandardizeConfig {
    /// The given `mean` and `std` (each one value or one per element), checked; `None` when
    /// they are to be computed.
    fn given(&self, b: &Build<'_>) -> Result<Option<(Vec<f64>, Vec<f64>)>> {
        match (&self.mean, &self.std) {
            (Some(m), Some(s)) => {
                let (m, s) = (m.values(), s.values());
                if m.is_empty() || s.is_empty() {
                    return Err(b.err("`mean` and `std` must not be empty lists".into()));
                }
                if let Some((k, (mv, sv))) = m
                    .iter()
                    .cycle()
                    .zip(s.iter().cycle())
                    .take(m.len().max(s.len()))
                    .enumerate()
                    .find(|(_, (mv, sv))| !(**sv > 0.0 && sv.is_finite() && mv.is_finite()))
                {
                    let at = if m.len().max(s.len()) > 1 {
                        format!(" (element {k})")
                    } else {
                        String::new()
                    };
                    return Err(b.err(format!(
                        "`std` must be a positive number and `mean` finite (got mean {mv}, std {sv}{at})"
                    )));
                }
                if self.non_finite.is_some() || self.per_element {
                    let key = if self.per_element {
                        "per_element"
                    } else {
                        "non_finite"
                    };
                    return Err(b.err(format!(
                        "`{key}` applies only to statistics computed from the data; with `mean` and `std` given there is nothing to compute (give lists for one value per element)"
                    )));
                }
                Ok(Some((m.to_vec(), s.to_vec())))
            }
            (None, None) => Ok(None),
            _ => Err(b.err(
                "give both `mean` and `std`, or neither (then they are computed from the data)"
                    .into(),
            )),
        }
    }
}

/// The element count of a `fixed_size_list` of numbers (per-element statistics' width).
pub(crate) fn per_element_width(t: &DataType) -> Option<usize> {
    match t {
        DataType::FixedSizeList(f, n) if f.data_type().is_numeric() => Some(*n as usize),
        _ => None,
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
        let min = self.min.as_ref().map(NumberOrList::values);
        let max = self.max.as_ref().map(NumberOrList::values);
        for (key, v) in [("min", min), ("max", max)] {
            match v {
                Some([]) => return Err(b.err(format!("`{key}` must not be an empty list"))),
                Some(v) if v.iter().any(|x| x.is_nan()) => {
                    return Err(b.err(format!(
                        "`{key}` must be a number, not NaN (leave it out for no bound)"
                    )));
                }
                _ => {}
            }
        }
        if let (Some(lo), Some(hi)) = (min, max) {
            let n = lo.len().max(hi.len());
            let at = |v: &[f64], k: usize| if v.len() == 1 { v[0] } else { v[k % v.len()] };
            if let Some(k) = (0..n).find(|&k| at(lo, k) > at(hi, k)) {
                let which = if n > 1 {
                    format!(" at element {k}")
                } else {
                    String::new()
                };
                return Err(b.err(format!(
                    "`min` ({}) is greater than `max` ({}){which}",
                    at(lo, k),
                    at(hi, k)
                )));
            }
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
            let bound = |key: &str, v: Option<&[f64]>| -> Result<Option<ArrayRef>> {
                let Some(v) = v else { return Ok(None) };
                if v.len() > 1 {
                    match per_element_width(from) {
                        Some(w) if w == v.len() => {}
                        Some(w) => {
                            return Err(b.err(format!(
                                "`{key}` has {} values but column `{name}` has {w} elements per row: give one per element, or a single number",
                                v.len()
                            )));
                        }
                        None => {
                            return Err(b.err(format!(
                                "column `{name}` is {from}: one `{key}` per element needs a fixed_size_list of numbers; give a single number"
                            )));
                        }
                    }
                }
                let parts = v
                    .iter()
                    .map(|&x| literal_array(&Literal::Float(x), leaf))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|m| b.err(format!("column `{name}`: {m}")))?;
                let parts: Vec<&dyn arrow::array::Array> =
                    parts.iter().map(|a| a.as_ref()).collect();
                arrow::compute::concat(&parts)
                    .map(Some)
                    .map_err(|e| b.err(format!("column `{name}`: {e}")))
            };
            cols.push((i, bound("min", min)?, bound("max", max)?));
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
