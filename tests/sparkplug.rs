//! Sparkplug B as edge nodes speak it: `tests/sparkplug/edge.py`, made with pysparkplug
//! (PyPI), publishes an NBIRTH and a DBIRTH whose metrics have aliases; Sluice is killed
//! (-9: the births are only in its log) and started again; then a DDATA names its metrics by
//! alias alone. The metrics are rows of the group's table with their names and types; a
//! DDATA with an alias no BIRTH announced is a dead letter naming it, and the edge node
//! receives an NCMD asking for a rebirth; DDEATH and NDEATH mark the device and the node
//! offline in `system.sparkplug_nodes`. The wide layout is checked the same way.

mod common;

use common::Server;
use serde_json::json;
use std::process::Command;

/// Runs one step of the edge node script; returns what it printed.
fn edge(port: u16, step: &str) -> String {
    let python = common::installed_tool(
        "SLUICE_SPARKPLUG_PYTHON",
        "sluice-sparkplug/bin/python",
        "scripts/test.sh makes it (a venv with pysparkplug)",
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sparkplug/edge.py");
    let out = Command::new(&python)
        .args([script, "127.0.0.1", &port.to_string(), step])
        .output()
        .expect("the sparkplug python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "edge.py {step}: {stderr}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn sparkplug_birth_restart_data_death() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    assert!(edge(s.mqtt_port(), "birth").contains("done birth"));
    // Acknowledged, so stored: 2 node metrics and 5 device metrics.
    assert_eq!(s.count("SELECT count(*) FROM sparkplug.plant").await, 7);
    s.kill9();

    let s = Server::start(dir.path(), &[]);
    let out = edge(s.mqtt_port(), "data");
    assert!(
        out.contains("NCMD [('Node Control/Rebirth', True)]"),
        "{out}"
    );
    let rows = s
        .rows(
            "SELECT metric, alias, datatype, int_value, double_value, bool_value, text_value, \
             seq, CAST(time AS VARCHAR) AS t FROM sparkplug.plant \
             WHERE message = 'DDATA' ORDER BY metric",
        )
        .await;
    let row = |metric: &str, alias: i64, ty: &str, values: [serde_json::Value; 4]| {
        let [int, double, boolean, text] = values;
        json!({"metric": metric, "alias": alias, "datatype": ty, "int_value": int,
               "double_value": double, "bool_value": boolean, "text_value": text,
               "seq": 2, "t": "2026-01-01T00:00:10"})
    };
    let n = serde_json::Value::Null;
    assert_eq!(
        rows,
        vec![
            row(
                "mode",
                4,
                "String",
                [n.clone(), n.clone(), n.clone(), json!("manual")]
            ),
            row(
                "pressure",
                2,
                "Int32",
                [json!(-7), n.clone(), n.clone(), n.clone()]
            ),
            row(
                "running",
                3,
                "Boolean",
                [n.clone(), n.clone(), json!(false), n.clone()]
            ),
            row(
                "temperature",
                1,
                "Double",
                [n.clone(), json!(22.25), n.clone(), n.clone()]
            ),
        ]
    );
    let letters = s
        .rows("SELECT topic, reason FROM system.dead_letters")
        .await;
    assert_eq!(
        letters,
        vec![json!({"topic": "spBv1.0/plant/DDATA/edge1/pump1",
            "reason": "alias 9 of edge node edge1 device pump1 was announced by no BIRTH message"})]
    );

    assert!(edge(s.mqtt_port(), "death").contains("done death"));
    let nodes = s
        .rows(
            "SELECT edge_node, device, online, CAST(death_time AS VARCHAR) AS death \
             FROM system.sparkplug_nodes ORDER BY device NULLS FIRST",
        )
        .await;
    assert_eq!(
        nodes,
        vec![
            json!({"edge_node": "edge1", "device": null, "online": false,
                   "death": "2026-01-01T00:00:21"}),
            json!({"edge_node": "edge1", "device": "pump1", "online": false,
                   "death": "2026-01-01T00:00:21"}),
        ]
    );
}

/// `mqtt.sparkplug_layout = "wide"`: a row per message, a column per metric; the BIRTHs are
/// also long rows in `plant_births`, read back after a kill -9.
#[tokio::test(flavor = "multi_thread")]
async fn sparkplug_wide_layout() {
    let dir = tempfile::tempdir().unwrap();
    let wide = [("SLUICE_MQTT_SPARKPLUG_LAYOUT", "wide")];
    let s = Server::start(dir.path(), &wide);
    assert!(edge(s.mqtt_port(), "birth").contains("done birth"));
    assert_eq!(
        s.count("SELECT count(*) FROM sparkplug.plant_births").await,
        7
    );
    s.kill9();

    let s = Server::start(dir.path(), &wide);
    let out = edge(s.mqtt_port(), "data");
    assert!(out.contains("NCMD"), "{out}");
    let rows = s
        .rows(
            "SELECT message, seq, temperature, pressure, running, mode, level \
             FROM sparkplug.plant WHERE device = 'pump1' ORDER BY time",
        )
        .await;
    assert_eq!(
        rows,
        vec![
            json!({"message": "DBIRTH", "seq": 1, "temperature": 21.5, "pressure": -3,
                   "running": true, "mode": "auto", "level": 0.5}),
            json!({"message": "DDATA", "seq": 2, "temperature": 22.25, "pressure": -7,
                   "running": false, "mode": "manual", "level": null}),
        ]
    );
    let node = s
        .rows("SELECT bdSeq, Node_Control_Rebirth FROM sparkplug.plant WHERE message = 'NBIRTH'")
        .await;
    assert_eq!(
        node,
        vec![json!({"bdSeq": 0, "Node_Control_Rebirth": false})]
    );
}
