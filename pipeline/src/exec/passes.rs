//! The rewrites of the built stages before a run starts, in the order they run (see `run`):
//! each one may change a stage's spec or the schema a stage receives.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use super::StageSlot;
use crate::config::Located;
use crate::error::Result;
use crate::stage::{self, BuiltStage, StageConfig};

/// Runs every pass over the built stages, in order; `output` is the schema after the last
/// stage. Returns the notes they leave for the run summary (stage index, text), in order.
pub(super) fn run(
    configs: &[Located<StageConfig>],
    slots: &mut [StageSlot],
    output: &SchemaRef,
    ctx: &stage::BuildContext,
) -> Result<Vec<(usize, String)>> {
    // 1. A shuffle that groups rows by length learns the size of the `batch` stage after it.
    let mut notes = link_groups(slots);
    // 2. A `standardize` is done by the `gaussian_noise`/`feature_dropout` after it, row by
    //    row in that stage's own pass. Independent of pass 1 (which builds neither).
    notes.extend(fuse_standardize(slots));
    // 3. A shuffle hands the column an `image` stage replaces, or the fixed-size list a
    //    per-value stage rewrites, as views into its window (the stages up to that stage
    //    then receive the view schema). After pass 2: a `standardize` it deferred lies
    //    between them and is passed over. It copies the shuffle's spec as pass 1 left it; the
    //    two change different parts of it, so their order decides only the order of their
    //    notes on a shuffle.
    notes.extend(fuse_gathers(configs, slots, output, ctx)?);
    Ok(notes)
}

/// Lets the stage right after a `standardize` do its work, each row standardized just before
/// that stage's own work on it (see [`stage::fused`](crate::stage)), when the `standardize`
/// only rescales float columns in place (none cast) and the next stage takes every one of
/// them; the `standardize` stage then passes its batches on. The values are bit for bit the
/// same. Returns a note for each `standardize` it deferred.
fn fuse_standardize(slots: &mut [StageSlot]) -> Vec<(usize, String)> {
    let mut notes = Vec::new();
    for i in 1..slots.len() {
        let (BuiltStage::Map(first), BuiltStage::Map(next)) =
            (&slots[i - 1].built, &slots[i].built)
        else {
            continue;
        };
        let Some(columns) = first.standardizes() else {
            continue;
        };
        let input = &slots[i - 1].input;
        if columns
            .iter()
            .any(|c| input.field(c.index).data_type() != &c.to)
        {
            continue;
        }
        let Some(fused) = next.after_standardize(columns) else {
            continue;
        };
        slots[i].built = BuiltStage::Map(fused);
        slots[i - 1].built = stage::deferred();
        notes.push((
            i - 1,
            format!(
                "is done by {}, each row standardized in that stage's own pass over it (the same values)",
                slots[i].stage
            ),
        ));
    }
    notes
}

/// Gives each shuffle with `group_by_length` the size of the `batch` stage after it (the
/// stage order was checked: there is one). Returns a note for each.
fn link_groups(slots: &mut [StageSlot]) -> Vec<(usize, String)> {
    let mut notes = Vec::new();
    for i in 0..slots.len() {
        let batch = slots[i + 1..].iter().find_map(|s| match &s.built {
            BuiltStage::Rebatch { size, .. } => Some((*size, s.stage.clone())),
            _ => None,
        });
        if let (BuiltStage::Shuffle(spec), Some((size, at))) = (&mut slots[i].built, batch)
            && let Some(g) = &mut spec.group
        {
            g.batch_size = size;
            notes.push((
                i,
                format!(
                    "groups rows by the length of `{}` for {at}: windows cut into groups of {} batches of {size}",
                    g.name, g.batches
                ),
            ));
        }
    }
    notes
}

/// Lets a shuffle hand a column to the stage that consumes it as views into its window
/// instead of copying every row, when only `batch` stages (or a `standardize` pass 2
/// deferred) lie between them: the shuffle emits the column as `BinaryView` (see
/// [`stage::shuffle`]) and the stages in between receive that schema. The consumer is an
/// `image` stage that replaces a byte column (rebuilt for the view schema; its output schema
/// is checked to be unchanged), or a per-value stage that rewrites a fixed-size list of
/// floats and takes it as views (`Transform::takes_views`, see `stage::gathered`). Either
/// reads each row's bytes once, to convert them; the values are identical. `output` is the
/// schema after the last stage. Returns a note for each shuffle it changed.
fn fuse_gathers(
    configs: &[Located<StageConfig>],
    slots: &mut [StageSlot],
    output: &SchemaRef,
    ctx: &stage::BuildContext,
) -> Result<Vec<(usize, String)>> {
    let mut notes = Vec::new();
    for i in 0..slots.len() {
        let BuiltStage::Shuffle(spec) = &slots[i].built else {
            continue;
        };
        let mut k = i + 1;
        while slots.get(k).is_some_and(|s| match &s.built {
            BuiltStage::Rebatch { .. } => true,
            BuiltStage::Map(t) => t.passes_through(),
            BuiltStage::Shuffle(_) => false,
        }) {
            k += 1;
        }
        let Some((cols, consumer)) = view_consumer(configs, slots, i, k, output, ctx)? else {
            continue;
        };
        let physical: SchemaRef = Arc::new(stage::shuffle::view_schema(&slots[i].input, &cols));
        let names: Vec<String> = cols
            .iter()
            .map(|&c| format!("`{}`", slots[i].input.field(c).name()))
            .collect();
        let mut spec = spec.clone();
        spec.views = cols;
        slots[i].built = BuiltStage::Shuffle(spec);
        for s in &mut slots[i + 1..=k] {
            s.input = physical.clone();
        }
        if let Some(built) = consumer {
            slots[k].built = built;
        }
        notes.push((
            i,
            format!(
                "hands {} to {} as views into its window (the rows are not copied)",
                names.join(", "),
                slots[k].stage
            ),
        ));
    }
    Ok(notes)
}

/// The columns the stage at `k` can take from the shuffle at `i` as views (none: `None`), and
/// the stage rebuilt for them (`None`: it takes them as it is).
fn view_consumer(
    configs: &[Located<StageConfig>],
    slots: &[StageSlot],
    i: usize,
    k: usize,
    output: &SchemaRef,
    ctx: &stage::BuildContext,
) -> Result<Option<(Vec<usize>, Option<BuiltStage>)>> {
    use arrow::datatypes::DataType;
    let (Some(config), Some(consumer)) = (configs.get(k).map(|s| &s.value), slots.get(k)) else {
        return Ok(None);
    };
    let input = &slots[i].input;
    let StageConfig::Image(c) = config else {
        // A per-value stage: every one of its columns it takes as views.
        let BuiltStage::Map(t) = &consumer.built else {
            return Ok(None);
        };
        let cols: Vec<usize> = (0..input.fields().len())
            .filter(|&col| {
                consumer.input.fields().get(col).map(|f| f.data_type())
                    == Some(input.field(col).data_type())
                    && t.takes_views(col)
            })
            .collect();
        return Ok((!cols.is_empty()).then_some((cols, None)));
    };
    if c.output.as_ref().is_some_and(|o| o != &c.column) {
        return Ok(None);
    }
    let Ok(col) = input.index_of(&c.column) else {
        return Ok(None);
    };
    if !matches!(
        input.field(col).data_type(),
        DataType::Binary | DataType::LargeBinary | DataType::FixedSizeBinary(_)
    ) {
        return Ok(None);
    }
    let physical: SchemaRef = Arc::new(stage::shuffle::view_schema(input, &[col]));
    let logical_out = slots.get(k + 1).map_or(output, |s| &s.input);
    let (image, out) = stage::build(&consumer.stage, config, &physical, None, ctx)?;
    Ok((&out == logical_out).then_some((vec![col], Some(image))))
}
