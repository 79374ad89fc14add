//! The `filter` predicate language: a SQL expression (parsed by `sqlparser`), compiled against
//! the input schema and evaluated with Arrow kernels.
//!
//! Semantics follow SQL: comparisons with NULL are NULL, `AND`/`OR` use three-valued logic,
//! and the filter keeps only rows where the predicate is TRUE. Floats compare as IEEE 754
//! numbers (as numpy, pandas and torch do): every comparison with NaN is FALSE except `<>`,
//! which is TRUE, and `-0 = 0`. (Arrow's comparison kernels order floats totally instead —
//! NaN above every number and equal to itself, -0 below 0 — so floats do not go through them.)

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Datum, PrimitiveArray, RecordBatch, Scalar, UInt32Array,
};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::compute::kernels::{boolean, cmp, numeric};
use arrow::compute::{cast, is_not_null, is_null};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float16Type, Float32Type, Float64Type, Schema,
};
use arrow::error::ArrowError;
use sqlparser::ast::{self, BinaryOperator, UnaryOperator, Value};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

/// A compiled expression.
#[derive(Debug, Clone)]
pub(crate) enum Expr {
    Column(usize, DataType),
    /// A one-element array.
    Literal(ArrayRef),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    IsNull(Box<Expr>, bool),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum CmpOp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// A value during evaluation: a column-length array or a one-element scalar.
enum Value2 {
    Array(ArrayRef),
    Scalar(ArrayRef),
}

impl Value2 {
    fn array(&self) -> &ArrayRef {
        match self {
            Value2::Array(a) | Value2::Scalar(a) => a,
        }
    }
    fn datum(&self) -> Box<dyn Datum + '_> {
        match self {
            Value2::Array(a) => Box::new(a),
            Value2::Scalar(a) => Box::new(Scalar::new(a)),
        }
    }
    fn into_array(self, len: usize) -> Result<ArrayRef, ArrowError> {
        match self {
            Value2::Array(a) => Ok(a),
            Value2::Scalar(a) => {
                arrow::compute::take(&a, &UInt32Array::from(vec![0u32; len]), None)
            }
        }
    }
    fn map(
        self,
        f: impl FnOnce(&ArrayRef) -> Result<ArrayRef, ArrowError>,
    ) -> Result<Value2, ArrowError> {
        Ok(match self {
            Value2::Array(a) => Value2::Array(f(&a)?),
            Value2::Scalar(a) => Value2::Scalar(f(&a)?),
        })
    }
}

/// Parses and type-checks `text` against `schema`.
pub(crate) fn compile(text: &str, schema: &Schema) -> Result<Expr, String> {
    let parsed = Parser::new(&GenericDialect {})
        .try_with_sql(text)
        .and_then(|mut p| {
            let e = p.parse_expr()?;
            p.expect_token(&sqlparser::tokenizer::Token::EOF)?;
            Ok(e)
        })
        .map_err(|e| format!("invalid predicate `{text}`: {e}"))?;
    let expr = convert(&parsed, schema).map_err(|m| format!("predicate `{text}`: {m}"))?;
    match result_type(&expr) {
        DataType::Boolean | DataType::Null => Ok(expr),
        other => Err(format!(
            "predicate `{text}` is {other}, not a boolean condition"
        )),
    }
}

fn result_type(e: &Expr) -> DataType {
    match e {
        Expr::Column(_, t) => t.clone(),
        Expr::Literal(a) => a.data_type().clone(),
        Expr::Cmp(..) | Expr::And(..) | Expr::Or(..) | Expr::Not(_) | Expr::IsNull(..) => {
            DataType::Boolean
        }
        Expr::Arith(_, l, r) => {
            common_type(&result_type(l), &result_type(r)).unwrap_or(DataType::Null)
        }
        Expr::Neg(e) => result_type(e),
    }
}

fn common_type(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::*;
    if a == b {
        return Some(a.clone());
    }
    match (a, b) {
        (Null, t) | (t, Null) => Some(t.clone()),
        (x, y) if x.is_integer() && y.is_integer() => Some(Int64),
        (x, y) if x.is_numeric() && y.is_numeric() => Some(Float64),
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => Some(Utf8),
        _ => None,
    }
}

fn literal(v: &Value) -> Result<ArrayRef, String> {
    use arrow::array::{Float64Array, Int64Array, NullArray, StringArray};
    Ok(match v {
        Value::Number(s, _) => match s.parse::<i64>() {
            Ok(i) => Arc::new(Int64Array::from(vec![i])),
            Err(_) => Arc::new(Float64Array::from(vec![
                s.parse::<f64>()
                    .map_err(|e| format!("bad number {s}: {e}"))?,
            ])),
        },
        Value::SingleQuotedString(s) => Arc::new(StringArray::from(vec![s.as_str()])),
        Value::Boolean(b) => Arc::new(BooleanArray::from(vec![*b])),
        Value::Null => Arc::new(NullArray::new(1)),
        other => return Err(format!("unsupported literal `{other}`")),
    })
}

fn convert(e: &ast::Expr, schema: &Schema) -> Result<Expr, String> {
    let b = |e: &ast::Expr| convert(e, schema).map(Box::new);
    Ok(match e {
        ast::Expr::Identifier(id) => column(&id.value, schema)?,
        ast::Expr::CompoundIdentifier(parts) => {
            let name: Vec<&str> = parts.iter().map(|p| p.value.as_str()).collect();
            column(&name.join("."), schema)?
        }
        ast::Expr::Value(v) => Expr::Literal(literal(&v.value)?),
        ast::Expr::Nested(inner) => convert(inner, schema)?,
        ast::Expr::IsNull(inner) => Expr::IsNull(b(inner)?, false),
        ast::Expr::IsNotNull(inner) => Expr::IsNull(b(inner)?, true),
        ast::Expr::UnaryOp { op, expr } => match op {
            UnaryOperator::Not => Expr::Not(b(expr)?),
            UnaryOperator::Minus => Expr::Neg(b(expr)?),
            UnaryOperator::Plus => convert(expr, schema)?,
            other => return Err(format!("unsupported operator `{other}`")),
        },
        ast::Expr::BinaryOp { left, op, right } => {
            let (l, r) = (b(left)?, b(right)?);
            let cmp = |op| check_cmp(op, l.clone(), r.clone());
            match op {
                BinaryOperator::And => Expr::And(l, r),
                BinaryOperator::Or => Expr::Or(l, r),
                BinaryOperator::Eq => cmp(CmpOp::Eq)?,
                BinaryOperator::NotEq => cmp(CmpOp::NotEq)?,
                BinaryOperator::Lt => cmp(CmpOp::Lt)?,
                BinaryOperator::LtEq => cmp(CmpOp::LtEq)?,
                BinaryOperator::Gt => cmp(CmpOp::Gt)?,
                BinaryOperator::GtEq => cmp(CmpOp::GtEq)?,
                BinaryOperator::Plus => arith(ArithOp::Add, l, r)?,
                BinaryOperator::Minus => arith(ArithOp::Sub, l, r)?,
                BinaryOperator::Multiply => arith(ArithOp::Mul, l, r)?,
                BinaryOperator::Divide => arith(ArithOp::Div, l, r)?,
                BinaryOperator::Modulo => arith(ArithOp::Rem, l, r)?,
                other => return Err(format!("unsupported operator `{other}`")),
            }
        }
        ast::Expr::InList {
            expr,
            list,
            negated,
        } => {
            let target = b(expr)?;
            let mut acc: Option<Expr> = None;
            for item in list {
                let eq = check_cmp(CmpOp::Eq, target.clone(), b(item)?)?;
                acc = Some(match acc {
                    None => eq,
                    Some(prev) => Expr::Or(Box::new(prev), Box::new(eq)),
                });
            }
            let any = acc.ok_or("empty IN list")?;
            if *negated {
                Expr::Not(Box::new(any))
            } else {
                any
            }
        }
        ast::Expr::Between {
            expr,
            negated,
            low,
            high,
        } => {
            let target = b(expr)?;
            let both = Expr::And(
                Box::new(check_cmp(CmpOp::GtEq, target.clone(), b(low)?)?),
                Box::new(check_cmp(CmpOp::LtEq, target, b(high)?)?),
            );
            if *negated {
                Expr::Not(Box::new(both))
            } else {
                both
            }
        }
        other => return Err(format!("unsupported expression `{other}`")),
    })
}

fn column(name: &str, schema: &Schema) -> Result<Expr, String> {
    match schema.index_of(name) {
        Ok(i) => Ok(Expr::Column(i, schema.field(i).data_type().clone())),
        Err(_) => Err(super::no_such_column(
            name,
            &super::column_names(schema),
            " (quote names with \"double quotes\", strings with 'single quotes')",
        )),
    }
}

fn check_cmp(op: CmpOp, l: Box<Expr>, r: Box<Expr>) -> Result<Expr, String> {
    let (lt, rt) = (result_type(&l), result_type(&r));
    if common_type(&lt, &rt).is_none() {
        return Err(format!("cannot compare {lt} with {rt}"));
    }
    Ok(Expr::Cmp(op, l, r))
}

fn arith(op: ArithOp, l: Box<Expr>, r: Box<Expr>) -> Result<Expr, String> {
    let (lt, rt) = (result_type(&l), result_type(&r));
    match common_type(&lt, &rt) {
        Some(t) if t.is_numeric() => Ok(Expr::Arith(op, l, r)),
        _ => Err(format!("arithmetic needs numbers, got {lt} and {rt}")),
    }
}

/// Brings both operands to one type. A literal that converts exactly to the other side's type
/// is converted (so `int32_col < 5` never casts the column).
fn coerce(l: Value2, r: Value2) -> Result<(Value2, Value2), ArrowError> {
    let (lt, rt) = (l.array().data_type().clone(), r.array().data_type().clone());
    if lt == rt {
        return Ok((l, r));
    }
    let exact = |s: &ArrayRef, to: &DataType| -> Option<ArrayRef> {
        let c = cast(s, to).ok()?;
        let back = cast(&c, s.data_type()).ok()?;
        (c.is_valid(0) == s.is_valid(0) && back.as_ref() == s.as_ref()).then_some(c)
    };
    match (&l, &r) {
        (Value2::Array(_), Value2::Scalar(s)) => {
            if let Some(c) = exact(s, &lt) {
                return Ok((l, Value2::Scalar(c)));
            }
        }
        (Value2::Scalar(s), Value2::Array(_)) => {
            if let Some(c) = exact(s, &rt) {
                return Ok((Value2::Scalar(c), r));
            }
        }
        _ => {}
    }
    let t = common_type(&lt, &rt)
        .ok_or_else(|| ArrowError::InvalidArgumentError(format!("cannot combine {lt} and {rt}")))?;
    Ok((l.map(|a| cast(a, &t))?, r.map(|a| cast(a, &t))?))
}

impl Expr {
    /// Evaluates to a boolean mask of `batch.num_rows()` rows.
    pub(crate) fn evaluate_mask(&self, batch: &RecordBatch) -> Result<BooleanArray, ArrowError> {
        let v = self.eval(batch)?.into_array(batch.num_rows())?;
        let v = if v.data_type() == &DataType::Null {
            cast(&v, &DataType::Boolean)?
        } else {
            v
        };
        Ok(v.as_boolean().clone())
    }

    fn eval(&self, batch: &RecordBatch) -> Result<Value2, ArrowError> {
        let n = batch.num_rows();
        Ok(match self {
            Expr::Column(i, _) => Value2::Array(batch.column(*i).clone()),
            Expr::Literal(a) => Value2::Scalar(a.clone()),
            Expr::Cmp(op, l, r) => {
                let (l, r) = coerce(l.eval(batch)?, r.eval(batch)?)?;
                let scalar = matches!((&l, &r), (Value2::Scalar(_), Value2::Scalar(_)));
                let out = match l.array().data_type() {
                    DataType::Float16 => float_cmp::<Float16Type>(*op, &l, &r)?,
                    DataType::Float32 => float_cmp::<Float32Type>(*op, &l, &r)?,
                    DataType::Float64 => float_cmp::<Float64Type>(*op, &l, &r)?,
                    _ => {
                        let (ld, rd) = (l.datum(), r.datum());
                        match op {
                            CmpOp::Eq => cmp::eq(&*ld, &*rd),
                            CmpOp::NotEq => cmp::neq(&*ld, &*rd),
                            CmpOp::Lt => cmp::lt(&*ld, &*rd),
                            CmpOp::LtEq => cmp::lt_eq(&*ld, &*rd),
                            CmpOp::Gt => cmp::gt(&*ld, &*rd),
                            CmpOp::GtEq => cmp::gt_eq(&*ld, &*rd),
                        }?
                    }
                };
                let out: ArrayRef = Arc::new(out);
                if scalar {
                    Value2::Scalar(out)
                } else {
                    Value2::Array(out)
                }
            }
            Expr::Arith(op, l, r) => {
                let (l, r) = coerce(l.eval(batch)?, r.eval(batch)?)?;
                let scalar = matches!((&l, &r), (Value2::Scalar(_), Value2::Scalar(_)));
                let (ld, rd) = (l.datum(), r.datum());
                let out = match op {
                    ArithOp::Add => numeric::add(&*ld, &*rd),
                    ArithOp::Sub => numeric::sub(&*ld, &*rd),
                    ArithOp::Mul => numeric::mul(&*ld, &*rd),
                    ArithOp::Div => numeric::div(&*ld, &*rd),
                    ArithOp::Rem => numeric::rem(&*ld, &*rd),
                }?;
                if scalar {
                    Value2::Scalar(out)
                } else {
                    Value2::Array(out)
                }
            }
            Expr::And(l, r) | Expr::Or(l, r) => {
                let la = bool_array(l.eval(batch)?, n)?;
                let ra = bool_array(r.eval(batch)?, n)?;
                let out = if matches!(self, Expr::And(..)) {
                    boolean::and_kleene(&la, &ra)?
                } else {
                    boolean::or_kleene(&la, &ra)?
                };
                Value2::Array(Arc::new(out))
            }
            Expr::Not(e) => Value2::Array(Arc::new(boolean::not(&bool_array(e.eval(batch)?, n)?)?)),
            Expr::Neg(e) => e.eval(batch)?.map(|a| numeric::neg(a))?,
            Expr::IsNull(e, negated) => {
                let a = e.eval(batch)?.into_array(n)?;
                let out = if *negated {
                    is_not_null(&a)?
                } else {
                    is_null(&a)?
                };
                Value2::Array(Arc::new(out))
            }
        })
    }
}

/// Compares two float operands of one type (after [`coerce`]) with IEEE 754 semantics —
/// Rust's own `<`, `==`, … on the values: any comparison with NaN is false except `!=`, and
/// `-0 == 0`. Null where either side is null, as SQL's comparisons.
fn float_cmp<T: ArrowPrimitiveType>(
    op: CmpOp,
    l: &Value2,
    r: &Value2,
) -> Result<BooleanArray, ArrowError> {
    let (l, r) = (FloatSide::<T>::new(l)?, FloatSide::<T>::new(r)?);
    let len = match (l.scalar, r.scalar) {
        (false, _) => l.array.len(),
        (true, false) => r.array.len(),
        (true, true) => 1,
    };
    let nulls = NullBuffer::union(l.nulls(len).as_ref(), r.nulls(len).as_ref());
    let values = match op {
        CmpOp::Eq => compare(len, &l, &r, |a, b| a == b),
        CmpOp::NotEq => compare(len, &l, &r, |a, b| a != b),
        CmpOp::Lt => compare(len, &l, &r, |a, b| a < b),
        CmpOp::LtEq => compare(len, &l, &r, |a, b| a <= b),
        CmpOp::Gt => compare(len, &l, &r, |a, b| a > b),
        CmpOp::GtEq => compare(len, &l, &r, |a, b| a >= b),
    };
    Ok(BooleanArray::new(values, nulls))
}

/// `f` of the two sides, row by row (values under nulls too: they are masked after).
fn compare<T: ArrowPrimitiveType>(
    len: usize,
    l: &FloatSide<'_, T>,
    r: &FloatSide<'_, T>,
    f: impl Fn(T::Native, T::Native) -> bool,
) -> BooleanBuffer {
    let (lv, rv) = (l.array.values(), r.array.values());
    match (l.scalar, r.scalar) {
        (false, false) => BooleanBuffer::collect_bool(len, |i| f(lv[i], rv[i])),
        (false, true) => BooleanBuffer::collect_bool(len, |i| f(lv[i], rv[0])),
        (true, false) => BooleanBuffer::collect_bool(len, |i| f(lv[0], rv[i])),
        (true, true) => BooleanBuffer::collect_bool(len, |_| f(lv[0], rv[0])),
    }
}

/// One operand of [`float_cmp`]: a column, or a one-value scalar that stands for every row.
struct FloatSide<'a, T: ArrowPrimitiveType> {
    array: &'a PrimitiveArray<T>,
    scalar: bool,
}

impl<'a, T: ArrowPrimitiveType> FloatSide<'a, T> {
    fn new(v: &'a Value2) -> Result<Self, ArrowError> {
        let array = v.array().as_primitive_opt::<T>().ok_or_else(|| {
            ArrowError::InvalidArgumentError(format!(
                "cannot compare {} as {}",
                v.array().data_type(),
                T::DATA_TYPE
            ))
        })?;
        Ok(FloatSide {
            array,
            scalar: matches!(v, Value2::Scalar(_)),
        })
    }

    /// The side's nulls over `len` rows: a null scalar makes every row null.
    fn nulls(&self, len: usize) -> Option<NullBuffer> {
        if self.scalar {
            self.array.is_null(0).then(|| NullBuffer::new_null(len))
        } else {
            self.array.nulls().cloned()
        }
    }
}

fn bool_array(v: Value2, len: usize) -> Result<BooleanArray, ArrowError> {
    let a = v.into_array(len)?;
    let a = if a.data_type() == &DataType::Boolean {
        a
    } else {
        cast(&a, &DataType::Boolean)?
    };
    Ok(a.as_boolean().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float32Array, Int32Array, StringArray};
    use arrow::datatypes::Field;

    fn batch() -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("a", DataType::Int32, true),
                Field::new("b", DataType::Float32, true),
                Field::new("s", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int32Array::from(vec![
                    Some(1),
                    Some(2),
                    None,
                    Some(4),
                    Some(5),
                ])),
                Arc::new(Float32Array::from(vec![0.5, 1.5, 2.5, f32::NAN, 4.5])),
                Arc::new(StringArray::from(vec![
                    Some("x"),
                    Some("y"),
                    Some("x"),
                    None,
                    Some("z"),
                ])),
            ],
        )
        .unwrap()
    }

    fn run(text: &str) -> Vec<Option<bool>> {
        let b = batch();
        let e = compile(text, b.schema().as_ref()).unwrap();
        e.evaluate_mask(&b).unwrap().iter().collect()
    }

    #[test]
    fn comparisons_and_three_valued_logic() {
        assert_eq!(
            run("a < 3"),
            vec![Some(true), Some(true), None, Some(false), Some(false)]
        );
        assert_eq!(
            run("a < 3 OR a IS NULL"),
            vec![Some(true), Some(true), Some(true), Some(false), Some(false)]
        );
        assert_eq!(
            run("NOT (a >= 2) AND s = 'x'"),
            vec![Some(true), Some(false), None, Some(false), Some(false)]
        );
        assert_eq!(
            run("a % 2 = 0"),
            vec![Some(false), Some(true), None, Some(true), Some(false)]
        );
        // Row 3 is NaN > 4: false (IEEE 754; Arrow's total order would say true).
        assert_eq!(
            run("b > a"),
            vec![Some(false), Some(false), None, Some(false), Some(false)]
        );
        assert_eq!(
            run("a IN (1, 5)"),
            vec![Some(true), Some(false), None, Some(false), Some(true)]
        );
        assert_eq!(
            run("a BETWEEN 2 AND 4"),
            vec![Some(false), Some(true), None, Some(true), Some(false)]
        );
        assert_eq!(
            run("a < 2.5"),
            vec![Some(true), Some(true), None, Some(false), Some(false)]
        );
        assert_eq!(
            run("-a < -3"),
            vec![Some(false), Some(false), None, Some(true), Some(true)]
        );
    }

    /// IEEE 754, not Arrow's total order: NaN compares false except `<>`, -0 = 0, nulls
    /// stay null; for float64 and float16 columns and for two scalars.
    #[test]
    fn floats_compare_as_ieee_numbers() {
        use arrow::array::{Float16Array, Float64Array};
        use half::f16;
        let b = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("x", DataType::Float64, true),
                Field::new("h", DataType::Float16, true),
            ])),
            vec![
                Arc::new(Float64Array::from(vec![
                    Some(f64::NAN),
                    Some(f64::INFINITY),
                    Some(-0.0),
                    None,
                ])),
                Arc::new(Float16Array::from(vec![
                    Some(f16::NAN),
                    Some(f16::INFINITY),
                    Some(f16::NEG_ZERO),
                    None,
                ])),
            ],
        )
        .unwrap();
        let run = |text: &str| -> Vec<Option<bool>> {
            let e = compile(text, b.schema().as_ref()).unwrap();
            e.evaluate_mask(&b).unwrap().iter().collect()
        };
        let (t, f) = (Some(true), Some(false));
        for col in ["x", "h"] {
            let cases = [
                ("{c} = 0", [f, f, t, None]),
                ("{c} <> 0", [t, t, f, None]),
                ("{c} < 0", [f, f, f, None]),
                ("{c} <= 0", [f, f, t, None]),
                ("{c} > 0", [f, t, f, None]),
                ("{c} >= 0", [f, t, t, None]),
                ("0 < {c}", [f, t, f, None]),
                ("{c} <> {c}", [t, f, f, None]),
                ("{c} = NULL", [None, None, None, None]),
            ];
            for (text, want) in cases {
                let text = text.replace("{c}", col);
                assert_eq!(run(&text), want, "{text}");
            }
        }
        assert_eq!(run("1.5 < 2.5"), [t, t, t, t]);
        assert_eq!(run("0.0 = -0.0"), [t, t, t, t]);
    }

    #[test]
    fn errors_name_the_problem() {
        let schema = batch().schema();
        let e = compile("nope > 1", &schema).unwrap_err();
        assert!(
            e.contains("column `nope` does not exist; available columns: a, b, s"),
            "{e}"
        );
        let e = compile("a + 1", &schema).unwrap_err();
        assert!(e.contains("not a boolean condition"), "{e}");
        let e = compile("s < 3", &schema).unwrap_err();
        assert!(e.contains("cannot compare Utf8 with Int64"), "{e}");
        let e = compile("a < ", &schema).unwrap_err();
        assert!(e.contains("invalid predicate"), "{e}");
    }
}
