//! Type names users write in configs (`float32`, `int64`, …) and their Arrow types.

use std::fmt;
use std::str::FromStr;

use arrow::datatypes::{DataType, TimeUnit};
use serde::Deserialize;
use serde::de::{self, Deserializer};

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

impl<'de> Deserialize<'de> for DataTypeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}
