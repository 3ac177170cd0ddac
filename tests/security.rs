//! Who may do what, tried on every path as an outside script would: two configured users
//! (`admin`, and `dev` with the plain role), grants, `[[acl]]` rules and a user made with
//! SQL; every refused action over MQTT, HTTP writes, SQL, the alerts API and the admin
//! routes must be refused with its reason and change nothing, and the allowed ones work.

mod common;

use common::{Server, password_hash};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet as P5, PubAckReason};

fn config(hash: &str) -> String {
    format!(
        r#"
[[user]]
name = "admin"
password_hash = "{hash}"

[[user]]
name = "dev"
password_hash = "{hash}"
role = "user"

[[acl]]
user = "dev"
action = "write"
filter = "ops.*"
allow = false
"#
    )
}

/// The status and error code of a statement run by the current user.
async fn refused(s: &Server, sql: &str) -> String {
    let r = s.sql(sql).await;
    assert_eq!(r.status, 403, "{sql} should be refused: {}", r.body);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert_eq!(r.json()["error"]["code"], "forbidden", "{sql}");
    message
}

/// PUBACK reasons for QoS 1 publishes of `dev` to each topic, in order.
async fn dev_publishes(s: &Server, topics: &[&str]) -> Vec<PubAckReason> {
    let mut o = rumqttc::v5::MqttOptions::new("dev-5", "127.0.0.1", s.mqtt_port());
    o.set_credentials("dev", "pw");
    let (c, mut el) = rumqttc::v5::AsyncClient::new(o, 10);
    for t in topics {
        c.publish(*t, QoS::AtLeastOnce, false, r#"{"dev":"m","v":1}"#)
            .await
            .unwrap();
    }
    let mut reasons = Vec::new();
    while reasons.len() < topics.len() {
        if let rumqttc::v5::Event::Incoming(P5::PubAck(a)) = el.poll().await.unwrap() {
            reasons.push(a.reason);
        }
    }
    reasons
}

#[tokio::test(flavor = "multi_thread")]
async fn roles_grants_and_rules_hold_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let hash = password_hash("pw");
    let s = Server::start_with_config(dir.path(), &config(&hash));
    s.login(Some(("admin", "pw")));
    for db in ["plant", "ops", "hr"] {
        s.sql_ok(&format!("CREATE DATABASE {db}")).await;
        s.sql_ok(&format!(
            "CREATE TABLE {db}.t (ts TIMESTAMP, dev STRING NOT NULL, v DOUBLE) PARTITION BY yyyymmdd(ts)"
        ))
        .await;
    }
    s.sql_ok("GRANT ALL ON DATABASE plant TO dev").await;
    s.sql_ok("GRANT SELECT, INSERT ON DATABASE ops TO dev")
        .await;
    s.sql_ok("INSERT INTO hr.t (dev, v) VALUES ('a', 1)").await;
    // The admin's run of this query leaves a kept plan and result: a plain user's run of
    // the same text must still be checked.
    assert_eq!(s.count("SELECT count(*) FROM hr.t").await, 1);

    s.login(Some(("dev", "pw")));
    // Reads: granted databases only, kept plans included.
    assert_eq!(s.count("SELECT count(*) FROM plant.t").await, 0);
    let m = refused(&s, "SELECT count(*) FROM hr.t").await;
    assert!(m.contains("missing SELECT on database 'hr'"), "{m}");
    refused(&s, "SELECT * FROM plant.t JOIN hr.t USING (dev)").await;
    refused(&s, "DESCRIBE hr.t").await;
    // SQL writes: the grant, then the [[acl]] rule (dev has INSERT on ops, the rule denies).
    refused(&s, "INSERT INTO hr.t (dev, v) VALUES ('x', 1)").await;
    let m = refused(&s, "INSERT INTO ops.t (dev, v) VALUES ('x', 1)").await;
    assert!(m.contains("[[acl]]"), "{m}");
    s.sql_ok("INSERT INTO plant.t (dev, v) VALUES ('ok', 1)")
        .await;
    // HTTP writes: the same decisions.
    for (db, want) in [("hr", 403), ("ops", 403), ("plant", 204)] {
        let r = s
            .write(db, "t", "text/csv", "2024-05-01 10:00:00,w,1")
            .await;
        assert_eq!(r.status, want, "write to {db}: {}", r.body);
    }
    // Administration: users, grants, databases, tables.
    for sql in [
        "CREATE USER mallory WITH PASSWORD 'x'",
        "CREATE USER mallory WITH PASSWORD 'x' ADMIN",
        "DROP TABLE ops.t",
        "DROP DATABASE hr",
        "CREATE DATABASE mine",
        "CREATE TABLE plant.z (ts TIMESTAMP, v DOUBLE) PARTITION BY yyyymmdd(ts)",
        "ALTER TABLE plant.t ADD COLUMN w DOUBLE",
        "GRANT ALL ON DATABASE hr TO dev",
        "SHOW USERS",
        "SHOW GRANTS FOR admin",
        "FLUSH TABLE plant.t",
        "SELECT * FROM system.dead_letters",
        "SELECT * FROM system.subscriptions",
    ] {
        let m = refused(&s, sql).await;
        assert!(m.contains("user 'dev' may not"), "{sql}: {m}");
    }
    // What a plain user sees: its grants, its databases, their tables.
    let grants = s.rows("SHOW GRANTS").await;
    assert_eq!(
        grants,
        vec![
            serde_json::json!({"user_name": "dev", "database_name": "ops", "privileges": "ALL"}),
            serde_json::json!({"user_name": "dev", "database_name": "plant", "privileges": "ALL"}),
        ]
    );
    let dbs = s.rows("SHOW DATABASES").await;
    let dbs: Vec<&str> = dbs
        .iter()
        .map(|r| r["database_name"].as_str().unwrap())
        .collect();
    assert_eq!(dbs, vec!["ops", "plant", "system"]);
    let tables = s
        .rows("SELECT database_name FROM system.tables ORDER BY 1")
        .await;
    assert_eq!(
        tables,
        vec![
            serde_json::json!({"database_name": "ops"}),
            serde_json::json!({"database_name": "plant"})
        ]
    );
    // Admin routes and alerts.
    let get = |path: &str| s.authorized(s.client().get(s.url(path))).send();
    assert_eq!(get("/v1/bridges").await.unwrap().status(), 403);
    let alert = |name: &str, query: &str| {
        let body = serde_json::json!({"name": name, "query": query, "condition": "any rows"});
        s.authorized(s.client().post(s.url("/v1/alerts")))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    assert_eq!(
        alert("peek", "SELECT * FROM hr.t").await.unwrap().status(),
        403
    );
    assert_eq!(
        alert("mine", "SELECT * FROM plant.t")
            .await
            .unwrap()
            .status(),
        201
    );

    // MQTT: publishes into tables need INSERT and pass the rules (5.0 answers 0x87).
    let reasons = dev_publishes(&s, &["/hr/t", "/ops/t", "/plant/t"]).await;
    assert_eq!(
        reasons,
        vec![
            PubAckReason::NotAuthorized,
            PubAckReason::NotAuthorized,
            PubAckReason::Success
        ]
    );

    // Nothing refused happened; everything allowed did.
    s.login(Some(("admin", "pw")));
    assert_eq!(s.count("SELECT count(*) FROM hr.t").await, 1);
    assert_eq!(s.count("SELECT count(*) FROM ops.t").await, 0);
    assert_eq!(s.count("SELECT count(*) FROM plant.t").await, 3);
    assert_eq!(s.rows("SHOW USERS").await, Vec::<serde_json::Value>::new());
    assert_eq!(
        s.rows("SELECT name, owner FROM system.alerts").await.len(),
        1
    );
    let text = s.metrics().await;
    for line in [
        "sluice_access_refusals_total{action=\"admin\"} 13",
        "sluice_access_refusals_total{action=\"select\"} 4",
        "sluice_access_refusals_total{action=\"insert\"} 6",
    ] {
        assert!(text.contains(line), "{line} expected:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn users_made_with_sql_get_only_what_is_granted() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    s.sql_ok("CREATE DATABASE plant").await;
    s.sql_ok("CREATE TABLE plant.t (ts TIMESTAMP, v DOUBLE) PARTITION BY yyyymmdd(ts)")
        .await;
    s.sql_ok("CREATE USER root WITH PASSWORD 'r' ADMIN").await;
    s.login(Some(("root", "r")));
    s.sql_ok("CREATE USER viewer WITH PASSWORD 'v'").await;
    s.sql_ok("GRANT SELECT ON DATABASE plant TO viewer").await;
    assert_eq!(
        s.rows("SHOW USERS").await,
        vec![
            serde_json::json!({"user_name": "root", "admin": true}),
            serde_json::json!({"user_name": "viewer", "admin": false}),
        ]
    );
    s.login(Some(("viewer", "v")));
    assert_eq!(s.count("SELECT count(*) FROM plant.t").await, 0);
    refused(&s, "INSERT INTO plant.t (v) VALUES (1)").await;
    assert_eq!(
        s.write("plant", "t", "text/csv", "2024-05-01 10:00:00,1")
            .await
            .status,
        403
    );
    // A plain user changes its own password, nobody else's.
    s.sql_ok("ALTER USER viewer WITH PASSWORD 'v2'").await;
    s.login(Some(("viewer", "v2")));
    refused(&s, "ALTER USER root WITH PASSWORD 'x'").await;
    // system.queries: a plain user sees its own statements only, with passwords masked,
    // each with how it ended (this query itself still running).
    let q = "SELECT user, query, state, error, result_rows FROM system.queries ORDER BY query_id";
    let mine = s.rows(q).await;
    let has = |query: &str, state: &str| {
        (mine.iter()).any(|r| r["query"] == query && r["state"] == state && r["user"] == "viewer")
    };
    assert!(mine.iter().all(|r| r["user"] == "viewer"), "{mine:?}");
    assert!(
        has("ALTER USER viewer WITH PASSWORD '***'", "finished"),
        "{mine:?}"
    );
    assert!(
        has("ALTER USER root WITH PASSWORD '***'", "failed"),
        "{mine:?}"
    );
    assert!(has(q, "running"), "{mine:?}");
    let counted = (mine.iter()).find(|r| r["query"] == "SELECT count(*) FROM plant.t");
    assert_eq!(counted.unwrap()["result_rows"], 1, "{mine:?}");
    assert!(!format!("{mine:?}").contains("v2"), "{mine:?}");
    // Revoked: refused at once, the kept plan of the same query included.
    s.login(Some(("root", "r")));
    // An administrator sees everyone's (those before the first user was made: no user).
    let users = "SELECT count(DISTINCT user) FROM system.queries WHERE kind = 'query'";
    assert_eq!(s.count(users).await, 2);
    s.sql_ok("REVOKE SELECT ON DATABASE plant FROM viewer")
        .await;
    s.login(Some(("viewer", "v2")));
    refused(&s, "SELECT count(*) FROM plant.t").await;
    assert_eq!(s.rows("SHOW GRANTS").await, Vec::<serde_json::Value>::new());
    // Dropping the user drops its grants: a new user of that name starts with none.
    s.login(Some(("root", "r")));
    s.sql_ok("GRANT INSERT ON DATABASE plant TO viewer").await;
    s.sql_ok("DROP USER viewer").await;
    s.sql_ok("CREATE USER viewer WITH PASSWORD 'v'").await;
    assert_eq!(
        s.rows("SHOW GRANTS FOR viewer").await,
        Vec::<serde_json::Value>::new()
    );
    // Dropping a database drops its grants: one made again with its name starts with none.
    s.sql_ok("GRANT SELECT ON DATABASE plant TO viewer").await;
    s.sql_ok("DROP TABLE plant.t").await;
    s.sql_ok("DROP DATABASE plant").await;
    s.sql_ok("CREATE DATABASE plant").await;
    assert_eq!(
        s.rows("SHOW GRANTS FOR viewer").await,
        Vec::<serde_json::Value>::new()
    );
    let r = s.sql("GRANT SELECT ON DATABASE nope TO viewer").await;
    assert_eq!(r.status, 404, "{}", r.body);
    let r = s.sql("GRANT SELECT ON DATABASE plant TO nobody").await;
    assert_eq!(r.status, 400, "{}", r.body);
    // Wrong passwords are counted (and, past a few from one address, answered late).
    s.login(Some(("root", "guess")));
    for _ in 0..3 {
        assert_eq!(s.sql("SELECT 1").await.status, 401);
    }
    s.login(Some(("root", "r")));
    let text = s.metrics().await;
    assert!(text.contains("sluice_login_failures_total 3"), "{text}");
}

/// One query past its memory budget or its time is stopped with an error that names the
/// setting; the server and other queries go on.
#[tokio::test(flavor = "multi_thread")]
async fn a_query_past_its_memory_or_time_is_stopped_alone() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        &[
            ("SLUICE_QUERY_MAX_MEMORY_BYTES", "16777216"),
            // Room for the memory-bound query below in a debug build on a slow box (2.4 s
            // there), which must fail on memory, not time.
            ("SLUICE_QUERY_TIMEOUT", "5s"),
        ],
    );
    // A hash join's build side cannot spill: 2 million rows do not fit in 16 MiB.
    let r = s
        .sql("SELECT count(*) FROM (SELECT unnest(range(1, 2000000)) AS v) a JOIN (SELECT unnest(range(1, 2000000)) AS v) b ON a.v = b.v")
        .await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "resources_exhausted");
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(m.contains("query.max_memory_bytes (16777216)"), "{m}");
    // Ten billion pairs take longer than 5 s; small queries meanwhile are answered.
    let done = std::sync::atomic::AtomicBool::new(false);
    let long = async {
        let r = s
            .sql(
                "SELECT count(*) FROM (SELECT unnest(range(1, 100000)) AS v) a, \
                 (SELECT unnest(range(1, 100000)) AS w) b WHERE a.v + b.w = 7",
            )
            .await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    };
    let others = async {
        let mut answered = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let r = s.sql("SELECT 41 + 1 AS n").await;
            assert_eq!(r.status, 200, "{}", r.body);
            answered += 1;
        }
        answered
    };
    let (long, answered) = tokio::join!(long, others);
    assert!(
        answered > 1,
        "{answered} small queries while the long one ran"
    );
    assert_eq!(long.status, 503, "{}", long.body);
    let m = long.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(m.contains("query.timeout (5s)"), "{m}");
    assert_eq!(s.count("SELECT 7 AS n").await, 7);
}
