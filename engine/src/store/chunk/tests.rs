//! Tests of `chunk`.

use super::*;

impl RowFilter {
    /// The rows of `chunk` that may match ([`RowFilter::pick`]) as one batch; `None`
    /// when no row can match.
    fn narrow(&self, chunk: &Chunk, projection: Option<&[usize]>) -> Option<RecordBatch> {
        match self.pick(chunk, projection) {
            Pick::Nothing => None,
            Pick::Whole(b) => Some(b),
            Pick::Rows(b, rows) => {
                let rows: Vec<(usize, usize)> = rows.iter().map(|r| (0, *r as usize)).collect();
                Some(gather(&[b], &rows).unwrap())
            }
        }
    }
}
use datafusion::arrow::array::{Float64Array, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{Field, Schema};

fn chunk(devices: &[Option<&str>], ts: &[i64]) -> Chunk {
    let schema = Arc::new(Schema::new(vec![
        Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("device", DataType::Utf8, true),
        Field::new("temp", DataType::Float64, true),
    ]));
    let temps: Vec<f64> = (0..ts.len()).map(|i| i as f64).collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(TimestampMicrosecondArray::from(ts.to_vec())),
            Arc::new(StringArray::from(devices.to_vec())),
            Arc::new(Float64Array::from(temps)),
        ],
    )
    .unwrap();
    Chunk::sealed(batch)
}

fn temps_of(b: &RecordBatch, col: usize) -> Vec<f64> {
    let a = b
        .column(col)
        .as_primitive::<datafusion::arrow::datatypes::Float64Type>();
    a.values().to_vec()
}

fn temps(b: &RecordBatch) -> Vec<f64> {
    temps_of(b, 2)
}

#[test]
fn equality_takes_only_the_matching_rows() {
    let c = chunk(
        &[Some("a"), Some("b"), None, Some("a"), Some("c")],
        &[1, 2, 3, 4, 5],
    );
    let f = |values: &[&str]| RowFilter {
        equal: vec![(1, values.iter().map(|v| v.to_string()).collect())],
        time: vec![],
        value: vec![],
    };
    assert_eq!(temps(&f(&["a"]).narrow(&c, None).unwrap()), vec![0.0, 3.0]);
    assert_eq!(
        temps(&f(&["c", "a"]).narrow(&c, None).unwrap()),
        vec![0.0, 3.0, 4.0]
    );
    assert!(f(&["z"]).narrow(&c, None).is_none());
    // Projected, down to no column at all (a count): still the matching rows.
    let only_temp = f(&["a"]).narrow(&c, Some(&[2])).unwrap();
    assert_eq!(
        (only_temp.num_columns(), temps_of(&only_temp, 0)),
        (1, vec![0.0, 3.0])
    );
    assert_eq!(f(&["a"]).narrow(&c, Some(&[])).unwrap().num_rows(), 2);
    // A non-string column is not indexed: the chunk is read whole.
    let on_temp = RowFilter {
        equal: vec![(2, vec!["1".into()])],
        time: vec![],
        value: vec![],
    };
    assert_eq!(on_temp.narrow(&c, None).unwrap().num_rows(), 5);
    // Rows still changing are never narrowed.
    let plain = Chunk::plain(c.batch.clone());
    assert_eq!(f(&["z"]).narrow(&plain, None).unwrap().num_rows(), 5);
}

#[test]
fn time_bounds_skip_chunks_outside_them() {
    let c = chunk(&[Some("a"), Some("b")], &[100, 200]);
    let f = |lo, hi| RowFilter {
        equal: vec![],
        time: vec![(0, lo, hi)],
        value: vec![],
    };
    assert!(f(201, i64::MAX).narrow(&c, None).is_none());
    assert!(f(i64::MIN, 99).narrow(&c, None).is_none());
    assert_eq!(f(200, 300).narrow(&c, None).unwrap().num_rows(), 2);
    // Both kinds together: in range, then the device.
    let both = RowFilter {
        equal: vec![(1, vec!["b".into()])],
        time: vec![(0, 150, 250)],
        value: vec![],
    };
    assert_eq!(temps(&both.narrow(&c, None).unwrap()), vec![1.0]);
}

#[test]
fn number_bounds_skip_chunks_their_synopsis_rules_out() {
    // temps 0..=4; device a holds 0, 3; b holds 1, 4.
    let c = chunk(
        &[Some("a"), Some("b"), None, Some("a"), Some("b")],
        &[1, 2, 3, 4, 5],
    );
    let f = |device: Option<&str>, op, v: f64| RowFilter {
        equal: device
            .map(|d| (1, vec![d.to_string()]))
            .into_iter()
            .collect(),
        time: vec![],
        value: vec![(2, op, Num::Float(v))],
    };
    let skipped = |f: RowFilter| f.narrow(&c, None).is_none();
    // Over the whole chunk.
    assert!(skipped(f(None, Operator::Lt, -0.5)));
    // Between zeros no decision: the synopsis does not tell -0.0 from 0.0.
    assert!(!skipped(f(None, Operator::Lt, 0.0)));
    assert!(!skipped(f(None, Operator::LtEq, 0.0)));
    assert!(skipped(f(Some("b"), Operator::Lt, 1.0)));
    assert!(!skipped(f(Some("b"), Operator::LtEq, 1.0)));
    assert!(skipped(f(None, Operator::Gt, 4.0)));
    assert!(!skipped(f(None, Operator::GtEq, 4.0)));
    assert!(skipped(f(None, Operator::Eq, 4.5)));
    // Over one device's rows: a holds 0 and 3 only.
    assert!(skipped(f(Some("a"), Operator::Gt, 3.0)));
    assert_eq!(
        temps(&f(Some("a"), Operator::GtEq, 3.0).narrow(&c, None).unwrap()),
        vec![0.0, 3.0]
    );
    assert!(!skipped(f(Some("b"), Operator::Gt, 3.0)));
    assert!(skipped(f(Some("z"), Operator::Gt, -1.0)));
}

#[test]
fn many_distinct_values_are_not_indexed() {
    let names: Vec<String> = (0..MIN_DISTINCT + 1).map(|i| format!("id-{i}")).collect();
    let devices: Vec<Option<&str>> = names.iter().map(|s| Some(s.as_str())).collect();
    let ts: Vec<i64> = (0..devices.len() as i64).collect();
    let c = chunk(&devices, &ts);
    let f = RowFilter {
        equal: vec![(1, vec!["id-3".into()])],
        time: vec![],
        value: vec![],
    };
    // Not indexed: all rows pass on, the filter above the scan picks.
    assert_eq!(f.narrow(&c, None).unwrap().num_rows(), devices.len());
}

#[test]
fn intersection_of_ascending_lists() {
    assert_eq!(intersect(&[1, 3, 5, 7], &[2, 3, 7, 9]), vec![3, 7]);
    assert!(intersect(&[], &[1]).is_empty());
}

/// A `GROUP BY` filtered by a number comparison groups a sealed chunk's rows only within
/// the answer's budget, keeps what it grouped, and answers from that next time whatever
/// the budget; another comparison is grouped afresh.
#[test]
fn filtered_groups_are_kept_within_a_budget() {
    use crate::query::groups::{Answer, GroupKey};
    // temps 0..=4; device a holds 0, 3; b holds 1, 4; the third row has no device.
    let c = chunk(
        &[Some("a"), Some("b"), None, Some("a"), Some("b")],
        &[1, 2, 3, 4, 5],
    );
    let f = |v: f64| RowFilter {
        equal: vec![],
        time: vec![],
        value: vec![(2, Operator::Gt, Num::Float(v))],
    };
    let answer = |budget: u64| {
        let mut a = Answer::new(vec![GroupKey::Column(1)], vec![2]);
        a.budget = budget;
        a
    };
    let rows_by_key = |a: &Answer| {
        let mut out: Vec<(String, u64)> = (a.groups.iter())
            .map(|(k, (n, _))| (format!("{k:?}"), *n))
            .collect();
        out.sort();
        out
    };
    // Over budget: nothing added, and it says so.
    let mut a = answer(4);
    assert!(c.groups_into(&mut a, &f(0.5)).is_none());
    assert!(a.over_budget && a.groups.is_empty());
    // Within it: grouped (temps 1, 3, 4: b twice, a once; the NULL device's 2 too).
    let mut a = answer(5);
    c.groups_into(&mut a, &f(0.5)).unwrap();
    let grouped = rows_by_key(&a);
    assert_eq!(grouped.iter().map(|g| g.1).sum::<u64>(), 4, "{grouped:?}");
    // Kept: the same again needs no budget.
    let mut a = answer(0);
    c.groups_into(&mut a, &f(0.5)).unwrap();
    assert!(!a.over_budget);
    assert_eq!(rows_by_key(&a), grouped);
    // Another comparison is not the kept one.
    let mut a = answer(0);
    assert!(c.groups_into(&mut a, &f(3.5)).is_none());
    assert!(a.over_budget);
}
