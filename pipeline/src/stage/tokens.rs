//! The `mask_tokens` stage: seeded random token masking of integer sequences (BERT-style):
//! each token is selected with probability `p` (one draw per token from the row's ChaCha8
//! stream) and replaced by `mask_token`; a boolean list column marks the selected positions.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, GenericListArray, PrimitiveArray,
    RecordBatch,
};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, Int32Type, Int64Type, SchemaRef};
use chacha20::ChaCha8Rng;
use rand::SeedableRng;

use super::Transform;
use super::augment::{Chance, row_ids, words};
use crate::batch::Batch;
use crate::config::MaskTokensConfig;
use crate::error::{Error, Result, StageRef};

/// Rebuilds the list column and its mask from new values and the mask values.
type Rebuild<'a> = Box<dyn Fn(ArrayRef, ArrayRef) -> Result<(ArrayRef, ArrayRef)> + 'a>;

#[derive(Debug)]
pub(crate) struct MaskTokens {
    stage: StageRef,
    input: usize,
    p: f64,
    token: i64,
    key: [u8; 32],
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
    let i = super::column_index(stage, input, &c.column)?;
    let t = input.field(i).data_type();
    let (value, mask_type) = match t {
        DataType::List(f) => (
            f.data_type().clone(),
            DataType::List(Arc::new(Field::new_list_field(DataType::Boolean, false))),
        ),
        DataType::FixedSizeList(f, n) => (
            f.data_type().clone(),
            DataType::FixedSizeList(
                Arc::new(Field::new_list_field(DataType::Boolean, false)),
                *n,
            ),
        ),
        _ => (DataType::Null, DataType::Null),
    };
    match value {
        DataType::Int32 if i32::try_from(c.mask_token).is_err() => {
            return Err(err(format!(
                "`mask_token` {} does not fit the column's int32 values",
                c.mask_token
            )));
        }
        DataType::Int32 | DataType::Int64 => {}
        _ => {
            return Err(err(format!(
                "column `{}` is {t}; mask_tokens needs a list or fixed_size_list of int32/int64",
                c.column
            )));
        }
    }
    let mask_name = c
        .mask_column
        .clone()
        .unwrap_or_else(|| format!("{}_mask", c.column));
    if input.index_of(&mask_name).is_ok() {
        return Err(err(format!("mask column `{mask_name}` already exists")));
    }
    let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(
        mask_name,
        mask_type,
        input.field(i).is_nullable(),
    ));
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    Ok((
        MaskTokens {
            stage: stage.clone(),
            input: i,
            p: c.p,
            token: c.mask_token,
            key: super::augment::column_key(c.seed, stage.index, &c.column),
            schema: schema.clone(),
        },
        schema,
    ))
}

/// Masks `values` where row `r` owns `values[offsets[r]..offsets[r+1]]`.
fn mask_values<T: ArrowPrimitiveType>(
    values: &PrimitiveArray<T>,
    ranges: &[(usize, usize)],
    ids: &[u64],
    key: [u8; 32],
    p: f64,
    token: T::Native,
) -> (PrimitiveArray<T>, BooleanArray) {
    let mut out: Vec<T::Native> = values.values().to_vec();
    let mut mask = vec![false; out.len()];
    let mut rng = ChaCha8Rng::from_seed(key);
    // Token k of a row is selected by word k of the row's stream (as `feature_dropout` drops
    // values).
    let select = Chance::new(p);
    let mut buf = Vec::new();
    for (r, (start, end)) in ranges.iter().enumerate() {
        rng.set_stream(ids[r]);
        for ((o, m), w) in out[*start..*end]
            .iter_mut()
            .zip(&mut mask[*start..*end])
            .zip(words(&mut rng, end - start, &mut buf))
        {
            *m = select.hit(w);
            *o = if *m { token } else { *o };
        }
    }
    (
        PrimitiveArray::<T>::new(out.into(), values.nulls().cloned()),
        BooleanArray::from(mask),
    )
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
            DataType::List(f) => {
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
                let f = f.clone();
                (
                    values,
                    ranges,
                    Box::new(move |v, m| {
                        let a = GenericListArray::<i32>::try_new(
                            f.clone(),
                            shifted.clone(),
                            v,
                            nulls.clone(),
                        )
                        .map_err(arrow_err)?;
                        let mf = Arc::new(Field::new_list_field(DataType::Boolean, false));
                        let b =
                            GenericListArray::<i32>::try_new(mf, shifted.clone(), m, nulls.clone())
                                .map_err(arrow_err)?;
                        Ok((Arc::new(a) as ArrayRef, Arc::new(b) as ArrayRef))
                    }),
                )
            }
            DataType::FixedSizeList(f, n) => {
                let list = col.as_fixed_size_list();
                let n = *n as usize;
                let values = list.values().slice(list.offset() * n, list.len() * n);
                let ranges = (0..list.len()).map(|r| (r * n, (r + 1) * n)).collect();
                let nulls = list.nulls().cloned();
                let f = f.clone();
                (
                    values,
                    ranges,
                    Box::new(move |v, m| {
                        let a = FixedSizeListArray::try_new(f.clone(), n as i32, v, nulls.clone())
                            .map_err(arrow_err)?;
                        let mf = Arc::new(Field::new_list_field(DataType::Boolean, false));
                        let b = FixedSizeListArray::try_new(mf, n as i32, m, nulls.clone())
                            .map_err(arrow_err)?;
                        Ok((Arc::new(a) as ArrayRef, Arc::new(b) as ArrayRef))
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
        let (masked, mask): (ArrayRef, BooleanArray) = match values.data_type() {
            DataType::Int32 => {
                let (v, m) = mask_values(
                    values.as_primitive::<Int32Type>(),
                    &ranges,
                    &ids,
                    self.key,
                    self.p,
                    self.token as i32,
                );
                (Arc::new(v), m)
            }
            _ => {
                let (v, m) = mask_values(
                    values.as_primitive::<Int64Type>(),
                    &ranges,
                    &ids,
                    self.key,
                    self.p,
                    self.token,
                );
                (Arc::new(v), m)
            }
        };
        let (a, m) = rebuild(masked, Arc::new(mask))?;
        let mut columns = batch.data.columns().to_vec();
        columns[self.input] = a;
        columns.push(m);
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

    #[test]
    fn masks_at_rate_p_with_a_matching_mask_column_and_is_batching_independent() {
        let rows: Vec<Option<Vec<Option<i32>>>> = (0..500)
            .map(|r| Some((0..(r % 17 + 1)).map(|t| Some(t + 1)).collect()))
            .collect();
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(rows);
        let data = RecordBatch::try_from_iter([("tok", Arc::new(list) as ArrayRef)]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///t.parquet"),
            row_group: 0,
        };
        let batch = Batch::new(data, Lineage::new(origin, 0, 500, 0));
        let cfg = MaskTokensConfig {
            column: "tok".into(),
            p: 0.15,
            mask_token: 0,
            mask_column: None,
            seed: 1,
        };
        let stage = StageRef {
            index: 2,
            kind: "mask_tokens",
            location: None,
        };
        let (st, schema) = build(&stage, &cfg, &batch.data.schema()).unwrap();
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
}
