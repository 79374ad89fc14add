//! Type names users write in configs (`float32`, `int64`, …) and their Arrow types.

use std::fmt;
use std::str::FromStr;

use arrow::datatypes::{DataType, TimeUnit};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// A scalar Arrow type named the way configs spell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataTypeName {
    name: String,
    data_type: DataType,
}

/// Accepted spellings, in the order listed in messages.
pub const TYPE_NAMES: &[&str] = &[
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "string",
    "large_string",
    "binary",
    "date32",
    "timestamp_ms",
    "timestamp_us",
];

impl DataTypeName {
    /// The Arrow type.
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }
}

impl fmt::Display for DataTypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl FromStr for DataTypeName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let data_type = match s.trim().to_ascii_lowercase().as_str() {
            "bool" | "boolean" => DataType::Boolean,
            "int8" | "i8" => DataType::Int8,
            "int16" | "i16" => DataType::Int16,
            "int32" | "i32" => DataType::Int32,
            "int64" | "i64" => DataType::Int64,
            "uint8" | "u8" => DataType::UInt8,
            "uint16" | "u16" => DataType::UInt16,
            "uint32" | "u32" => DataType::UInt32,
            "uint64" | "u64" => DataType::UInt64,
            "float16" | "f16" | "half" => DataType::Float16,
            "float32" | "f32" | "float" => DataType::Float32,
            "float64" | "f64" | "double" => DataType::Float64,
            "string" | "utf8" | "str" => DataType::Utf8,
            "large_string" | "large_utf8" => DataType::LargeUtf8,
            "binary" | "bytes" => DataType::Binary,
            "date32" | "date" => DataType::Date32,
            "timestamp_ms" => DataType::Timestamp(TimeUnit::Millisecond, None),
            "timestamp_us" => DataType::Timestamp(TimeUnit::Microsecond, None),
            _ => {
                return Err(format!(
                    "unknown type `{s}`, expected one of: {}",
                    TYPE_NAMES.join(", ")
                ));
            }
        };
        Ok(DataTypeName {
            name: s.to_string(),
            data_type,
        })
    }
}

/// Serialized as the name it was written with (for the resume stamp).
impl serde::Serialize for DataTypeName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name)
    }
}

impl<'de> Deserialize<'de> for DataTypeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A column type in a declared schema: a scalar name, `list<T>`, or `fixed_size_list<T, N>`
/// (also written `T[N]`), nesting allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTypeName {
    name: String,
    data_type: DataType,
}

impl FieldTypeName {
    /// The Arrow type.
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }
}

impl fmt::Display for FieldTypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

fn parse_field_type(s: &str) -> Result<DataType, String> {
    let t = s.trim();
    let item = |dt: DataType| std::sync::Arc::new(arrow::datatypes::Field::new("item", dt, true));
    if let Some(inner) = t.strip_suffix(']')
        && let Some(open) = inner.rfind('[')
    {
        let n: i32 = inner[open + 1..]
            .trim()
            .parse()
            .map_err(|_| format!("`{t}`: the length in `[…]` must be a positive integer"))?;
        if n <= 0 {
            return Err(format!("`{t}`: the length in `[…]` must be positive"));
        }
        return Ok(DataType::FixedSizeList(
            item(parse_field_type(&inner[..open])?),
            n,
        ));
    }
    let lower = t.to_ascii_lowercase();
    if let Some(rest) = lower
        .strip_prefix("list<")
        .and_then(|r| r.strip_suffix('>'))
    {
        return Ok(DataType::List(item(parse_field_type(rest)?)));
    }
    if let Some(rest) = lower
        .strip_prefix("fixed_size_list<")
        .and_then(|r| r.strip_suffix('>'))
    {
        let (ty, n) = rest
            .rsplit_once(',')
            .ok_or_else(|| format!("`{t}`: expected `fixed_size_list<TYPE, LENGTH>`"))?;
        return parse_field_type(&format!("{}[{}]", ty.trim(), n.trim()));
    }
    DataTypeName::from_str(t)
        .map(|d| d.data_type)
        .map_err(|e| format!("{e}, `list<T>`, `fixed_size_list<T, N>` or `T[N]`"))
}

impl FromStr for FieldTypeName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(FieldTypeName {
            name: s.to_string(),
            data_type: parse_field_type(s)?,
        })
    }
}

impl<'de> Deserialize<'de> for FieldTypeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A literal value in a config (`fill_null` values).
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Bool(v) => write!(f, "{v}"),
            Literal::Int(v) => write!(f, "{v}"),
            Literal::Float(v) => write!(f, "{v}"),
            Literal::Str(v) => write!(f, "{v:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for Literal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Literal;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, string or boolean")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Literal, E> {
                Ok(Literal::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Literal, E> {
                Ok(Literal::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Literal, E> {
                i64::try_from(v)
                    .map(Literal::Int)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Literal, E> {
                Ok(Literal::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Literal, E> {
                Ok(Literal::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Literal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Literal::Bool(v) => s.serialize_bool(*v),
            Literal::Int(v) => s.serialize_i64(*v),
            Literal::Float(v) => s.serialize_f64(*v),
            Literal::Str(v) => s.serialize_str(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_field_types() {
        let t: FieldTypeName = "float32[4]".parse().unwrap();
        assert!(
            matches!(t.data_type(), DataType::FixedSizeList(f, 4) if f.data_type() == &DataType::Float32)
        );
        let t: FieldTypeName = "fixed_size_list<uint8, 64>".parse().unwrap();
        assert!(matches!(t.data_type(), DataType::FixedSizeList(_, 64)));
        let t: FieldTypeName = "list<int64[2]>".parse().unwrap();
        assert!(
            matches!(t.data_type(), DataType::List(f) if matches!(f.data_type(), DataType::FixedSizeList(_, 2)))
        );
        assert!("float32[0]".parse::<FieldTypeName>().is_err());
        let e = "complex".parse::<FieldTypeName>().unwrap_err();
        assert!(e.contains("fixed_size_list<T, N>"), "{e}");
    }
}
