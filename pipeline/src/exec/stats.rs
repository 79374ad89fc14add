//! The statistics of a `standardize` stage not given its mean and std: one pass over the
//! source through the stages before it, checked, and the run summary's note on them.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use futures::StreamExt;

use super::{PreparedPipeline, StageSlot};
use crate::error::{Error, Result, StageRef};
use crate::pipeline_config::PipelineConfig;
use crate::runtime::{CpuPool, PipelineMetrics};
use crate::source::Source;
use crate::source::parquet::ParquetSource;
use crate::stage::{
    BuiltStage, ColumnStats, ComputedStats, StageConfig, per_element_width, update_elements,
};
use crate::state::Acknowledger;

/// For a `standardize` stage not given its mean and std, statistics to build it with before
/// they are computed (mean 0, std 1 for each column); `None` for any other stage.
pub(super) fn placeholder_stats(config: &StageConfig) -> Option<ComputedStats> {
    match config {
        StageConfig::Standardize(c) if c.mean.is_none() && c.std.is_none() => Some(
            c.columns
                .iter()
                .map(|n| {
                    let one = vec![ColumnStats::given(0.0, 1.0)];
                    (n.clone(), if c.per_element { Vec::new() } else { one })
                })
                .collect(),
        ),
        _ => None,
    }
}

/// One pass over the source (one epoch) through the stages built so far, accumulating the
/// mean and variance of the columns of a `standardize` stage. NaN and ±inf values stop the
/// pass naming their row, or are left out and counted (`non_finite`); statistics that cannot
/// be computed (no finite value, an overflow) are an error rather than a NaN mean.
pub(super) async fn compute_stats(
    source: &ParquetSource,
    slots: &[StageSlot],
    sref: &StageRef,
    config: &StageConfig,
    pool: &CpuPool,
    runtime: &PipelineConfig,
    schema: SchemaRef,
) -> Result<ComputedStats> {
    let StageConfig::Standardize(c) = config else {
        return Err(Error::Internal(
            "statistics requested for a non-standardize stage".into(),
        ));
    };
    let prefix: Vec<StageSlot> = slots
        .iter()
        .map(|s| StageSlot {
            stage: s.stage.clone(),
            built: s.built.clone_stage(),
            input: s.input.clone(),
        })
        .collect();
    let prepared = PreparedPipeline {
        source: Source::Parquet(Box::new(source.single_epoch())),
        slots: prefix,
        schema: schema.clone(),
        pool: pool.clone(),
        metrics: Arc::new(PipelineMetrics::default()),
        queue_bytes: runtime.runtime.queue_bytes.as_u64(),
        parallelism: runtime.runtime.parallelism,
        acker: Arc::new(Acknowledger::new(None)),
        collective: None,
        resume: None,
        kafka_resume: None,
        frozen: Vec::new(),
        prelude: None,
    };
    let mut indices = Vec::new();
    for name in &c.columns {
        let i = schema
            .index_of(name)
            .map_err(|_| Error::Internal(format!("column {name} vanished")))?;
        indices.push((name.clone(), i));
    }
    // One accumulator per column, or per element with `per_element` (none for a column that
    // is not a fixed-size list: the stage's build then refuses it, naming the column).
    let mut stats: ComputedStats = indices
        .iter()
        .map(|(n, i)| {
            let width = match c.per_element {
                true => per_element_width(schema.field(*i).data_type()).unwrap_or(0),
                false => 1,
            };
            (n.clone(), vec![ColumnStats::empty(); width])
        })
        .collect();
    let skip = c.non_finite.unwrap_or_default() == crate::stage::NonFinite::Skip;
    let per_element = c.per_element;
    let mut stream = prepared.stream();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let idx = indices.clone();
        let mut st = std::mem::take(&mut stats);
        let sref = sref.clone();
        stats = pool
            .run(move || -> Result<ComputedStats> {
                for ((name, i), (_, s)) in idx.iter().zip(st.iter_mut()) {
                    let column = batch.data.column(*i);
                    let first = match s.as_mut_slice() {
                        [] => Ok(None),
                        [one] if !per_element => one.update(column),
                        each => update_elements(each, column),
                    }
                    .map_err(|e| Error::Arrow {
                        context: "computing standardize statistics".into(),
                        source: e,
                    })?;
                    let Some(bad) = first else { continue };
                    let row = batch.lineage.describe_row(bad.row as u64);
                    if !skip {
                        return Err(Error::Data {
                            stage: sref,
                            message: format!(
                                "column `{name}` holds {} (not a finite number): its mean and std would not be numbers, and neither would any value this stage writes; set `non_finite: skip` to leave NaN and ±inf values out of the statistics (the run summary counts them), or remove those rows before this stage",
                                bad.value
                            ),
                            rows: row,
                        });
                    }
                    if s[0].first_skipped.is_none() {
                        s[0].first_skipped = Some(row);
                    }
                }
                Ok(st)
            })
            .await??;
    }
    for (name, each) in &stats {
        for (k, st) in each.iter().enumerate() {
            match c.per_element {
                true => check_stats(sref, &format!("{name}[{k}]"), st)?,
                false => check_stats(sref, name, st)?,
            }
        }
    }
    Ok(stats)
}

/// Refuses statistics that would corrupt every value: none computed although values were
/// seen (all NaN or ±inf), or a mean or variance beyond float64 (values near its limits).
fn check_stats(sref: &StageRef, name: &str, st: &ColumnStats) -> Result<()> {
    let message = if st.count == 0 && st.skipped > 0 {
        format!(
            "every one of the {} non-null values of column `{name}` is NaN or ±inf: there is no mean or std to compute; give `mean` and `std`, or remove those rows first",
            st.skipped
        )
    } else if !(st.mean.is_finite() && st.m2.is_finite()) {
        format!(
            "the mean or variance of column `{name}` overflows float64 (values near ±1.8e308): give `mean` and `std`, or scale the column first"
        )
    } else {
        return Ok(());
    };
    Err(Error::Stage {
        stage: sref.clone(),
        message,
    })
}

/// The run summary's line about one column's computed statistics — one for the column, or
/// one per element (`check_stats` has refused the ones that are not numbers).
pub(super) fn stats_note(name: &str, each: &[ColumnStats]) -> String {
    match each {
        [st] => column_note(name, st),
        _ => elements_note(name, each),
    }
}

fn column_note(name: &str, st: &ColumnStats) -> String {
    if st.count == 0 {
        // No row reached the stage (an empty source, a filter that keeps none) or only nulls:
        // mean 0 and std 1 leave whatever comes later as it is.
        return format!(
            "warning: no values of `{name}` to compute statistics over: mean 0, std 1 (values pass unchanged)"
        );
    }
    let mut note = format!("computed over {} values of `{name}`", st.count);
    note += &skipped_note(st.skipped, st.first_skipped.as_deref());
    note + &format!(": mean {:.6}, std {:.6}", st.mean, st.std())
}

fn elements_note(name: &str, each: &[ColumnStats]) -> String {
    let range = |f: &dyn Fn(&ColumnStats) -> f64| {
        each.iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let (mean_lo, mean_hi) = range(&|s| s.mean);
    let (std_lo, std_hi) = range(&|s| s.std());
    let (few, most) = range(&|s| s.count as f64);
    let empty = each.iter().filter(|s| s.count == 0).count();
    let mut note = format!(
        "computed per element over {} elements of `{name}` ({few}–{most} values each",
        each.len()
    );
    if empty > 0 {
        note += &format!("; warning: {empty} element(s) had no values: mean 0, std 1");
    }
    note += ")";
    let skipped = each.iter().map(|s| s.skipped).sum();
    note += &skipped_note(skipped, each[0].first_skipped.as_deref());
    note + &format!(": mean in [{mean_lo:.6}, {mean_hi:.6}], std in [{std_lo:.6}, {std_hi:.6}]")
}

fn skipped_note(skipped: u64, first: Option<&str>) -> String {
    if skipped == 0 {
        return String::new();
    }
    format!(
        ", {skipped} NaN/±inf value(s) left out (`non_finite: skip`; the first at {})",
        first.unwrap_or("an unknown row")
    )
}

impl BuiltStage {
    /// A copy of the stage, for the statistics pass to run (the run keeps the original).
    fn clone_stage(&self) -> BuiltStage {
        match self {
            BuiltStage::Map(t) => BuiltStage::Map(t.clone()),
            BuiltStage::Rebatch { size, drop_last } => BuiltStage::Rebatch {
                size: *size,
                drop_last: *drop_last,
            },
            BuiltStage::Shuffle(s) => BuiltStage::Shuffle(s.clone()),
        }
    }
}

/// Computed statistics written into a config: one number, or a list with one per element.
pub(super) fn frozen_values(
    each: &[ColumnStats],
    f: impl Fn(&ColumnStats) -> f64,
) -> crate::stage::NumberOrList {
    match each {
        [one] => crate::stage::NumberOrList::One(f(one)),
        _ => crate::stage::NumberOrList::Each(each.iter().map(f).collect()),
    }
}
