//! Tests of `evaluator`.

use super::*;
use crate::alerts::CmpOp;
use datafusion::arrow::array::Int64Array;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

fn def(condition: Condition) -> AlertDef {
    AlertDef {
        name: "hot".into(),
        query: "SELECT 1".into(),
        database: "default".into(),
        condition,
        interval_ms: 1000,
        publish: true,
        webhook: None,
        owner: None,
    }
}

fn stream(batches: Vec<RecordBatch>) -> datafusion::execution::SendableRecordBatchStream {
    let schema = batches[0].schema();
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::iter(batches.into_iter().map(Ok)),
    ))
}

fn batch(name: &str, values: Vec<Option<i64>>) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, true)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).unwrap()
}

fn threshold(op: CmpOp, value: f64) -> Condition {
    Condition::Threshold {
        column: "t".into(),
        op,
        value,
    }
}

#[tokio::test]
async fn readings_come_from_the_first_row() {
    let c = threshold(CmpOp::Gt, 90.0);
    // An empty first batch is skipped; the first row decides.
    let r = read(
        &c,
        stream(vec![
            batch("t", vec![]),
            batch("t", vec![Some(91), Some(1)]),
        ]),
    )
    .await
    .unwrap();
    assert_eq!(
        r,
        Reading {
            fires: true,
            value: Some(91.0)
        }
    );
    let r = read(&c, stream(vec![batch("t", vec![Some(90)])]))
        .await
        .unwrap();
    assert!(!r.fires);
    // NULL and no rows do not fire.
    let r = read(&c, stream(vec![batch("t", vec![None])]))
        .await
        .unwrap();
    assert_eq!(
        r,
        Reading {
            fires: false,
            value: None
        }
    );
    let r = read(&c, stream(vec![batch("t", vec![])])).await.unwrap();
    assert!(!r.fires);
    // A missing column is an error naming what there is.
    let e = read(&c, stream(vec![batch("x", vec![Some(1)])]))
        .await
        .unwrap_err();
    assert!(e.contains("no column 't'") && e.contains("x"), "{e}");
    let rows = read(
        &Condition::AnyRows,
        stream(vec![
            batch("x", vec![Some(1), None]),
            batch("x", vec![Some(3)]),
        ]),
    )
    .await
    .unwrap();
    assert_eq!(
        rows,
        Reading {
            fires: true,
            value: Some(3.0)
        }
    );
    let none = read(&Condition::AnyRows, stream(vec![batch("x", vec![])]))
        .await
        .unwrap();
    assert_eq!(
        none,
        Reading {
            fires: false,
            value: Some(0.0)
        }
    );
}

#[test]
fn strings_are_not_numbers() {
    let schema = Arc::new(Schema::new(vec![Field::new("t", DataType::Utf8, true)]));
    let b = RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(vec!["9"]))]).unwrap();
    assert!(first_value(&b, "t").unwrap_err().contains("not a number"));
}

#[test]
fn transitions_notify_except_the_first_ok() {
    let d = def(threshold(CmpOp::Gt, 90.0));
    let mut s = AlertStatus::new(&d);
    let ok = || {
        Ok(Reading {
            fires: false,
            value: Some(1.0),
        })
    };
    let firing = || {
        Ok(Reading {
            fires: true,
            value: Some(95.0),
        })
    };
    assert!(record(&mut s, ok(), 1).is_none(), "pending -> ok is quiet");
    assert_eq!(s.state, AlertState::Ok);
    assert!(record(&mut s, ok(), 2).is_none());
    let n = record(&mut s, firing(), 3).expect("ok -> firing notifies");
    let n: serde_json::Value = serde_json::from_slice(&n).unwrap();
    assert_eq!(n["state"], "firing");
    assert_eq!(n["previous"], "ok");
    assert_eq!(n["value"], 95.0);
    assert_eq!(n["alert"], "hot");
    assert!(record(&mut s, firing(), 4).is_none(), "still firing: quiet");
    let n = record(&mut s, Err("table gone".into()), 5).expect("-> error notifies");
    let n: serde_json::Value = serde_json::from_slice(&n).unwrap();
    assert_eq!(n["state"], "error");
    assert_eq!(n["error"], "table gone");
    assert_eq!(s.error.as_deref(), Some("table gone"));
    assert!(record(&mut s, Err("other".into()), 6).is_none());
    assert_eq!(s.error.as_deref(), Some("other"), "the newest reason shows");
    assert!(record(&mut s, ok(), 7).is_some(), "error -> ok notifies");
    assert_eq!(s.error, None);
    assert_eq!((s.evaluations, s.notifications), (7, 3));
    assert_eq!((s.last_evaluation_ms, s.last_change_ms), (Some(7), Some(7)));
    let mut fresh = AlertStatus::new(&d);
    assert!(
        record(&mut fresh, firing(), 1).is_some(),
        "pending -> firing notifies"
    );
}

struct Collect(parking_lot::Mutex<Vec<(String, Vec<u8>)>>);
impl AlertSink for Collect {
    fn publish(&self, topic: String, payload: Vec<u8>) {
        self.0.lock().push((topic, payload));
    }
}

#[tokio::test]
async fn results_of_dropped_or_changed_alerts_are_ignored() {
    let alerts = Arc::new(Alerts::default());
    let d = def(Condition::AnyRows);
    alerts.sync([&d]);
    let sink = Collect(Default::default());
    let fire = || {
        Ok(Reading {
            fires: true,
            value: Some(1.0),
        })
    };
    let generation = |a: &Alerts| a.entries.lock()["hot"].generation;
    let first = generation(&alerts);
    alerts.finish(&d, first, Instant::now(), fire(), &sink);
    assert_eq!(sink.0.lock().len(), 1);
    assert_eq!(sink.0.lock()[0].0, "$alerts/hot");
    let mut changed = d.clone();
    changed.interval_ms = 2000;
    alerts.sync([&changed]);
    assert_eq!(
        alerts.status()[0].state,
        AlertState::Pending,
        "a changed alert starts over"
    );
    alerts.finish(&d, first, Instant::now(), fire(), &sink);
    assert_eq!(
        alerts.status()[0].evaluations,
        0,
        "the old definition's result is dropped"
    );
    // Dropped and made again, identical: a new generation, so a run of the old one
    // cannot finish for it.
    let second = generation(&alerts);
    alerts.sync([]);
    assert!(alerts.status().is_empty());
    alerts.sync([&changed]);
    assert_ne!(generation(&alerts), second);
    alerts.sync([]);
    let batch = alerts.system_table();
    assert_eq!(batch.num_rows(), 0);
    assert_eq!(batch.schema().field(1).name(), "state");
}

#[tokio::test]
async fn states_outlive_a_restart_for_the_same_definition() {
    let dir = tempfile::tempdir().unwrap();
    let d = def(threshold(CmpOp::Gt, 90.0));
    let sink = Collect(Default::default());
    {
        let alerts = Arc::new(Alerts::open(dir.path()));
        alerts.sync([&d]);
        let g = alerts.entries.lock()["hot"].generation;
        let reading = Ok(Reading {
            fires: true,
            value: Some(95.0),
        });
        alerts.finish(&d, g, Instant::now(), reading, &sink);
        let path = dir.path().join("alerts.json");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&path).is_ok_and(|t| t.contains("firing")) {
            assert!(
                std::time::Instant::now() < deadline,
                "alerts.json not written"
            );
            tokio::task::yield_now().await;
        }
    }
    let alerts = Arc::new(Alerts::open(dir.path()));
    alerts.sync([&d]);
    assert_eq!(alerts.status()[0].state, AlertState::Firing);
    assert_eq!(alerts.status()[0].last_value, Some(95.0));
    let g = alerts.entries.lock()["hot"].generation;
    let still = Ok(Reading {
        fires: true,
        value: Some(96.0),
    });
    alerts.finish(&d, g, Instant::now(), still, &sink);
    assert_eq!(
        sink.0.lock().len(),
        1,
        "still firing after the restart: no news"
    );
    let ok = Ok(Reading {
        fires: false,
        value: Some(20.0),
    });
    alerts.finish(&d, g, Instant::now(), ok, &sink);
    assert_eq!(sink.0.lock().len(), 2, "recovered while down: told");
    // A changed definition starts over.
    let mut other = d.clone();
    other.interval_ms = 5000;
    let again = Alerts::open(dir.path());
    again.sync([&other]);
    assert_eq!(again.status()[0].state, AlertState::Pending);
}
