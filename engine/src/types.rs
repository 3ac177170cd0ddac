//! Column types and values.
//!
//! [`ColumnType`] is what the catalog stores; it maps to one Arrow type. Type names are
//! accepted in standard SQL spelling (`BIGINT`, `DOUBLE`, `VARCHAR`, `TIMESTAMP`) and in
//! JoinBase/ClickHouse spelling (`Int8`..`UInt64`, `Float32`, `String`, `DateTime`), where
//! `Int8` is one byte as in ClickHouse. [`Value`] is one cell of a row on its way to the log.

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use serde::{Deserialize, Serialize};

/// The type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// true/false.
    Bool,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 8-bit integer.
    UInt8,
    /// Unsigned 16-bit integer.
    UInt16,
    /// Unsigned 32-bit integer.
    UInt32,
    /// Unsigned 64-bit integer.
    UInt64,
    /// 32-bit float.
    Float32,
    /// 64-bit float.
    Float64,
    /// UTF-8 text.
    String,
    /// Bytes.
    Binary,
    /// Microseconds since the Unix epoch, UTC.
    Timestamp,
    /// Days since the Unix epoch.
    Date,
}

impl ColumnType {
    /// Parses a type name (case-insensitive). `args` are the numbers in parentheses, if any
    /// (`VARCHAR(32)`, `DateTime64(3)`), accepted and ignored where they do not change the type.
    pub fn parse(name: &str) -> Option<Self> {
        use ColumnType::*;
        Some(match name.to_ascii_lowercase().as_str() {
            "bool" | "boolean" => Bool,
            "int8" | "tinyint" => Int8,
            "int16" | "smallint" => Int16,
            "int32" | "int" | "integer" => Int32,
            "int64" | "bigint" => Int64,
            "uint8" | "tinyint unsigned" => UInt8,
            "uint16" | "smallint unsigned" => UInt16,
            "uint32" | "int unsigned" | "integer unsigned" => UInt32,
            "uint64" | "bigint unsigned" => UInt64,
            "float32" | "float" | "real" => Float32,
            "float64" | "double" | "double precision" => Float64,
            "string" | "varchar" | "text" | "char" | "character varying" | "character"
            | "nvarchar" => String,
            "blob" | "binary" | "varbinary" | "bytea" | "bytes" => Binary,
            "datetime"
            | "datetime64"
            | "timestamp"
            | "timestamptz"
            | "timestamp with time zone"
            | "timestamp without time zone" => Timestamp,
            "date" | "date32" => Date,
            _ => return None,
        })
    }

    /// The Arrow type used in buffers and Parquet.
    pub fn arrow(self) -> DataType {
        use ColumnType::*;
        match self {
            Bool => DataType::Boolean,
            Int8 => DataType::Int8,
            Int16 => DataType::Int16,
            Int32 => DataType::Int32,
            Int64 => DataType::Int64,
            UInt8 => DataType::UInt8,
            UInt16 => DataType::UInt16,
            UInt32 => DataType::UInt32,
            UInt64 => DataType::UInt64,
            Float32 => DataType::Float32,
            Float64 => DataType::Float64,
            String => DataType::Utf8,
            Binary => DataType::Binary,
            Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            Date => DataType::Date32,
        }
    }

    /// The name shown by DESCRIBE (JoinBase spelling).
    pub fn name(self) -> &'static str {
        use ColumnType::*;
        match self {
            Bool => "Bool",
            Int8 => "Int8",
            Int16 => "Int16",
            Int32 => "Int32",
            Int64 => "Int64",
            UInt8 => "UInt8",
            UInt16 => "UInt16",
            UInt32 => "UInt32",
            UInt64 => "UInt64",
            Float32 => "Float32",
            Float64 => "Float64",
            String => "String",
            Binary => "Blob",
            Timestamp => "DateTime",
            Date => "Date",
        }
    }

    /// The value a NOT NULL column takes when a row omits it (JoinBase's defaults).
    pub fn default_value(self) -> Value {
        use ColumnType::*;
        match self {
            Bool => Value::Bool(false),
            Int8 | Int16 | Int32 | Int64 => Value::Int(0),
            UInt8 | UInt16 | UInt32 | UInt64 => Value::UInt(0),
            Float32 | Float64 => Value::Float(0.0),
            String => Value::Str(std::string::String::new()),
            Binary => Value::Bytes(Vec::new()),
            Timestamp => Value::Timestamp(0),
            Date => Value::Date(0),
        }
    }

    /// True for types that carry a point in time.
    pub fn is_time(self) -> bool {
        matches!(self, ColumnType::Timestamp | ColumnType::Date)
    }
}

/// One cell, already converted to its column's type by the decoder.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Bool column.
    Bool(bool),
    /// Signed integer column of any width (range-checked on decode).
    Int(i64),
    /// Unsigned integer column of any width (range-checked on decode).
    UInt(u64),
    /// Float column of either width.
    Float(f64),
    /// String column.
    Str(String),
    /// Binary column.
    Bytes(Vec<u8>),
    /// Timestamp column: microseconds since the epoch, UTC.
    Timestamp(i64),
    /// Date column: days since the epoch.
    Date(i32),
}

impl Value {
    /// Approximate memory taken in a buffer, for flush accounting.
    pub fn size(&self) -> usize {
        match self {
            Value::Str(s) => s.len() + 4,
            Value::Bytes(b) => b.len() + 4,
            _ => 8,
        }
    }

    /// Microseconds since the epoch, for time-typed values.
    pub fn as_micros(&self) -> Option<i64> {
        match self {
            Value::Timestamp(t) => Some(*t),
            Value::Date(d) => i64::from(*d).checked_mul(86_400_000_000),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings() {
        assert_eq!(ColumnType::parse("Int8"), Some(ColumnType::Int8));
        assert_eq!(ColumnType::parse("BIGINT"), Some(ColumnType::Int64));
        assert_eq!(ColumnType::parse("DateTime"), Some(ColumnType::Timestamp));
        assert_eq!(
            ColumnType::parse("double precision"),
            Some(ColumnType::Float64)
        );
        assert_eq!(ColumnType::parse("String"), Some(ColumnType::String));
        assert_eq!(ColumnType::parse("UInt64"), Some(ColumnType::UInt64));
        assert_eq!(ColumnType::parse("Float32"), Some(ColumnType::Float32));
        assert_eq!(ColumnType::parse("Bool"), Some(ColumnType::Bool));
        assert_eq!(ColumnType::parse("decimalish"), None);
    }
}
