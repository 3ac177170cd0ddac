//! InfluxDB's write API as its users send to it: line protocol to `/api/v2/write` (gzip,
//! seconds precision) and `/write` (v1), measurements becoming tables made and widened in an
//! auto-create database, a type conflict reported in InfluxDB's error shapes (the other
//! lines stored, or none when the client asks for all or nothing).

mod common;

use common::Server;

/// POSTs `body` to `path`, gzip-compressed when `gzip`; returns the status and the body.
async fn post(s: &Server, path: &str, body: &str, gzip: bool) -> (u16, String) {
    let mut request = s.client().post(s.url(path));
    let bytes = if gzip {
        use std::io::Write;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(body.as_bytes()).unwrap();
        request = request.header("content-encoding", "gzip");
        z.finish().unwrap()
    } else {
        body.as_bytes().to_vec()
    };
    let r = request.body(bytes).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn line_protocol_over_influxdbs_write_api_makes_and_fills_tables() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        &[("SLUICE_MQTT_AUTO_CREATE_DATABASES", "telegraf")],
    );
    s.sql_ok("CREATE DATABASE telegraf").await;
    s.sql_ok("CREATE DATABASE fixed").await;
    let lines = "cpu,host=a usage=1.5,n=3i 1700000000\n\
                 mem,host=a free=10u,ok=t 1700000000\n\
                 cpu,host=b usage=2 1700000001\n";
    let (status, body) = post(
        &s,
        "/api/v2/write?org=x&bucket=telegraf&precision=s",
        lines,
        true,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let columns = s.rows("DESCRIBE telegraf.cpu").await;
    let columns: Vec<String> = (columns.iter())
        .map(|c| {
            format!(
                "{} {}",
                c["column_name"].as_str().unwrap(),
                c["data_type"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        columns,
        ["time DateTime", "host String", "usage Float64", "n Int64"]
    );
    assert_eq!(
        s.rows("SELECT CAST(time AS VARCHAR) AS t, host, usage, n FROM telegraf.cpu ORDER BY host")
            .await,
        vec![
            serde_json::json!({"t": "2023-11-14T22:13:20", "host": "a", "usage": 1.5, "n": 3}),
            serde_json::json!({"t": "2023-11-14T22:13:21", "host": "b", "usage": 2.0, "n": null}),
        ]
    );
    assert_eq!(
        s.rows("SELECT free, ok FROM telegraf.mem").await,
        vec![serde_json::json!({"free": 10, "ok": true})]
    );
    // v1, milliseconds; a new field widens the table.
    let (status, body) = post(
        &s,
        "/write?db=telegraf&precision=ms",
        "cpu,host=c usage=3,temp=20.5 1700000002000",
        false,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        s.rows("SELECT CAST(time AS VARCHAR) AS t, temp FROM telegraf.cpu WHERE host = 'c'")
            .await,
        vec![serde_json::json!({"t": "2023-11-14T22:13:22", "temp": 20.5})]
    );
    // A type conflict: the other lines are stored and it is reported, in InfluxDB 2's shape
    // (code, message) and 3's (error, data), naming the line.
    let bad = "cpu,host=d usage=4\ncpu,host=e usage=\"high\"";
    let (status, body) = post(&s, "/api/v2/write?bucket=telegraf", bad, false).await;
    assert_eq!(status, 400, "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["code"], "invalid");
    assert!(e["message"].as_str().unwrap().contains("line 2"), "{body}");
    assert_eq!(e["data"][0]["line_number"], 2, "{body}");
    assert_eq!(e["data"][0]["original_line"], "cpu,host=e usage=\"high\"");
    let q = "SELECT host FROM telegraf.cpu WHERE host IN ('d', 'e')";
    assert_eq!(s.rows(q).await, vec![serde_json::json!({"host": "d"})]);
    // All or nothing when the client asks (InfluxDB 3's accept_partial=false).
    let bad = "cpu,host=h usage=4\ncpu,host=i usage=\"high\"";
    let path = "/api/v2/write?bucket=telegraf&accept_partial=false";
    let (status, body) = post(&s, path, bad, false).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("line 2"), "{body}");
    let q = "SELECT count(*) FROM telegraf.cpu WHERE host IN ('h', 'i')";
    assert_eq!(s.count(q).await, 0);
    // Lines are numbered as sent, whichever measurement they belong to. The stored ones
    // reach MQTT subscribers of their tables' topics, one message per measurement.
    let text = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    let (_watch, mut got) = s.subscriber_as("/telegraf/#", text).await;
    let mixed = "mem,host=f free=1u\ncpu,host=f usage=1\nmem,host=g free=\"lots\"";
    let (status, body) = post(&s, "/api/v2/write?bucket=telegraf", mixed, false).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("line 3"), "{body}");
    for want in [
        ("/telegraf/mem", "mem,host=f free=1u"),
        ("/telegraf/cpu", "cpu,host=f usage=1"),
    ] {
        let m = tokio::time::timeout(std::time::Duration::from_secs(20), got.recv()).await;
        let m = m.expect("a message within 20 s").unwrap();
        assert_eq!((m.0.as_str(), m.1.as_str()), want);
    }
    // Where tables are not made on the fly, a missing one is a 404; a bad precision a 400.
    let (status, body) = post(&s, "/api/v2/write?bucket=fixed", "cpu usage=1", false).await;
    assert_eq!(
        (
            status,
            serde_json::from_str::<serde_json::Value>(&body).unwrap()["code"].clone()
        ),
        (404, "not found".into())
    );
    let (status, _) = post(
        &s,
        "/api/v2/write?bucket=telegraf&precision=h",
        "cpu usage=1",
        false,
    )
    .await;
    assert_eq!(status, 400);
}

/// The InfluxDB Python client (PyPI `influxdb-client`) writes points and a line through its
/// synchronous write API, with a Sluice user and password as its token.
#[tokio::test(flavor = "multi_thread")]
async fn the_influxdb_python_client_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[("SLUICE_MQTT_AUTO_CREATE_DATABASES", "*")]);
    s.sql_ok("CREATE DATABASE lab").await;
    s.sql_ok("CREATE USER writer WITH PASSWORD 'pw' ADMIN")
        .await;
    s.login(Some(("writer", "pw")));
    let script = r#"
import sys
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
with InfluxDBClient(url=sys.argv[1], token="writer:pw", org="sluice") as client:
    api = client.write_api(write_options=SYNCHRONOUS)
    api.write(bucket="lab", record=[
        Point("weather").tag("site", "north").field("temp", 21.5).field("rain", 0).time(1700000000, WritePrecision.S),
        Point("weather").tag("site", "south").field("temp", 25.0).field("rain", 3).time(1700000001, WritePrecision.S),
    ], write_precision=WritePrecision.S)
    api.write(bucket="lab", record="power,site=north kw=1.25 1700000002000000000")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &s.url("")])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "influxdb-client (PyPI influxdb-client): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        s.rows("SELECT site, temp, rain FROM lab.weather ORDER BY site")
            .await,
        vec![
            serde_json::json!({"site": "north", "temp": 21.5, "rain": 0}),
            serde_json::json!({"site": "south", "temp": 25.0, "rain": 3}),
        ]
    );
    assert_eq!(
        s.rows("SELECT CAST(time AS VARCHAR) AS t, kw FROM lab.power")
            .await,
        vec![serde_json::json!({"t": "2023-11-14T22:13:22", "kw": 1.25})]
    );
    // A wrong token is refused.
    let bad = script.replace("writer:pw", "writer:nope");
    let out = std::process::Command::new("python3")
        .args(["-c", &bad, &s.url("")])
        .output()
        .expect("python3");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    // InfluxDB 1.x clients send `?u=&p=` on /write (no header).
    let v1 = |p: &str| {
        let url = s.url(&format!("/write?db=lab&precision=s&u=writer&p={p}"));
        reqwest::Client::new()
            .post(url)
            .body("power,site=south kw=2 1700000003")
    };
    assert_eq!(v1("nope").send().await.unwrap().status().as_u16(), 401);
    assert_eq!(v1("pw").send().await.unwrap().status().as_u16(), 204);
    assert_eq!(s.count("SELECT count(*) FROM lab.power").await, 2);
}
