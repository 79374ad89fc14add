use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Float64Array, RecordBatch,
};
use arrow::datatypes::{DataType, Field, Float32Type, Float64Type, Schema};

use crate::batch::{Batch, Lineage, Name, Origin};
use crate::error::StageRef;
use crate::stage::Transform;
use crate::stage::augment::Noise;
use crate::stage::kernels::{Standardize, StandardizeColumn};
use crate::state::Draws;

const WIDTH: usize = 5;

/// `n` rows of `x: fixed_size_list<float{32,64}>[WIDTH]` (row 3 null) starting at file row
/// `first`, with a NaN and an infinity among the values.
fn batch(n: usize, first: u64, f64s: bool) -> Batch {
    let raw = (0..n * WIDTH).map(|v| match v {
        7 => f64::NAN,
        11 => f64::INFINITY,
        v => (v as f64 * 0.37).sin() * 40.0 + 3.0,
    });
    let (leaf, values): (DataType, ArrayRef) = if f64s {
        (
            DataType::Float64,
            Arc::new(Float64Array::from_iter_values(raw)),
        )
    } else {
        let raw = raw.map(|v| v as f32);
        (
            DataType::Float32,
            Arc::new(Float32Array::from_iter_values(raw)),
        )
    };
    let field = Arc::new(Field::new("item", leaf, true));
    let nulls = arrow::buffer::NullBuffer::from((0..n).map(|r| r != 3).collect::<Vec<_>>());
    let x = FixedSizeListArray::try_new(field.clone(), WIDTH as i32, values, Some(nulls));
    let schema = Arc::new(Schema::new(vec![Field::new(
        "x",
        DataType::FixedSizeList(field, WIDTH as i32),
        true,
    )]));
    let data = RecordBatch::try_new(schema, vec![Arc::new(x.unwrap())]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///f.parquet"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, first, n as u64, 0))
}

fn stage(index: usize, kind: &'static str) -> StageRef {
    StageRef {
        index,
        kind,
        location: None,
    }
}

/// Every value's bits, nulls included (a null row's values are computed too).
fn bits(b: &Batch) -> Vec<u64> {
    let l = b.data.column(0).as_fixed_size_list();
    let v = l.values();
    match v.data_type() {
        DataType::Float32 => v
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        _ => v
            .as_primitive::<Float64Type>()
            .values()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
    }
}

/// `standardize` then `noise`, one after the other and fused: the same bits, for one mean and
/// std, one per element, and a mix; float32 and float64; every noise kind and draws version.
#[test]
fn a_fused_standardize_gives_the_values_of_the_two_stages() {
    let stats: [(Vec<f64>, Vec<f64>); 3] = [
        (vec![0.5], vec![0.29]),
        (
            vec![1.0, -2.0, 3.5, 0.0, 7.25],
            vec![2.0, 0.5, 3.0, 1.0, 0.1],
        ),
        (vec![4.0], vec![1.5, 2.5, 0.75, 3.0, 9.0]),
    ];
    let noises = [
        Noise::Gaussian {
            std: 0.1,
            draws: Draws::ChaCha8,
        },
        Noise::Gaussian {
            std: 0.3,
            draws: Draws::SplitMix64,
        },
        Noise::Gaussian {
            std: 0.3,
            draws: Draws::Ars,
        },
        Noise::Dropout { p: 0.3, scale: 1.5 },
    ];
    for f64s in [false, true] {
        for (mean, std) in &stats {
            for noise in noises {
                let input = batch(9, 40, f64s);
                let schema = input.data.schema();
                let column = StandardizeColumn {
                    index: 0,
                    to: schema.field(0).data_type().clone(),
                    mean: mean.clone(),
                    std: std.clone(),
                };
                let standardize = Standardize {
                    stage: stage(0, "standardize"),
                    columns: vec![column],
                    schema: schema.clone(),
                };
                let (built, _) = super::super::augment_stage(
                    &stage(1, "gaussian_noise"),
                    &schema,
                    &["x".to_string()],
                    7,
                    noise,
                )
                .unwrap();
                let crate::stage::BuiltStage::Map(augment) = built else {
                    panic!("not a map stage")
                };
                let apart = augment
                    .apply(standardize.apply(input.clone()).unwrap())
                    .unwrap();
                let cols = standardize.standardizes().unwrap();
                let fused = augment.after_standardize(cols).unwrap();
                let together = fused.apply(input.clone()).unwrap();
                let what = format!("{noise:?}, mean {mean:?}, std {std:?}, f64 {f64s}");
                assert_eq!(bits(&apart), bits(&together), "{what}");
                // The stage did standardize: not the input's values plus noise alone.
                assert_ne!(
                    bits(&together),
                    bits(&augment.apply(input).unwrap()),
                    "{what}"
                );
            }
        }
    }
}

/// A `standardize` of a column the next stage does not take stays a stage of its own.
#[test]
fn a_stage_that_takes_other_columns_does_not_fuse() {
    let input = batch(4, 0, false);
    let schema = input.data.schema();
    let (built, _) = super::super::augment_stage(
        &stage(1, "gaussian_noise"),
        &schema,
        &["x".to_string()],
        7,
        Noise::Dropout { p: 0.5, scale: 1.0 },
    )
    .unwrap();
    let crate::stage::BuiltStage::Map(augment) = built else {
        panic!("not a map stage")
    };
    let other = StandardizeColumn {
        index: 1,
        to: DataType::Float32,
        mean: vec![0.0],
        std: vec![1.0],
    };
    assert!(augment.after_standardize(&[other]).is_none());
    // Nor does a stage that already does one.
    let own = StandardizeColumn {
        index: 0,
        to: schema.field(0).data_type().clone(),
        mean: vec![0.0],
        std: vec![2.0],
    };
    let once = augment
        .after_standardize(std::slice::from_ref(&own))
        .unwrap();
    assert!(once.after_standardize(&[own]).is_none());
}

/// The loops built for the CPU's widest vectors give bit for bit what the baseline build
/// gives (a subtract and a divide are exactly rounded at any width): one statistic and one
/// per element, rows of odd widths, lengths that leave a tail after the vectors, NaN and ±∞.
#[test]
fn the_widest_loops_equal_the_baseline_bit_for_bit() {
    use super::RowAffine;
    let raw: Vec<f64> = (0..4099)
        .map(|v| match v % 97 {
            5 => f64::NAN,
            9 => f64::NEG_INFINITY,
            13 => -0.0,
            _ => (v as f64 * 0.731).sin() * 1e3 / (1.0 + (v % 7) as f64),
        })
        .collect();
    for width in [1usize, 3, 17, 128] {
        let mean: Vec<f64> = (0..width).map(|k| k as f64 * 0.25 - 1.0).collect();
        let std: Vec<f64> = (0..width).map(|k| 0.1 + k as f64 * 0.3).collect();
        let take = raw.len() / width * width;
        let mut wide: Vec<f32> = raw[..take].iter().map(|&v| v as f32).collect();
        let mut base = wide.clone();
        let a = RowAffine::new(&mean, &std, |v| v as f32);
        a.apply(&mut wide);
        a.apply_here(&mut base);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&wide), bits(&base), "f32, width {width}");
        let mut wide: Vec<f64> = raw[..take].to_vec();
        let mut base = wide.clone();
        let a = RowAffine::new(&mean, &std, |v| v);
        a.apply(&mut wide);
        a.apply_here(&mut base);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&wide), bits(&base), "f64, width {width}");
    }
}
