//! Unit tests of the decoders: forms each accepts, and errors naming line and column.

use super::mapping::JsonMapping;
use super::testutil::{table_of, with_mapping};
use super::*;
use crate::types::ColumnType as T;

fn table() -> TableDef {
    table_of(
        1,
        &[
            ("ts", T::Timestamp, true),
            ("device", T::String, true),
            ("temp", T::Float64, true),
            ("n", T::Int8, false),
        ],
    )
}

#[test]
fn csv_rows_and_errors() {
    let t = table();
    let rows = decode(
        &t,
        Format::Csv,
        b"2016-01-31 13:45:00,\"a,b\",1.5,3\n\n2016-01-31T13:45:01Z,c,,",
        0,
    )
    .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0][1], Value::Str("a,b".into()));
    assert_eq!(rows[1][2], Value::Null);
    assert_eq!(rows[1][3], Value::Int(0), "NOT NULL gets its default");
    let err = decode(
        &t,
        Format::Csv,
        b"2016-01-31 13:45:00,a,1.5,3\n2016-01-31 13:45:00,a,hot,3",
        0,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 2, column 'temp': 'hot' is not a number"
    );
    let err = decode(&t, Format::Csv, b"2016-01-31 13:45:00,a,1.5,300", 0).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("line 1, column 'n': 300 is out of range"),
        "{err}"
    );
    let err = decode(&t, Format::Csv, b"1,2", 0).unwrap_err();
    assert!(err.to_string().contains("expected 4 fields"), "{err}");
}

#[test]
fn json_forms() {
    let t = table();
    let one = decode(
        &t,
        Format::Json,
        br#"{"ts":"2016-01-31 13:45:00","device":"d1","temp":20.5}"#,
        0,
    )
    .unwrap();
    assert_eq!(one[0][2], Value::Float(20.5));
    let arr = decode(&t, Format::Json, br#"[{"device":"a"},{"device":"b"}]"#, 42).unwrap();
    assert_eq!(arr.len(), 2);
    assert_eq!(
        arr[0][0],
        Value::Timestamp(42),
        "missing time takes arrival time"
    );
    let lines = decode(
        &t,
        Format::Json,
        b"{\"device\":\"a\"}\n{\"device\":\"b\",\"temp\":\"x\"}\n",
        0,
    )
    .unwrap_err();
    assert_eq!(
        lines.to_string(),
        "line 2, column 'temp': 'x' is not a number"
    );
    let unknown = decode(&t, Format::Json, br#"{"devise":"a"}"#, 0).unwrap_err();
    assert!(unknown.to_string().contains("column 'devise'"), "{unknown}");
    assert!(decode(&t, Format::Json, b"{\"device\":", 0).is_err());
    let epoch = decode(&t, Format::Json, br#"{"ts":1454247900}"#, 0).unwrap();
    assert_eq!(epoch[0][0], Value::Timestamp(1_454_247_900_000_000));
}

#[test]
fn json_numbers_read_as_the_nearest_double() {
    // Computed readings printed as the shortest text that reads back as the same double
    // (what `json.dumps` and `JSON.stringify` print): JSON must store the very double the
    // device had, the same one CSV stores for the same text.
    let t = table();
    for text in [
        "21.872415827013562",
        "20.044498412795534",
        "29.748818307431122",
        "24.330617390044594",
        "0.30000000000000004",
        "-39147.67052159493",
        "1e-7",
        "23.7",
    ] {
        let exact: f64 = text.parse().unwrap();
        let json = format!(r#"{{"device":"d","temp":{text}}}"#);
        let row = &decode(&t, Format::Json, json.as_bytes(), 0).unwrap()[0];
        let Value::Float(got) = row[2] else {
            panic!("{text}: {:?}", row[2])
        };
        assert_eq!(got.to_bits(), exact.to_bits(), "{text} read as {got}");
        let csv = format!("2016-01-31 13:45:00,d,{text},");
        let row = &decode(&t, Format::Csv, csv.as_bytes(), 0).unwrap()[0];
        assert_eq!(row[2], Value::Float(exact), "{text} as CSV");
    }
}

#[test]
fn nested_json_into_string_and_null_unknown_fields() {
    let t = table();
    let rows = decode(
        &t,
        Format::Json,
        br#"{"device":{"id":7,"tags":["a"]},"n":2,"extra":null}"#,
        0,
    )
    .unwrap();
    assert_eq!(rows[0][1], Value::Str(r#"{"id":7,"tags":["a"]}"#.into()));
    assert_eq!(rows[0][3], Value::Int(2));
}

#[test]
fn not_null_time_partition_takes_arrival_time() {
    let t = table_of(2, &[("ts", T::Timestamp, false), ("v", T::Float64, true)]);
    let rows = decode(&t, Format::Json, br#"{"v":1}"#, 77).unwrap();
    assert_eq!(rows[0][0], Value::Timestamp(77));
    let rows = decode(&t, Format::Csv, b",1", 78).unwrap();
    assert_eq!(rows[0][0], Value::Timestamp(78));
}

fn site_table() -> TableDef {
    table_of(
        3,
        &[
            ("ts", T::Timestamp, true),
            ("site", T::String, false),
            ("device", T::UInt32, false),
            ("temp", T::Float64, true),
        ],
    )
}

#[test]
fn fixed_columns_fill_every_row_and_win() {
    let t = site_table();
    let fixed = [(1, "plant-a".to_string()), (2, "17".to_string())];
    let csv = decode_message(
        &t,
        Format::Csv,
        b"2026-01-01T00:00:00Z,21.5\n2026-01-01T00:00:01Z,22",
        0,
        &fixed,
    )
    .unwrap();
    assert_eq!(csv.len(), 2);
    assert_eq!(
        csv[1],
        vec![
            Value::Timestamp(1_767_225_601_000_000),
            Value::Str("plant-a".into()),
            Value::UInt(17),
            Value::Float(22.0)
        ]
    );
    // A full-width line also fits; the topic's values win.
    let full = decode_message(
        &t,
        Format::Csv,
        b"2026-01-01T00:00:00Z,other,1,21.5",
        0,
        &fixed,
    )
    .unwrap();
    assert_eq!(full[0][1], Value::Str("plant-a".into()));
    let err = decode_message(&t, Format::Csv, b"21.5", 0, &fixed).unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 1: expected 2 fields (columns ts, temp), found 1"
    );
    let json = decode_message(
        &t,
        Format::Json,
        br#"{"temp":1.5,"device":"not a number"}"#,
        5,
        &fixed,
    )
    .unwrap();
    assert_eq!(json[0][2], Value::UInt(17), "payload value ignored");
    assert_eq!(json[0][0], Value::Timestamp(5));
    let lp = decode_message(&t, Format::LineProtocol, b"m,site=x temp=3", 9, &fixed).unwrap();
    assert_eq!(lp[0][1], Value::Str("plant-a".into()));
    let err = decode_message(
        &t,
        Format::Json,
        br#"{"temp":1}"#,
        0,
        &[(2, "seventeen".into())],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("line 1, column 'device': value from the topic:"),
        "{err}"
    );
    assert!(decode_message(&t, Format::Json, b"{}", 0, &[(9, "x".into())]).is_err());
}

fn lp_table() -> TableDef {
    table_of(
        4,
        &[
            ("time", T::Timestamp, true),
            ("host", T::String, true),
            ("region id", T::String, true),
            ("usage", T::Float64, true),
            ("count", T::Int32, true),
            ("big", T::UInt64, true),
            ("ok", T::Bool, true),
            ("msg", T::String, true),
        ],
    )
}

#[test]
fn line_protocol_forms() {
    let t = lp_table();
    let body = b"# a comment\n\ncpu,host=a\\,b,region\\ id=eu\\=1 usage=0.5,count=3i,big=18446744073709551615u,ok=T,msg=\"say \\\"hi\\\" \\\\ bye\" 1454247900000000123\r\ncpu usage=1 \n";
    let rows = decode(&t, Format::LineProtocol, body, 42).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0],
        vec![
            Value::Timestamp(1_454_247_900_000_000),
            Value::Str("a,b".into()),
            Value::Str("eu=1".into()),
            Value::Float(0.5),
            Value::Int(3),
            Value::UInt(u64::MAX),
            Value::Bool(true),
            Value::Str("say \"hi\" \\ bye".into()),
        ]
    );
    assert_eq!(rows[1][0], Value::Timestamp(42), "no timestamp: arrival");
    assert_eq!(rows[1][3], Value::Float(1.0));
    for b in ["t", "true", "True", "TRUE", "T"] {
        let r = decode(&t, Format::LineProtocol, format!("m ok={b}").as_bytes(), 0).unwrap();
        assert_eq!(r[0][6], Value::Bool(true));
    }
    for b in ["f", "false", "False", "FALSE", "F"] {
        let r = decode(&t, Format::LineProtocol, format!("m ok={b}").as_bytes(), 0).unwrap();
        assert_eq!(r[0][6], Value::Bool(false));
    }
    let r = decode(&t, Format::LineProtocol, b"m usage=2i,count=5u,msg=1.5", 0).unwrap();
    assert_eq!(r[0][3], Value::Float(2.0), "integer into a float column");
    assert_eq!(r[0][4], Value::Int(5));
    assert_eq!(r[0][7], Value::Str("1.5".into()));
}

#[test]
fn line_protocol_errors() {
    let t = lp_table();
    let err = |body: &str| {
        decode(&t, Format::LineProtocol, body.as_bytes(), 0)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err("m usage=1\nm count=1.5"),
        "line 2, column 'count': float 1.5 does not fit column type Int32 (write integers as 1i or 1u)"
    );
    assert_eq!(
        err("m usage=1\n\nm,hots=a usage=1"),
        "line 3, column 'hots': no such column in iot.readings"
    );
    assert_eq!(
        err("m count=3000000000i"),
        "line 1, column 'count': 3000000000 is out of range for Int32 (-2147483648..=2147483647)"
    );
    assert_eq!(
        err("m ok=1i"),
        "line 1, column 'ok': a integer value does not fit column type Bool"
    );
    assert!(err("m").starts_with("line 1: expected a space"));
    assert!(err("m usage=").contains("is not a value"));
    assert!(err("m usage=nan").contains("'nan' is not a value"));
    assert!(err("m msg=\"open").contains("unterminated string"));
    assert!(err("m usage=1 12x").contains("'12x' is not a timestamp"));
    assert!(err("m usage=1 1 2").contains("after the timestamp"));
    assert!(err("m,host usage=1").contains("tag 'host' has no '=value'"));
    assert!(err(",host=a usage=1").contains("missing measurement"));
    assert!(err("# only a comment").contains("no rows"));
    let no_time = table_of(5, &[("id", T::UInt64, false), ("v", T::Float64, true)]);
    let e = decode(&no_time, Format::LineProtocol, b"m id=1u,v=2 123", 0).unwrap_err();
    assert!(e.to_string().contains("has no time column"), "{e}");
    assert_eq!(
        decode(&no_time, Format::LineProtocol, b"m,id=7 v=2", 0).unwrap()[0],
        vec![Value::UInt(7), Value::Float(2.0)]
    );
}

fn sensor_table(id: u64, mapping: &str) -> TableDef {
    with_mapping(
        table_of(
            id,
            &[
                ("ts", T::Timestamp, true),
                ("dev_id", T::String, true),
                ("sensor_id", T::Int32, true),
                ("value", T::Float64, true),
            ],
        ),
        mapping,
    )
}

#[test]
fn json_mapping_flattens_an_array() {
    let t = sensor_table(10, "sensor_id <- '/data/*/0', value <- \"/data/*/1\"");
    let rows = decode(
        &t,
        Format::Json,
        br#"{"dev_id":"id-01","data":[[1,25.1],[2,25.5],[3,25.9]],"other":{"x":1}}"#,
        7,
    )
    .unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[2],
        vec![
            Value::Timestamp(7),
            Value::Str("id-01".into()),
            Value::Int(3),
            Value::Float(25.9)
        ]
    );
    // JSON lines: one document per line, errors name the line and the element.
    let err = decode(
        &t,
        Format::Json,
        b"{\"data\":[[1,2]]}\n{\"data\":[[1,2],[\"x\",3]]}",
        0,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 2, column 'sensor_id': element 1 at '/data/*/0': 'x' is not an integer (Int32)"
    );
    let err = decode(&t, Format::Json, br#"{"data":{"a":1}}"#, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 1, column 'sensor_id': '/data' is not an array (from '/data/*/0')"
    );
    let err = decode(&t, Format::Json, b"{\"data\":[]}\n7", 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 2: expected a JSON object or array, found 7"
    );
    let err = decode(&t, Format::Json, br#"{"dat":[]}"#, 0).unwrap_err();
    assert!(err.to_string().contains("'/data' is missing"), "{err}");
}

#[test]
fn json_mapping_pointers() {
    let t = sensor_table(
        11,
        "ts <- /meta/when, dev_id <- /a~1b/c~0d, sensor_id <- /list/1",
    );
    let rows = decode(
        &t,
        Format::Json,
        br#"[{"meta":{"when":"2016-01-31T13:45:00Z"},"a/b":{"c~d":"x"},"list":[5,6],"value":1.5},{"list":[]}]"#,
        3,
    )
    .unwrap();
    assert_eq!(rows.len(), 2, "a top-level array is a list of documents");
    assert_eq!(
        rows[0],
        vec![
            Value::Timestamp(1_454_247_900_000_000),
            Value::Str("x".into()),
            Value::Int(6),
            Value::Float(1.5)
        ]
    );
    assert_eq!(
        rows[1],
        vec![Value::Timestamp(3), Value::Null, Value::Null, Value::Null]
    );
    // A root-level `*` flattens the top-level array itself.
    let root = sensor_table(12, "sensor_id <- /*/0, value <- /*/1");
    let rows = decode(&root, Format::Json, b"[[1, 2.5], [2, 3.5]]", 0).unwrap();
    assert_eq!(rows[1][2..], [Value::Int(2), Value::Float(3.5)]);
    // The whole document as a string.
    let whole = with_mapping(
        table_of(13, &[("ts", T::Timestamp, true), ("raw", T::String, true)]),
        "raw <- ''",
    );
    let rows = decode(&whole, Format::Json, br#"{"a":[1]}"#, 0).unwrap();
    assert_eq!(rows[0][1], Value::Str(r#"{"a":[1]}"#.into()));
}

#[test]
fn json_mapping_definition_errors() {
    let base = sensor_table(14, "");
    let err = |m: &str| JsonMapping::parse(&base, m).unwrap_err();
    assert_eq!(err("nope <- /a"), "'nope' is not a column of iot.readings");
    assert_eq!(
        err("value <- data"),
        "'data' is not a JSON pointer: it must be empty or start with '/'"
    );
    assert!(err("value <- /a~2").contains("'~' not followed by 0 or 1"));
    assert!(err("value <- /a/*/b/*").contains("more than one '*'"));
    assert_eq!(
        err("value <- /a/*/1, sensor_id <- /b/*/0"),
        "'/b/*/0' and '/a/*/1' flatten different arrays; all '*' of a mapping must stand for the same array"
    );
    assert!(err("value <- /a, value <- /b").contains("mapped twice"));
    assert!(err("value /a").contains("is not 'column <- /json/pointer'"));
    assert!(err("value <- '/a").contains("unterminated quote"));
    assert!(err("value <- /a,,sensor_id <- /b").contains("entry 2 is empty"));
    assert!(JsonMapping::parse(&base, "value <- '/a,b', sensor_id <- /c").is_ok());
    let bad = with_mapping(base.clone(), "value <- x");
    let e = validate_options(&bad).unwrap_err();
    assert!(
        matches!(e, Error::InvalidDefinition { .. })
            && e.to_string().starts_with("invalid json_mappings: "),
        "{e}"
    );
    assert!(validate_options(&with_mapping(base, "  ")).is_ok());
}

#[test]
fn inferred_columns() {
    let cols = infer_json_columns(
        br#"{"ts":"2026-01-01T00:00:00Z","zeta":1,"alpha":1.5,"on":true,"name":"x","nested":{"a":1},"list":[1],"nothing":null,"big":18446744073709551615}"#,
    )
    .unwrap();
    assert_eq!(
        cols,
        vec![
            ("ts".to_string(), T::Timestamp),
            ("zeta".to_string(), T::Int64),
            ("alpha".to_string(), T::Float64),
            ("on".to_string(), T::Bool),
            ("name".to_string(), T::String),
            ("nested".to_string(), T::String),
            ("list".to_string(), T::String),
            ("big".to_string(), T::UInt64),
        ],
        "document order, nulls left out"
    );
    let arr = infer_json_columns(b"[{\"a\":1},{\"b\":2}]").unwrap();
    assert_eq!(arr, vec![("a".to_string(), T::Int64)]);
    let lines = infer_json_columns(b"{\"a\":\"x\"}\n{\"b\":2}").unwrap();
    assert_eq!(lines, vec![("a".to_string(), T::String)]);
    assert!(infer_json_columns(b"42").is_err());
    assert!(infer_json_columns(b"{\"a\":").is_err());
    assert!(infer_json_columns(b"").is_err());
}

#[test]
fn format_names() {
    assert_eq!(Format::from_name("LP"), Some(Format::LineProtocol));
    assert_eq!(Format::from_name("json"), Some(Format::Json));
    assert_eq!(Format::from_name("xml"), None);
}

#[test]
fn sniffing() {
    assert_eq!(Format::sniff(b" {\"a\":1}"), Format::Json);
    assert_eq!(Format::sniff(b"[1]"), Format::Json);
    assert_eq!(Format::sniff(b"1,2,\"x y\""), Format::Csv);
    assert_eq!(
        Format::sniff(b"cpu,host=a usage=1.5 1700000000000000000"),
        Format::LineProtocol
    );
    assert_eq!(Format::sniff(b"2016-01-01 00:00:00,1,2.5"), Format::Csv);
}
