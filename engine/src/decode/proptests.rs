//! Property tests: every payload decoder reads back what an encoder of its format writes,
//! and no input makes one panic.

use super::testutil::table_of;
use super::*;
use crate::types::ColumnType as T;
use proptest::prelude::*;

fn table() -> TableDef {
    table_of(
        100,
        &[
            ("ts", T::Timestamp, true),
            ("device", T::String, true),
            ("temp", T::Float64, true),
            ("n", T::Int8, false),
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn never_panics_on_bytes(body in proptest::collection::vec(any::<u8>(), 0..200)) {
        for format in [Format::Csv, Format::Json, Format::LineProtocol] {
            let _ = decode(&table(), format, &body, 0);
        }
    }

    #[test]
    fn csv_roundtrips_quoted_strings(s in "[a-z,\" ]{0,20}") {
        let line = format!("2016-01-31 13:45:00,\"{}\",1,1", s.replace('"', "\"\""));
        let rows = decode(&table(), Format::Csv, line.as_bytes(), 0).unwrap();
        prop_assert_eq!(&rows[0][1], &Value::Str(s));
    }
}
