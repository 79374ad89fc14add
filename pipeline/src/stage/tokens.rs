//! The `mask_tokens` stage: seeded random token masking of integer sequences, as BERT and
//! Hugging Face's `DataCollatorForLanguageModeling`: each token but the special ones is
//! selected with probability `p` (one draw per token from the row's ChaCha8 stream); a
//! selected token is replaced by `mask_token` (fraction `mask_replace_prob`), by a random id
//! (`random_replace_prob`) or kept (those draws come from a second stream of the row, so the
//! selection does not depend on them); a boolean list column marks the selected positions and
//! an optional labels column holds their original ids (`ignore_index` elsewhere).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, GenericListArray, PrimitiveArray,
    RecordBatch,
};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, Int32Type, Int64Type, SchemaRef};
use chacha20::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use super::augment::{Chance, row_ids, words};
use super::{Build, BuiltStage, StageKind, Transform};
use crate::batch::Batch;
use crate::error::{Error, Result, StageRef};

/// `type: mask_tokens` — BERT-style masking of integer token sequences: each token (but the
/// special ones) is selected with probability `p`; a selected token is replaced by
/// `mask_token` (fraction `mask_replace_prob`), by a random id (`random_replace_prob`) or kept;
/// a boolean list column (`<column>_mask` by default) marks the selected positions, and
/// optionally a labels column holds the original ids there (Hugging Face's
/// `DataCollatorForLanguageModeling`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MaskTokensConfig {
    /// A `list<int*>` or `fixed_size_list<int*>` column.
    pub column: String,
    /// Selection probability, in `[0, 1)`.
    pub p: f64,
    /// The replacement token id.
    pub mask_token: i64,
    /// Of the selected tokens, the fraction replaced by `mask_token` (BERT: 0.8). Default: 1.
    #[serde(default = "one")]
    pub mask_replace_prob: f64,
    /// Of the selected tokens, the fraction replaced by an id drawn uniformly from
    /// `[0, vocab_size)` (BERT: 0.1); the rest keep their id. Default: 0.
    #[serde(default)]
    pub random_replace_prob: f64,
    /// Vocabulary size, needed by `random_replace_prob`.
    #[serde(default)]
    pub vocab_size: Option<u64>,
    /// Ids that are never selected (`[CLS]`, `[SEP]`, padding…). Default: none.
    #[serde(default)]
    pub special_tokens: Vec<i64>,
    /// Name of the mask column. Default: `<column>_mask`.
    #[serde(default)]
    pub mask_column: Option<String>,
    /// A labels column to add: the original id at selected positions, `ignore_index`
    /// elsewhere (same list type as `column`). Default: none.
    #[serde(default)]
    pub labels_column: Option<String>,
    /// The label of positions not selected. Default: -100 (PyTorch cross-entropy's
    /// `ignore_index`).
    #[serde(default = "minus_100")]
    pub ignore_index: i64,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

fn one() -> f64 {
    1.0
}

fn minus_100() -> i64 {
    -100
}

/// Rebuilds a list column like the input's (offsets, nulls) from new values and their field.
type Rebuild<'a> = Box<dyn Fn(ArrayRef, Arc<Field>) -> Result<ArrayRef> + 'a>;

#[derive(Debug)]
pub(crate) struct MaskTokens {
    stage: StageRef,
    input: usize,
    p: f64,
    token: i64,
    mask_replace: f64,
    random_replace: f64,
    vocab: u64,
    special: Vec<i64>,
    labels: bool,
    ignore_index: i64,
    key: [u8; 32],
    replace_key: [u8; 32],
    schema: SchemaRef,
}

pub(crate) fn build(
    stage: &StageRef,
    c: &MaskTokensConfig,
    input: &SchemaRef,
) -> Result<(MaskTokens, SchemaRef)> {
    let err = |message: String| Error::Stage {
        stage: stage.clone(),
        message,
    };
    if !(0.0..1.0).contains(&c.p) {
        return Err(err(format!("`p` must be in [0, 1), not {}", c.p)));
    }
    let (m, r) = (c.mask_replace_prob, c.random_replace_prob);
    if !(0.0..=1.0).contains(&m) || !(0.0..=1.0).contains(&r) || m + r > 1.0 {
        return Err(err(format!(
            "`mask_replace_prob` ({m}) and `random_replace_prob` ({r}) must each be in [0, 1] \
             and sum to at most 1 (the rest of the selected tokens are kept)"
        )));
    }
    let vocab = match c.vocab_size {
        Some(0) => return Err(err("`vocab_size` must be positive".into())),
        None if r > 0.0 => {
            return Err(err(
                "`random_replace_prob` needs `vocab_size` (random ids are drawn from [0, vocab_size))"
                    .into(),
            ));
        }
        v => v.unwrap_or(0),
    };
    let i = super::column_index(stage, input, &c.column)?;
    let t = input.field(i).data_type();
    let value = match t {
        DataType::List(f) | DataType::FixedSizeList(f, _) => f.data_type().clone(),
        _ => DataType::Null,
    };
    match value {
        DataType::Int32 | DataType::Int64 => {}
        _ => {
            return Err(err(format!(
                "column `{}` is {t}; mask_tokens needs a list or fixed_size_list of int32/int64",
                c.column
            )));
        }
    }
    if value == DataType::Int32 {
        let fits = |v: i64| i32::try_from(v).is_ok();
        for (what, v) in [
            ("`mask_token`", Some(c.mask_token)),
            (
                "`ignore_index`",
                c.labels_column.as_ref().map(|_| c.ignore_index),
            ),
            (
                "the largest random id (`vocab_size` - 1)",
                (r > 0.0).then(|| vocab as i64 - 1),
            ),
        ] {
            if let Some(v) = v.filter(|v| !fits(*v)) {
                return Err(err(format!(
                    "{what} {v} does not fit the column's int32 values"
                )));
            }
        }
    }
    if r > 0.0 && i64::try_from(vocab).is_err() {
        return Err(err(format!("`vocab_size` {vocab} is too large")));
    }
    let mask_name = c
        .mask_column
        .clone()
        .unwrap_or_else(|| format!("{}_mask", c.column));
    let mask_type = match t {
        DataType::FixedSizeList(_, n) => DataType::FixedSizeList(mask_field(), *n),
        _ => DataType::List(mask_field()),
    };
    let mut fields = crate::stage::owned_fields(input);
    let mut added = vec![(mask_name, mask_type)];
    if let Some(l) = &c.labels_column {
        // The labels are ids like the column's: the same list type.
        added.push((l.clone(), t.clone()));
    }
    for (name, dt) in added {
        if input.index_of(&name).is_ok() || fields.iter().any(|f| f.name() == &name) {
            return Err(err(format!("column `{name}` already exists")));
        }
        fields.push(Field::new(name, dt, input.field(i).is_nullable()));
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    let mut special = c.special_tokens.clone();
    special.sort_unstable();
    special.dedup();
    Ok((
        MaskTokens {
            stage: stage.clone(),
            input: i,
            p: c.p,
            token: c.mask_token,
            mask_replace: m,
            random_replace: r,
            vocab,
            special,
            labels: c.labels_column.is_some(),
            ignore_index: c.ignore_index,
            key: super::augment::column_key(c.seed, stage.index, &c.column),
            replace_key: super::augment::column_key(
                c.seed,
                stage.index,
                &format!("{}#replace", c.column),
            ),
            schema: schema.clone(),
        },
        schema,
    ))
}

/// `mask_tokens`: built by `build`, run on the CPU pool.
impl StageKind for MaskTokensConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let (built, schema) = build(b.stage, self, b.input)?;
        Ok((BuiltStage::Map(Arc::new(built)), schema))
    }
}

/// The element field of the mask column.
fn mask_field() -> Arc<Field> {
    Arc::new(Field::new_list_field(DataType::Boolean, false))
}

/// What one masking pass produces for a column's values.
struct Masked<T: ArrowPrimitiveType> {
    values: PrimitiveArray<T>,
    mask: BooleanArray,
    labels: Option<PrimitiveArray<T>>,
}

impl MaskTokens {
    /// Masks `values` where row `r` owns `values[ranges[r].0..ranges[r].1]`; `native` turns an
    /// id into a value (checked to fit at build time).
    fn mask_values<T: ArrowPrimitiveType>(
        &self,
        values: &PrimitiveArray<T>,
        ranges: &[(usize, usize)],
        ids: &[u64],
        native: impl Fn(i64) -> T::Native,
        id_of: impl Fn(T::Native) -> i64,
    ) -> Masked<T> {
        let mut out: Vec<T::Native> = values.values().to_vec();
        let mut mask = vec![false; out.len()];
        let ignore = native(self.ignore_index);
        let mut labels = self.labels.then(|| vec![ignore; out.len()]);
        let (token, mask_p, mask_or_random) = (
            native(self.token),
            self.mask_replace,
            self.mask_replace + self.random_replace,
        );
        let mut rng = ChaCha8Rng::from_seed(self.key);
        let mut replace = ChaCha8Rng::from_seed(self.replace_key);
        // Token k of a row is selected by word k of the row's stream (as `feature_dropout`
        // drops values), unless it is special.
        let select = Chance::new(self.p);
        let mut buf = Vec::new();
        for (r, (start, end)) in ranges.iter().enumerate() {
            rng.set_stream(ids[r]);
            replace.set_stream(ids[r]);
            for (k, w) in (*start..*end).zip(words(&mut rng, end - start, &mut buf)) {
                let original = out[k];
                if !select.hit(w) || self.special.binary_search(&id_of(original)).is_ok() {
                    continue;
                }
                mask[k] = true;
                if let Some(l) = labels.as_mut() {
                    l[k] = original;
                }
                // One draw per selected token, unless every one is masked.
                let u: f64 = if mask_p >= 1.0 { 0.0 } else { replace.random() };
                out[k] = if u < mask_p {
                    token
                } else if u < mask_or_random {
                    native(replace.random_range(0..self.vocab) as i64)
                } else {
                    original
                };
            }
        }
        Masked {
            values: PrimitiveArray::<T>::new(out.into(), values.nulls().cloned()),
            mask: BooleanArray::from(mask),
            labels: labels.map(|l| PrimitiveArray::<T>::new(l.into(), values.nulls().cloned())),
        }
    }
}

impl Transform for MaskTokens {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let col = batch.data.column(self.input).clone();
        let ids = row_ids(&batch.lineage);
        let arrow_err = |e| Error::Arrow {
            context: self.stage.to_string(),
            source: e,
        };
        // Work on the values this batch's rows own (lists may be slices of larger arrays).
        let (values, ranges, rebuild): (ArrayRef, Vec<(usize, usize)>, Rebuild<'_>) = match col
            .data_type()
        {
            DataType::List(_) => {
                let list: &GenericListArray<i32> = col.as_list::<i32>();
                let offsets = list.offsets().clone();
                let base = offsets[0] as usize;
                let len = offsets[offsets.len() - 1] as usize - base;
                let values = list.values().slice(base, len);
                let ranges = offsets
                    .windows(2)
                    .map(|w| (w[0] as usize - base, w[1] as usize - base))
                    .collect();
                let shifted = arrow::buffer::OffsetBuffer::new(
                    offsets
                        .iter()
                        .map(|o| o - base as i32)
                        .collect::<Vec<_>>()
                        .into(),
                );
                let nulls = list.nulls().cloned();
                (
                    values,
                    ranges,
                    Box::new(move |v, f| {
                        let a =
                            GenericListArray::<i32>::try_new(f, shifted.clone(), v, nulls.clone())
                                .map_err(arrow_err)?;
                        Ok(Arc::new(a) as ArrayRef)
                    }),
                )
            }
            DataType::FixedSizeList(_, n) => {
                let list = col.as_fixed_size_list();
                let n = *n as usize;
                let values = list.values().slice(list.offset() * n, list.len() * n);
                let ranges = (0..list.len()).map(|r| (r * n, (r + 1) * n)).collect();
                let nulls = list.nulls().cloned();
                (
                    values,
                    ranges,
                    Box::new(move |v, f| {
                        let a = FixedSizeListArray::try_new(f, n as i32, v, nulls.clone())
                            .map_err(arrow_err)?;
                        Ok(Arc::new(a) as ArrayRef)
                    }),
                )
            }
            other => {
                return Err(Error::Internal(format!(
                    "{}: unexpected {other}",
                    self.stage
                )));
            }
        };
        let (masked, mask, labels): (ArrayRef, BooleanArray, Option<ArrayRef>) =
            match values.data_type() {
                DataType::Int32 => {
                    let m = self.mask_values(
                        values.as_primitive::<Int32Type>(),
                        &ranges,
                        &ids,
                        |v| v as i32,
                        i64::from,
                    );
                    let labels = m.labels.map(|l| Arc::new(l) as ArrayRef);
                    (Arc::new(m.values), m.mask, labels)
                }
                _ => {
                    let m = self.mask_values(
                        values.as_primitive::<Int64Type>(),
                        &ranges,
                        &ids,
                        |v| v,
                        |v| v,
                    );
                    let labels = m.labels.map(|l| Arc::new(l) as ArrayRef);
                    (Arc::new(m.values), m.mask, labels)
                }
            };
        let item = match col.data_type() {
            DataType::List(f) | DataType::FixedSizeList(f, _) => f.clone(),
            other => {
                return Err(Error::Internal(format!(
                    "{}: unexpected {other}",
                    self.stage
                )));
            }
        };
        let mut columns = batch.data.columns().to_vec();
        columns[self.input] = rebuild(masked, item.clone())?;
        columns.push(rebuild(Arc::new(mask), mask_field())?);
        if let Some(l) = labels {
            columns.push(rebuild(l, item)?);
        }
        let data = RecordBatch::try_new(self.schema.clone(), columns).map_err(arrow_err)?;
        Ok(batch.with_data(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Lineage, Name, Origin};
    use arrow::array::ListArray;
    use rand::Rng;

    fn config(p: f64) -> MaskTokensConfig {
        MaskTokensConfig {
            column: "tok".into(),
            p,
            mask_token: 0,
            mask_replace_prob: 1.0,
            random_replace_prob: 0.0,
            vocab_size: None,
            special_tokens: vec![],
            mask_column: None,
            labels_column: None,
            ignore_index: -100,
            seed: 1,
        }
    }

    fn stage() -> StageRef {
        StageRef {
            index: 2,
            kind: "mask_tokens",
            location: None,
        }
    }

    /// 500 rows; row `r` holds the ids 1, 2, … r mod 17 + 1.
    fn sequences() -> Batch {
        let rows: Vec<Option<Vec<Option<i32>>>> = (0..500)
            .map(|r| Some((0..(r % 17 + 1)).map(|t| Some(t + 1)).collect()))
            .collect();
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(rows);
        let data = RecordBatch::try_from_iter([("tok", Arc::new(list) as ArrayRef)]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///t.parquet"),
            row_group: 0,
        };
        Batch::new(data, Lineage::new(origin, 0, 500, 0))
    }

    /// Column `c` of `b` as one vector of ids per row.
    fn ids_of(b: &Batch, c: usize) -> Vec<Vec<i32>> {
        let list = b.data.column(c).as_list::<i32>();
        (0..list.len())
            .map(|r| list.value(r).as_primitive::<Int32Type>().values().to_vec())
            .collect()
    }

    fn mask_of(b: &Batch, c: usize) -> Vec<Vec<bool>> {
        let list = b.data.column(c).as_list::<i32>();
        (0..list.len())
            .map(|r| {
                list.value(r)
                    .as_boolean()
                    .iter()
                    .map(|v| v == Some(true))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn masks_at_rate_p_with_a_matching_mask_column_and_is_batching_independent() {
        let batch = sequences();
        let (st, schema) = build(&stage(), &config(0.15), &batch.data.schema()).unwrap();
        assert_eq!(schema.field(1).name(), "tok_mask");
        let whole = st.apply(batch.clone()).unwrap();
        let tok = whole.data.column(0).as_list::<i32>();
        let mask = whole.data.column(1).as_list::<i32>();
        let (mut masked, mut total) = (0, 0);
        for r in 0..500 {
            let t = tok.value(r);
            let t = t.as_primitive::<Int32Type>();
            let m = mask.value(r);
            let m = m.as_boolean();
            for k in 0..t.len() {
                total += 1;
                if m.value(k) {
                    masked += 1;
                    assert_eq!(t.value(k), 0);
                } else {
                    assert_eq!(t.value(k), k as i32 + 1);
                }
            }
        }
        let rate = masked as f64 / total as f64;
        assert!((0.12..0.18).contains(&rate), "{rate}");
        // Token k of a row is selected exactly when word k of the row's stream is below
        // p · 2³².
        let ids = row_ids(&batch.lineage);
        let mut rng = ChaCha8Rng::from_seed(super::super::augment::column_key(1, 2, "tok"));
        for r in [0, 16, 499] {
            rng.set_stream(ids[r]);
            let m = mask.value(r);
            for k in 0..m.len() {
                let want = f64::from(rng.next_u32()) < 0.15 * 4_294_967_296.0;
                assert_eq!(m.as_boolean().value(k), want, "row {r} token {k}");
            }
        }
        // Same draws when the rows arrive in other batches (slices).
        let a = st.apply(batch.slice(0, 123)).unwrap();
        let b = st.apply(batch.slice(123, 377)).unwrap();
        assert_eq!(
            a.data.column(1).as_ref(),
            whole.data.column(1).slice(0, 123).as_ref()
        );
        assert_eq!(
            b.data.column(0).as_ref(),
            whole.data.column(0).slice(123, 377).as_ref()
        );
    }

    /// BERT's recipe: of the selected tokens 80 % masked, 10 % a random id, 10 % kept;
    /// `[CLS]` (id 1) never selected; labels hold the original ids where selected, -100
    /// elsewhere; the selection is the plain stage's, minus the special tokens.
    #[test]
    fn bert_replacements_special_tokens_and_labels() {
        let batch = sequences();
        let bert = MaskTokensConfig {
            mask_replace_prob: 0.8,
            random_replace_prob: 0.1,
            vocab_size: Some(1000),
            special_tokens: vec![1],
            labels_column: Some("labels".into()),
            ..config(0.5)
        };
        let (st, schema) = build(&stage(), &bert, &batch.data.schema()).unwrap();
        assert_eq!(schema.field(2).name(), "labels");
        assert_eq!(schema.field(2).data_type(), schema.field(0).data_type());
        let out = st.apply(batch.clone()).unwrap();
        let (tok, mask, labels) = (ids_of(&out, 0), mask_of(&out, 1), ids_of(&out, 2));
        let (plain, _) = build(&stage(), &config(0.5), &batch.data.schema()).unwrap();
        let plain_mask = mask_of(&plain.apply(batch.clone()).unwrap(), 1);
        let (mut masked, mut random, mut kept) = (0, 0, 0);
        let mut drawn = std::collections::HashSet::new();
        for r in 0..500 {
            for k in 0..tok[r].len() {
                let original = k as i32 + 1;
                assert_eq!(
                    mask[r][k],
                    plain_mask[r][k] && original != 1,
                    "row {r} token {k}"
                );
                if !mask[r][k] {
                    assert_eq!(
                        (tok[r][k], labels[r][k]),
                        (original, -100),
                        "row {r} token {k}"
                    );
                    continue;
                }
                assert_eq!(labels[r][k], original, "row {r} token {k}");
                match tok[r][k] {
                    0 => masked += 1,
                    v if v == original => kept += 1,
                    v => {
                        assert!((0..1000).contains(&v), "{v}");
                        drawn.insert(v);
                        random += 1;
                    }
                }
            }
        }
        let n = f64::from(masked + random + kept);
        assert!(n > 1500.0, "{n} selected");
        let share = |x: i32| f64::from(x) / n;
        assert!(
            (0.76..0.84).contains(&share(masked)),
            "masked {}",
            share(masked)
        );
        assert!(
            (0.07..0.13).contains(&share(random)),
            "random {}",
            share(random)
        );
        assert!((0.07..0.13).contains(&share(kept)), "kept {}", share(kept));
        assert!(drawn.len() > 100, "{} distinct random ids", drawn.len());
        // Same result when the rows arrive in other batches.
        let parts = [batch.slice(0, 200), batch.slice(200, 300)].map(|b| st.apply(b).unwrap());
        for c in [0, 2] {
            let joined: Vec<Vec<i32>> = parts.iter().flat_map(|p| ids_of(p, c)).collect();
            assert_eq!(joined, ids_of(&out, c), "column {c}");
        }
    }

    #[test]
    fn bad_replacement_settings_are_refused() {
        let schema = sequences().data.schema();
        let refusal = |c: MaskTokensConfig| build(&stage(), &c, &schema).unwrap_err().to_string();
        let e = refusal(MaskTokensConfig {
            mask_replace_prob: 0.8,
            random_replace_prob: 0.3,
            vocab_size: Some(10),
            ..config(0.1)
        });
        assert!(e.contains("sum to at most 1"), "{e}");
        let e = refusal(MaskTokensConfig {
            random_replace_prob: 0.1,
            mask_replace_prob: 0.8,
            ..config(0.1)
        });
        assert!(e.contains("needs `vocab_size`"), "{e}");
        let e = refusal(MaskTokensConfig {
            labels_column: Some("l".into()),
            ignore_index: i64::MAX,
            ..config(0.1)
        });
        assert!(e.contains("`ignore_index`") && e.contains("int32"), "{e}");
        let e = refusal(MaskTokensConfig {
            labels_column: Some("tok_mask".into()),
            ..config(0.1)
        });
        assert!(e.contains("`tok_mask` already exists"), "{e}");
    }
}
