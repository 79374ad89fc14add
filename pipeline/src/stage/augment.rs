//! Seeded tabular augmentation: `gaussian_noise` and `feature_dropout`.
//!
//! Every random draw is a pure function of `(seed, stage, column, epoch, sample identity)`:
//! a ChaCha8 key is derived from the seed, the stage's position and the column; the stream is
//! the row's identity, hashed from its lineage (object URL and row, or Kafka topic, partition
//! and offset) and epoch. Thread count, batch boundaries and timing cannot change a value: the
//! same row gets the same noise wherever and whenever it is processed.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, RecordBatch};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Float64Type, SchemaRef};
use chacha20::ChaCha8Rng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use super::fused::RowAffine;
use super::kernels::StandardizeColumn;
use super::normal::{Counter, SplitMix64, splitmix64};
use super::{Build, BuiltStage, StageKind};
use crate::batch::{Batch, Lineage, Origin};
use crate::error::{Error, Result, StageRef};
use crate::state::{Draws, FNV_BASIS, fnv1a};

/// `type: gaussian_noise` — adds `std · N(0, 1)` to every value. Each draw is a pure function
/// of (seed, stage, column, epoch, row identity from lineage): the same row gets the same noise
/// for any thread count or batching, and new noise each epoch.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GaussianNoiseConfig {
    /// float32/float64 columns, or fixed-size lists of them (noise per element).
    pub columns: Vec<String>,
    /// Standard deviation of the noise; ≥ 0.
    pub std: f64,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

/// `type: feature_dropout` — sets each value to 0 with probability `p` (seeded like
/// `gaussian_noise`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FeatureDropoutConfig {
    /// float32/float64 columns, or fixed-size lists of them (dropout per element).
    pub columns: Vec<String>,
    /// Probability of zeroing a value, in `[0, 1)`.
    pub p: f64,
    /// Multiply kept values by `1 / (1 - p)` (inverted dropout), keeping the expected value.
    /// Default: false.
    #[serde(default)]
    pub scale: bool,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

/// What an augmentation does to each value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Noise {
    /// `x + std · N(0, 1)`, drawn as `draws` says.
    Gaussian { std: f64, draws: Draws },
    /// `0` with probability `p`, else `x · scale`.
    Dropout { p: f64, scale: f64 },
}

#[derive(Debug, Clone)]
pub(crate) struct Augment {
    pub stage: StageRef,
    pub noise: Noise,
    /// Column index and the ChaCha key for it.
    pub columns: Vec<(usize, [u8; 32])>,
    pub schema: SchemaRef,
    /// For each of `columns`, the `standardize` stage before this one whose work this stage
    /// does on each row before its own (see [`super::fused`]); empty when fused with none.
    pub pre: Vec<Option<StandardizeColumn>>,
}

/// Whether a column can be augmented: float32/float64, or a fixed-size list of them.
pub(crate) fn supported(t: &DataType) -> bool {
    match t {
        DataType::Float32 | DataType::Float64 => true,
        DataType::FixedSizeList(f, _) => {
            matches!(f.data_type(), DataType::Float32 | DataType::Float64)
        }
        _ => false,
    }
}

/// A row's origin hashed with FNV-1a ([`fnv1a`]): fixed and platform-independent (std's
/// hasher may change between Rust releases, which would change every augmentation).
fn origin_hash(o: &Origin) -> u64 {
    match o {
        // The object's file name (not its directory or store), so a dataset copied from a
        // local disk to S3 or another machine gets the same augmentation. The row position
        // counts from the start of the object: the row group does not enter the identity.
        Origin::Object { url, .. } => {
            let name = url.rsplit('/').next().unwrap_or(url);
            fnv1a(name.as_bytes(), fnv1a(b"object", FNV_BASIS))
        }
        Origin::Kafka { topic, partition } => fnv1a(
            &partition.to_le_bytes(),
            fnv1a(topic.as_bytes(), fnv1a(b"kafka", FNV_BASIS)),
        ),
        Origin::KafkaMessage {
            topic,
            partition,
            offset,
            ..
        } => fnv1a(
            &offset.to_le_bytes(),
            fnv1a(
                &partition.to_le_bytes(),
                fnv1a(topic.as_bytes(), fnv1a(b"kafka-message", FNV_BASIS)),
            ),
        ),
    }
}

/// The identity of every row of a batch, with its epoch mixed in.
pub(crate) fn row_ids(lineage: &Lineage) -> Vec<u64> {
    let mut out = Vec::with_capacity(lineage.num_rows() as usize);
    // A shuffled batch has a span per row, from the few row groups or partitions of its
    // window: their hashes are kept (the last one found is tried first), instead of hashing a
    // file name for every row (in the tabular bench: 1.5 % of the CPU before, 0.7 % after).
    let mut known: Vec<(Origin, u64)> = Vec::new();
    let mut last = 0usize;
    for s in lineage.spans() {
        let origin = match known.get(last) {
            Some((o, h)) if *o == s.origin => *h,
            _ => match known.iter().position(|(o, _)| *o == s.origin) {
                Some(i) => {
                    last = i;
                    known[i].1
                }
                None => {
                    let h = origin_hash(&s.origin);
                    if known.len() < KNOWN_ORIGINS {
                        last = known.len();
                        known.push((s.origin, h));
                    }
                    h
                }
            },
        };
        let h = origin ^ splitmix64(s.epoch.wrapping_add(0x5eed));
        for k in 0..s.len {
            out.push(splitmix64(h ^ splitmix64(s.first + k)));
        }
    }
    out
}

/// How many origins' hashes [`row_ids`] keeps for a batch (more are hashed each time).
const KNOWN_ORIGINS: usize = 16;

/// The ChaCha key of one column of one stage.
pub(crate) fn column_key(seed: u64, stage_index: usize, column: &str) -> [u8; 32] {
    let mut key = [0u8; 32];
    let mut x = fnv1a(column.as_bytes(), splitmix64(seed) ^ stage_index as u64);
    for chunk in key.chunks_mut(8) {
        x = splitmix64(x);
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    key
}

/// A choice made with probability `p` (in `[0, 1)`) from one 32-bit word: taken when the
/// word is below p · 2³² (compared as integers, with its ceiling, which vectorises). How
/// `feature_dropout` drops values and `mask_tokens` selects tokens: value `i` of a row by
/// word `i` of the row's stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chance(u64);

impl Chance {
    pub(crate) fn new(p: f64) -> Self {
        Chance((p * 4_294_967_296.0).ceil() as u64)
    }

    #[inline(always)]
    pub(crate) fn hit(self, word: u32) -> bool {
        u64::from(word) < self.0
    }
}

/// The next `n` 32-bit words of `rng`, generated in one fill into `buf`.
pub(crate) fn words<'a>(
    rng: &mut ChaCha8Rng,
    n: usize,
    buf: &'a mut Vec<u8>,
) -> impl Iterator<Item = u32> + 'a {
    // Grown once, never cleared: the fill overwrites what is used.
    if buf.len() < 4 * n {
        buf.resize(4 * n, 0);
    }
    let buf = &mut buf[..4 * n];
    rand::Rng::fill_bytes(rng, buf);
    buf.chunks_exact(4).map(super::normal::word)
}

pub(super) trait Float: ArrowPrimitiveType {
    /// `row[i] += std · zᵢ` in place, the `zᵢ` standard normal samples from `rng`,
    /// positioned at the start of the row's stream; `scratch` is reused between rows.
    fn gaussian(row: &mut [Self::Native], std: f64, rng: &mut ChaCha8Rng, scratch: &mut Vec<u8>);
    /// [`Float::gaussian`] from the stream of `counter` starting at `stream` (draws versions 2
    /// and 3).
    fn gaussian_at(row: &mut [Self::Native], std: f64, at: (Counter, u64), scratch: &mut Vec<u8>);
    /// `v · scale`.
    fn scaled(v: Self::Native, scale: f64) -> Self::Native;
    /// `x` as this type, as `standardize` converts its statistics.
    fn of(x: f64) -> Self::Native;
    fn is_nan(v: Self::Native) -> bool;
    /// Appends the values whose little-endian bytes are `bytes` (whole values) to `out`.
    fn extend_from_le(out: &mut Vec<Self::Native>, bytes: &[u8]);
}

impl Float for Float32Type {
    fn gaussian(row: &mut [f32], std: f64, rng: &mut ChaCha8Rng, s: &mut Vec<u8>) {
        super::normal::noise_row_f32(rng, row, std as f32, s);
    }
    fn gaussian_at(row: &mut [f32], std: f64, (c, stream): (Counter, u64), s: &mut Vec<u8>) {
        super::normal::noise_row_f32_at(c, stream, row, std as f32, s);
    }
    fn scaled(v: f32, scale: f64) -> f32 {
        v * scale as f32
    }
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn is_nan(v: f32) -> bool {
        v.is_nan()
    }
    fn extend_from_le(out: &mut Vec<f32>, bytes: &[u8]) {
        out.extend(
            bytes
                .as_chunks::<4>()
                .0
                .iter()
                .map(|b| f32::from_le_bytes(*b)),
        );
    }
}

impl Float for Float64Type {
    fn gaussian(row: &mut [f64], std: f64, rng: &mut ChaCha8Rng, _: &mut Vec<u8>) {
        for v in row {
            let z: f64 = StandardNormal.sample(rng);
            *v += std * z;
        }
    }
    fn gaussian_at(row: &mut [f64], std: f64, (c, stream): (Counter, u64), _: &mut Vec<u8>) {
        fn with(row: &mut [f64], std: f64, rng: &mut impl rand::Rng) {
            for v in row {
                let z: f64 = StandardNormal.sample(rng);
                *v += std * z;
            }
        }
        match c {
            Counter::SplitMix64 => with(row, std, &mut SplitMix64(stream)),
            Counter::Ars => with(row, std, &mut super::ars::ArsStream::at(stream, 0)),
        }
    }
    fn scaled(v: f64, scale: f64) -> f64 {
        v * scale
    }
    fn of(x: f64) -> f64 {
        x
    }
    fn is_nan(v: f64) -> bool {
        v.is_nan()
    }
    fn extend_from_le(out: &mut Vec<f64>, bytes: &[u8]) {
        out.extend(
            bytes
                .as_chunks::<8>()
                .0
                .iter()
                .map(|b| f64::from_le_bytes(*b)),
        );
    }
}

/// Applies `noise` to `values` in place (row `r` owns `values[r*width .. (r+1)*width]`),
/// each row standardized by `pre` first when this stage does a `standardize` stage's work.
fn augment_values<T: Float>(
    values: &mut [T::Native],
    width: usize,
    ids: &[u64],
    key: [u8; 32],
    noise: Noise,
    pre: Option<&RowAffine<T::Native>>,
) where
    T::Native: std::ops::Sub<Output = T::Native> + std::ops::Div<Output = T::Native>,
{
    let mut work = row_work::<T>(key, noise, pre);
    for (row, id) in values.chunks_exact_mut(width.max(1)).zip(ids) {
        work(row, *id);
    }
}

/// [`row_work`]'s result: the work on one row, given the row and its identity.
pub(super) type RowWork<'a, N> = Box<dyn FnMut(&mut [N], u64) + 'a>;

/// What a stage does to one row of one column: `work(row, id)` standardizes the row by `pre`
/// first (when this stage does a `standardize` stage's work), then applies `noise` to it,
/// drawing from the stream of the row whose identity is `id` ([`row_ids`]). Built once per
/// batch and column; rows may come in any order (each one's draws depend on its id alone).
pub(super) fn row_work<'a, T: Float>(
    key: [u8; 32],
    noise: Noise,
    pre: Option<&'a RowAffine<T::Native>>,
) -> RowWork<'a, T::Native>
where
    T::Native: std::ops::Sub<Output = T::Native> + std::ops::Div<Output = T::Native>,
{
    let standardize = move |row: &mut [T::Native]| {
        if let Some(a) = pre {
            a.apply(row);
        }
    };
    // Grown once, reused for every row.
    let mut scratch = Vec::new();
    match noise {
        Noise::Gaussian {
            std,
            draws: Draws::ChaCha8,
        } => {
            let mut rng = ChaCha8Rng::from_seed(key);
            Box::new(move |row, id| {
                rng.set_stream(id);
                standardize(row);
                T::gaussian(row, std, &mut rng, &mut scratch)
            })
        }
        Noise::Gaussian {
            std,
            draws: draws @ (Draws::SplitMix64 | Draws::Ars),
        } => {
            let counter = match draws {
                Draws::SplitMix64 => Counter::SplitMix64,
                _ => Counter::Ars,
            };
            // The row's stream: the column's key and the row's identity, mixed once more so
            // that no two rows' streams are a few steps apart.
            let k = u64::from_le_bytes([
                key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
            ]);
            Box::new(move |row, id| {
                standardize(row);
                T::gaussian_at(row, std, (counter, splitmix64(k ^ id)), &mut scratch);
            })
        }
        Noise::Dropout { p, scale } => {
            let drop = Chance::new(p);
            let mut rng = ChaCha8Rng::from_seed(key);
            Box::new(move |row, id| {
                rng.set_stream(id);
                standardize(row);
                let n = row.len();
                for (v, w) in row.iter_mut().zip(words(&mut rng, n, &mut scratch)) {
                    // A dropped NaN stays NaN (as PyTorch's multiply-by-mask dropout): dropout
                    // never turns a missing value into a number.
                    *v = if drop.hit(w) && !T::is_nan(*v) {
                        T::Native::default()
                    } else {
                        T::scaled(*v, scale)
                    };
                }
            })
        }
    }
}

/// A float column's values as rows of `width`: the column itself (width 1), or a fixed-size
/// list's values for exactly this batch (a sliced list included); `f` maps them, and the
/// result is put back in the column's shape, with its nulls.
pub(crate) fn map_float_rows(
    col: &ArrayRef,
    f: impl FnOnce(&ArrayRef, usize) -> std::result::Result<ArrayRef, String>,
) -> std::result::Result<ArrayRef, String> {
    match col.data_type() {
        DataType::FixedSizeList(field, n) => {
            let list = col.as_fixed_size_list();
            let width = *n as usize;
            let values = list
                .values()
                .slice(list.offset() * width, list.len() * width);
            let inner = f(&values, width)?;
            FixedSizeListArray::try_new(field.clone(), *n, inner, list.nulls().cloned())
                .map(|a| Arc::new(a) as ArrayRef)
                .map_err(|e| e.to_string())
        }
        _ => f(col, 1),
    }
}

/// `noise` over a float32 or float64 column or fixed-size list of them, in place when the
/// batch held the only reference to its values ([`owned`](super::owned)); each row
/// standardized first when `pre` is the work of a `standardize` stage fused with this one.
/// A fixed-size list a shuffle handed over as views into its window (`BinaryView`, see
/// [`Transform::takes_views`](super::Transform::takes_views)) is read from the window once
/// and written as the list `out` (its type in the stage's output).
fn augment_column(
    col: ArrayRef,
    out: &DataType,
    ids: &[u64],
    key: [u8; 32],
    noise: Noise,
    pre: Option<&StandardizeColumn>,
) -> std::result::Result<ArrayRef, String> {
    use super::owned::{rewritable, rewrite_rows};
    let t = col.data_type().clone();
    if t == DataType::BinaryView {
        return match out {
            DataType::FixedSizeList(item, n) if item.data_type() == &DataType::Float32 => {
                super::gathered::augment_views::<Float32Type>(
                    col.as_binary_view(),
                    (item, *n),
                    ids,
                    key,
                    noise,
                    pre,
                )
            }
            DataType::FixedSizeList(item, n) if item.data_type() == &DataType::Float64 => {
                super::gathered::augment_views::<Float64Type>(
                    col.as_binary_view(),
                    (item, *n),
                    ids,
                    key,
                    noise,
                    pre,
                )
            }
            _ => Err(format!("views of rows where {out} was expected")),
        };
    }
    if rewritable::<Float32Type>(&t) {
        let pre = pre.map(|c| RowAffine::new(&c.mean, &c.std, Float32Type::of));
        rewrite_rows::<Float32Type>(col, |v, width| {
            augment_values::<Float32Type>(v, width, ids, key, noise, pre.as_ref())
        })
    } else if rewritable::<Float64Type>(&t) {
        let pre = pre.map(|c| RowAffine::new(&c.mean, &c.std, Float64Type::of));
        rewrite_rows::<Float64Type>(col, |v, width| {
            augment_values::<Float64Type>(v, width, ids, key, noise, pre.as_ref())
        })
    } else {
        return Err(format!("unsupported type {t}"));
    }
    .map_err(|e| e.to_string())
}

/// [`row_ids`] of a batch whose lineage covers each of its rows (else a bug, reported).
pub(crate) fn batch_row_ids(stage: &StageRef, batch: &Batch) -> Result<Vec<u64>> {
    let ids = row_ids(&batch.lineage);
    if ids.len() != batch.num_rows() {
        return Err(Error::Internal(format!(
            "{stage}: lineage covers {} rows of {}",
            ids.len(),
            batch.num_rows()
        )));
    }
    Ok(ids)
}

impl super::Transform for Augment {
    fn apply(&self, mut batch: Batch) -> Result<Batch> {
        let ids = batch_row_ids(&self.stage, &batch)?;
        let mut cols = super::take_columns(&mut batch);
        for (n, (i, key)) in self.columns.iter().enumerate() {
            let col = std::mem::replace(&mut cols[*i], super::placeholder());
            let pre = self.pre.get(n).and_then(Option::as_ref);
            let out = self.schema.field(*i).data_type();
            cols[*i] = augment_column(col, out, &ids, *key, self.noise, pre).map_err(|m| {
                Error::Stage {
                    stage: self.stage.clone(),
                    message: m,
                }
            })?;
        }
        let data = RecordBatch::try_new(self.schema.clone(), cols).map_err(|e| Error::Arrow {
            context: self.stage.to_string(),
            source: e,
        })?;
        Ok(batch.with_data(data))
    }

    fn takes_views(&self, column: usize) -> bool {
        self.columns.iter().any(|(i, _)| *i == column)
            && super::gathered::viewable_list(self.schema.field(column).data_type())
    }

    fn after_standardize(&self, pre: &[StandardizeColumn]) -> Option<Arc<dyn super::Transform>> {
        if !self.pre.is_empty() {
            return None;
        }
        let mut aligned = vec![None; self.columns.len()];
        for c in pre {
            let n = self.columns.iter().position(|(i, _)| *i == c.index)?;
            aligned[n] = Some(c.clone());
        }
        Some(Arc::new(Augment {
            pre: aligned,
            ..self.clone()
        }))
    }
}

/// `gaussian_noise`: checks `std`, then the columns (see `augment_stage`).
impl StageKind for GaussianNoiseConfig {
    fn keeps_columns(&self) -> bool {
        true
    }

    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        if !(self.std >= 0.0 && self.std.is_finite()) {
            return Err(b.err(format!(
                "`std` must be a finite number ≥ 0, not {}",
                self.std
            )));
        }
        super::augment_stage(
            b.stage,
            b.input,
            &self.columns,
            self.seed,
            Noise::Gaussian {
                std: self.std,
                draws: b.ctx.draws,
            },
        )
    }
}

/// `feature_dropout`: checks `p`, then the columns (see `augment_stage`).
impl StageKind for FeatureDropoutConfig {
    fn keeps_columns(&self) -> bool {
        true
    }

    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        if !(0.0..1.0).contains(&self.p) {
            return Err(b.err(format!("`p` must be in [0, 1), not {}", self.p)));
        }
        let scale = if self.scale {
            1.0 / (1.0 - self.p)
        } else {
            1.0
        };
        super::augment_stage(
            b.stage,
            b.input,
            &self.columns,
            self.seed,
            Noise::Dropout { p: self.p, scale },
        )
    }
}

#[cfg(test)]
#[path = "augment_tests.rs"]
mod tests;
