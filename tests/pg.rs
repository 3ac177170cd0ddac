//! The PostgreSQL wire protocol as its users' tools speak it: `psql` (Debian's
//! postgresql-client) for simple queries, settings, transactions and errors with their
//! SQLSTATE codes; `psycopg` 3 (PyPI) for prepared statements with parameters, text and
//! binary results of each common type, writes, a wrong password and `WHERE PARTS`; the
//! catalogs psql's `\dt` and `\d` read, Grafana's table and column lookups and its macros'
//! SQL; and the PostgreSQL JDBC driver (Maven Central, fetched by scripts/test.sh) from a
//! small Java program (`tests/jdbc/SluiceJdbc.java`).

mod common;

use common::Server;
use std::process::{Command, Output};

/// Runs `psql` against `pg` as `user` with `password`, in `database`, with `args`.
fn psql(pg: &str, user: &str, password: &str, database: &str, args: &[&str]) -> Output {
    let (host, port) = pg.rsplit_once(':').unwrap();
    Command::new("psql")
        .args(["-X", "-h", host, "-p", port, "-U", user, "-d", database])
        .args(["-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-At"])
        .args(args)
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("psql (Debian postgresql-client)")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn errors(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn psql_and_psycopg_query_and_write() {
    let dir = tempfile::tempdir().unwrap();
    let hash = common::password_hash("secret");
    let toml = format!(
        "[[user]]\nname = \"admin\"\npassword_hash = \"{hash}\"\n\n\
         [[user]]\nname = \"reader\"\npassword_hash = \"{hash}\"\nrole = \"user\"\n"
    );
    let s = Server::start_with_config(dir.path(), &toml);
    s.login(Some(("admin", "secret")));
    let pg = s.pg.clone().expect("a pg listener");
    let admin = |database: &str, args: &[&str]| psql(&pg, "admin", "secret", database, args);
    let reader = |database: &str, args: &[&str]| psql(&pg, "reader", "secret", database, args);
    s.sql_ok("CREATE DATABASE lab").await;
    s.sql_ok(
        "CREATE TABLE lab.readings (time TIMESTAMP NOT NULL, device TEXT, temp DOUBLE, \
         n BIGINT, ok BOOLEAN) PARTITION BY yyyymmdd(time)",
    )
    .await;
    s.write_ok(
        "lab",
        "readings",
        "text/csv",
        "2026-01-02T03:04:05Z,d1,21.5,7,true\n2026-01-02T03:04:06.250Z,d2,-3.25,-8,false\n",
    )
    .await;

    // psql: a query, several statements in one simple query, settings, a transaction.
    let out = admin(
        "lab",
        &[
            "-c",
            "SELECT device, temp, n, ok, time FROM readings ORDER BY device",
        ],
    );
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(
        text(&out),
        "d1|21.5|7|t|2026-01-02 03:04:05.000000\nd2|-3.25|-8|f|2026-01-02 03:04:06.250000"
    );
    let out = admin(
        "lab",
        &[
            "-c",
            "SET application_name = 'dash'; SHOW application_name; BEGIN; \
         SELECT count(*) FROM readings; COMMIT; SHOW server_version",
        ],
    );
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(text(&out), "SET\ndash\nBEGIN\n2\nCOMMIT\n16.6 (Sluice)");
    // DDL and writes say what they did; WHERE PARTS works as over HTTP.
    let out = admin(
        "postgres",
        &[
            "-c",
            "CREATE TABLE lab.events (time TIMESTAMP NOT NULL, what TEXT) PARTITION BY yyyymmdd(time)",
            "-c",
            "INSERT INTO lab.events VALUES ('2026-01-02T00:00:00Z', 'boot'), \
         ('2026-01-02T00:00:01Z', 'up')",
            "-c",
            "SELECT count(*) FROM lab.readings WHERE PARTS 20260102..20260103",
        ],
    );
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(text(&out), "CREATE TABLE\nINSERT 0 2\n2");
    // Errors come with their SQLSTATE; a statement after a failed one does not run.
    let out = admin("lab", &["-c", "SELECT * FROM nowhere; SELECT 1"]);
    assert!(!out.status.success());
    assert!(errors(&out).contains("42P01"), "{}", errors(&out));
    assert_eq!(text(&out), "");
    let out = admin("lab", &["-c", "SHOW no_such_setting"]);
    assert!(errors(&out).contains("42704"), "{}", errors(&out));
    // Rights are the same as over HTTP; a wrong password is refused.
    let out = reader("lab", &["-c", "DROP TABLE lab.events"]);
    assert!(errors(&out).contains("42501"), "{}", errors(&out));
    let out = psql(&pg, "admin", "wrong", "lab", &["-c", "SELECT 1"]);
    assert!(!out.status.success());
    assert!(
        errors(&out).contains("password authentication failed"),
        "{}",
        errors(&out)
    );

    // psycopg 3: prepared statements with parameters (server-side binding), every common
    // type in text and binary results, a write with parameters.
    let (host, port) = pg.rsplit_once(':').unwrap();
    let script = r#"
import sys, datetime, decimal, psycopg
host, port = sys.argv[1], sys.argv[2]
dsn = f"host={host} port={port} user=admin password=secret dbname=lab"
out = []
with psycopg.connect(dsn, autocommit=True) as conn:
    for binary in (False, True):
        cur = conn.cursor(binary=binary)
        cur.execute("SELECT device, temp, n, ok, time, CAST(time AS DATE) AS day, "
                    "CAST(n AS INT) AS small, CAST(temp AS REAL) AS r "
                    "FROM readings WHERE device = %s AND temp > %s", ("d2", -10.0))
        rows = cur.fetchall()
        assert rows == [("d2", -3.25, -8, False,
                         datetime.datetime(2026, 1, 2, 3, 4, 6, 250000),
                         datetime.date(2026, 1, 2), -8, -3.25)], rows
        out.append(f"binary={binary}: {rows[0][0]} {type(rows[0][4]).__name__}")
        # bytea, numeric and timestamp with time zone, computed.
        cur.execute("SELECT CAST('ab' AS BYTEA), CAST(1.25 AS DECIMAL(10,2)), "
                    "to_timestamp(1767323045) AT TIME ZONE 'UTC'")
        utc = datetime.timezone.utc
        row = cur.fetchone()
        assert row == (b"ab", decimal.Decimal("1.25"),
                       datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=utc)), row
    cur = conn.cursor()
    cur.execute("INSERT INTO events VALUES (%s, %s)", (datetime.datetime(2026, 1, 3), "down"))
    assert cur.rowcount == 1, cur.rowcount
    cur.execute("SELECT what FROM events WHERE time >= %s ORDER BY time",
                (datetime.datetime(2026, 1, 2, 0, 0, 1),))
    out.append(",".join(r[0] for r in cur.fetchall()))
    cur.execute("SELECT count(*) FROM readings WHERE n < %s", (0,))
    out.append(str(cur.fetchone()[0]))
    try:
        cur.execute("SELECT nope FROM readings")
    except psycopg.Error as e:
        out.append(f"error {e.sqlstate}")
try:
    psycopg.connect(dsn.replace("secret", "nope"))
except psycopg.OperationalError:
    out.append("refused")
print("\n".join(out))
"#;
    let out = Command::new("python3")
        .args(["-c", script, host, port])
        .output()
        .expect("python3");
    assert!(out.status.success(), "psycopg: {}", errors(&out));
    assert_eq!(
        text(&out),
        "binary=False: d2 datetime\nbinary=True: d2 datetime\nup,down\n1\nerror 42601\nrefused"
    );
    assert_eq!(
        s.count("SELECT count(*) FROM lab.events").await,
        3,
        "the writes over the PostgreSQL protocol are stored"
    );

    // The catalogs: psql's \dt and \d, and what a plain user sees of them.
    let out = admin("lab", &["-c", "\\dt lab.*"]);
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(
        text(&out),
        "lab|events|table|postgres\nlab|readings|table|postgres"
    );
    let out = admin("lab", &["-c", "\\d lab.readings"]);
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(
        text(&out),
        "time|timestamp without time zone|||\ndevice|text|||\ntemp|double precision|||\n\
         n|bigint|||\nok|boolean|||"
    );
    s.sql_ok(
        "CREATE TABLE shop.orders (time TIMESTAMP NOT NULL, item TEXT) PARTITION BY yyyymmdd(time)",
    )
    .await;
    s.sql_ok("GRANT SELECT ON DATABASE shop TO reader").await;
    let out = reader(
        "shop",
        &[
            "-c",
            "SELECT table_schema, table_name FROM information_schema.tables",
            "-c",
            "SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')",
        ],
    );
    assert_eq!(text(&out), "shop|orders\nshop", "{}", errors(&out));
    let out = reader(
        "shop",
        &[
            "-c",
            "SELECT count(*) FROM pg_catalog.pg_class, lab.readings",
        ],
    );
    assert!(!out.status.success());
    assert!(errors(&out).contains("42501"), "{}", errors(&out));
    // Grafana's PostgreSQL data source: its table lookup (schemas of the search path), its
    // column lookup, and what $__timeGroupAlias and $__timeFilter expand to.
    let grafana = [
        "select quote_ident(table_name) as \"table\" from information_schema.tables \
         where quote_ident(table_schema) not in ('information_schema', 'pg_catalog', \
         '_timescaledb_cache', '_timescaledb_catalog', '_timescaledb_internal') \
         and quote_ident(table_schema) IN ( SELECT CASE WHEN trim(s[i]) = '\"$user\"' \
         THEN user ELSE trim(s[i]) END FROM generate_series( \
         array_lower(string_to_array(current_setting('search_path'),','),1), \
         array_upper(string_to_array(current_setting('search_path'),','),1) ) as i, \
         string_to_array(current_setting('search_path'),',') s ) ORDER BY 1",
        "select quote_ident(column_name) as \"column\", data_type as \"type\" \
         from information_schema.columns where quote_ident(table_name) = 'readings' \
         ORDER BY ordinal_position",
        "SELECT floor(extract(epoch from time)/3600)*3600 AS \"time\", avg(temp) AS temp \
         FROM readings WHERE time BETWEEN '2026-01-02T00:00:00Z' AND '2026-01-02T23:59:59Z' \
         GROUP BY 1 ORDER BY 1",
    ];
    let args: Vec<&str> = grafana.iter().flat_map(|q| ["-c", *q]).collect();
    let out = admin("lab", &args);
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(
        text(&out),
        "events\nreadings\n\
         time|timestamp without time zone\ndevice|text\ntemp|double precision\nn|bigint\n\
         ok|boolean\n\
         1767322800.0|9.125"
    );

    // A rollup through psql: its command tags, and the columns its queries answer with in
    // information_schema (not its stored partial ones).
    let out = admin(
        "shop",
        &[
            "-c",
            "CREATE ROLLUP shop.per_hour AS SELECT date_bin('1 hour', time) AS hour, item, \
             count(*) AS n FROM shop.orders GROUP BY 1, 2",
            "-c",
            "select column_name, data_type from information_schema.columns \
             where table_name = 'per_hour' order by ordinal_position",
            "-c",
            "DROP ROLLUP shop.per_hour",
        ],
    );
    assert!(out.status.success(), "{}", errors(&out));
    assert_eq!(
        text(&out),
        "CREATE ROLLUP\nhour|timestamp without time zone\nitem|text\nn|bigint\nDROP ROLLUP"
    );

    // The PostgreSQL JDBC driver, from a small Java program.
    let jar = common::installed_tool(
        "SLUICE_PG_JDBC",
        "sluice-jdbc/postgresql-42.7.14.jar",
        "scripts/test.sh fetches it from Maven Central",
    );
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/jdbc/SluiceJdbc.java");
    let out = Command::new("java")
        .args(["-cp", &jar, source, host, port])
        .output()
        .expect("java (scripts/test.sh installs a JRE)");
    assert!(out.status.success(), "jdbc: {}", errors(&out));
    assert_eq!(
        text(&out),
        "d1 21.5 7 true 2026-01-02T03:04:05\nd2 -3.25 -8 false 2026-01-02T03:04:06.250\n\
         counts 2 1 2 1 2 1 2\ninserted 1\ntables lab.events,lab.readings\n\
         columns time:timestamp,device:text,temp:float8,n:int8,ok:bool\nerror 42P01"
    );
    assert_eq!(s.count("SELECT count(*) FROM lab.events").await, 4);
}
