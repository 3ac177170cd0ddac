//! The Sparkplug B payload, as Eclipse Tahu's `sparkplug_b.proto` defines it, in `prost`'s
//! derive form: the fields Sluice reads. Fields left out (metric metadata, property sets,
//! data sets, templates, extensions) are skipped by the decoder as unknown fields.

use prost::Message;

/// `org.eclipse.tahu.protobuf.Payload`.
#[derive(Clone, PartialEq, Message)]
pub struct Payload {
    /// Milliseconds since the epoch, UTC.
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
    /// 0-255, one more per message of an edge node.
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
}

/// `Payload.Metric`.
#[derive(Clone, PartialEq, Message)]
pub struct Metric {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(uint64, optional, tag = "2")]
    pub alias: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    /// A [`datatype_name`] number.
    #[prost(uint32, optional, tag = "4")]
    pub datatype: Option<u32>,
    #[prost(bool, optional, tag = "5")]
    pub is_historical: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub is_null: Option<bool>,
    #[prost(oneof = "Value", tags = "10, 11, 12, 13, 14, 15, 16")]
    pub value: Option<Value>,
}

/// `Payload.Metric.value`: the scalar kinds.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    /// Int8/16/32 (two's complement in 32 bits) and UInt8/16/32.
    #[prost(uint32, tag = "10")]
    Int(u32),
    /// Int64 (two's complement), UInt64 and DateTime (milliseconds).
    #[prost(uint64, tag = "11")]
    Long(u64),
    #[prost(float, tag = "12")]
    Float(f32),
    #[prost(double, tag = "13")]
    Double(f64),
    #[prost(bool, tag = "14")]
    Boolean(bool),
    /// String, Text and UUID.
    #[prost(string, tag = "15")]
    String(String),
    /// Bytes and File.
    #[prost(bytes = "vec", tag = "16")]
    Bytes(Vec<u8>),
}

/// Tahu's name of a `DataType` number.
pub fn datatype_name(n: u32) -> &'static str {
    const NAMES: [&str; 35] = [
        "Unknown",
        "Int8",
        "Int16",
        "Int32",
        "Int64",
        "UInt8",
        "UInt16",
        "UInt32",
        "UInt64",
        "Float",
        "Double",
        "Boolean",
        "String",
        "DateTime",
        "Text",
        "UUID",
        "DataSet",
        "Bytes",
        "File",
        "Template",
        "PropertySet",
        "PropertySetList",
        "Int8Array",
        "Int16Array",
        "Int32Array",
        "Int64Array",
        "UInt8Array",
        "UInt16Array",
        "UInt32Array",
        "UInt64Array",
        "FloatArray",
        "DoubleArray",
        "BooleanArray",
        "StringArray",
        "DateTimeArray",
    ];
    NAMES.get(n as usize).copied().unwrap_or("Unknown")
}

/// The NCMD payload that asks an edge node to publish its BIRTH messages again.
pub fn rebirth_request(now_ms: u64) -> Vec<u8> {
    Payload {
        timestamp: Some(now_ms),
        metrics: vec![Metric {
            name: Some("Node Control/Rebirth".into()),
            alias: None,
            timestamp: Some(now_ms),
            datatype: Some(11),
            is_historical: None,
            is_null: None,
            value: Some(Value::Boolean(true)),
        }],
        seq: None,
    }
    .encode_to_vec()
}
