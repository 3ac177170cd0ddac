//! Tests of `ddl`.

use super::*;

const NYCT: &str = "CREATE TABLE benchmark.nyct_lite(vendor_id String, pickup_datetime DateTime, dropoff_datetime DateTime, passenger_count Int8, trip_distance Float32, pickup_longitude Float32, pickup_latitude Float32, rate_code Int8, dropoff_longitude Float32, dropoff_latitude Float32, payment_type Int8, fare_amount Float32, extra Float32, mta_tax Float32, tip_amount Float32, tolls_amount Float32, improvement_surcharge Float32, total_amount Float32) PARTITION BY ymdh12(pickup_datetime)";

#[test]
fn oidbs_ddl() {
    let Statement::CreateTable(t) = parse(NYCT).unwrap() else {
        panic!("not a create table");
    };
    assert_eq!(t.name.database, "benchmark");
    assert_eq!(t.columns.len(), 18);
    assert_eq!(t.columns[3].ty, ColumnType::Int8);
    assert_eq!(t.partition, PartitionFn::Ymdh { hours: 12 });
    assert_eq!(t.partition_column, "pickup_datetime");
}

#[test]
fn standard_spelling_ttl_and_errors() {
    let Statement::CreateTable(t) = parse(
        "create table if not exists iot.readings (ts TIMESTAMP NOT NULL, device VARCHAR(32), temp DOUBLE PRECISION, n Nullable(UInt16)) partition by ymdh(ts) with (ttl = '30 days', owner = 'ops');",
    )
    .unwrap() else {
        panic!()
    };
    assert!(t.if_not_exists && !t.columns[0].nullable && t.columns[3].nullable);
    assert_eq!(t.ttl_secs, Some(30 * 86400));
    assert_eq!(t.options["owner"], "ops");
    let e = parse("CREATE TABLE t (a Int9) PARTITION BY a")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown column type 'Int9'") && e.contains("Line: 1, Column: 19"),
        "{e}"
    );
    let e = parse("CREATE TABLE t (a Int8)").unwrap_err().to_string();
    assert!(e.contains("PARTITION BY"), "{e}");
    let e = parse("CREATE TABLE t (a DateTime) PARTITION BY ymdh5(a)")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown partition function 'ymdh5'"), "{e}");
    assert!(matches!(
        parse("create table t (a UInt32) partition by rem(a, 8)").unwrap(),
        Statement::CreateTable(CreateTable {
            partition: PartitionFn::Rem { n: 8 },
            ..
        })
    ));
}

#[test]
fn other_statements() {
    assert_eq!(parse("SHOW DATABASES").unwrap(), Statement::ShowDatabases);
    assert_eq!(
        parse("CREATE USER IF NOT EXISTS gw WITH PASSWORD 's3'").unwrap(),
        Statement::CreateUser {
            name: "gw".into(),
            password: "s3".into(),
            if_not_exists: true,
            admin: false
        }
    );
    assert!(matches!(
        parse("CREATE USER ops PASSWORD 'x' ADMIN").unwrap(),
        Statement::CreateUser { admin: true, .. }
    ));
    let rights = |select, insert| crate::access::Rights { select, insert };
    assert_eq!(
        parse("GRANT SELECT, INSERT ON DATABASE plant TO dev").unwrap(),
        Statement::Grant {
            rights: rights(true, true),
            database: "plant".into(),
            user: "dev".into(),
            revoke: false
        }
    );
    assert_eq!(
        parse("REVOKE INSERT ON DATABASE plant FROM dev").unwrap(),
        Statement::Grant {
            rights: rights(false, true),
            database: "plant".into(),
            user: "dev".into(),
            revoke: true
        }
    );
    assert_eq!(
        parse("SHOW GRANTS FOR dev").unwrap(),
        Statement::ShowGrants {
            user: Some("dev".into())
        }
    );
    assert!(parse("GRANT DELETE ON DATABASE plant TO dev").is_err());
    assert!(parse("GRANT SELECT ON TABLE plant.t TO dev").is_err());
    assert!(parse("GRANT ALL PRIVILEGES ON DATABASE plant FROM dev").is_err());
    assert_eq!(
        parse("DROP USER gw").unwrap(),
        Statement::DropUser {
            name: "gw".into(),
            if_exists: false
        }
    );
    assert!(parse("CREATE USER gw").is_err());
    assert_eq!(
        parse("show tables in iot").unwrap(),
        Statement::ShowTables {
            database: Some("iot".into())
        }
    );
    assert!(matches!(
        parse("DESC TABLE iot.r").unwrap(),
        Statement::Describe(_)
    ));
    assert!(matches!(
        parse("FLUSH TABLE iot.r").unwrap(),
        Statement::Flush(_)
    ));
    assert!(matches!(
        parse("ALTER TABLE iot.r ADD COLUMN hum Float64").unwrap(),
        Statement::AddColumn { .. }
    ));
    let Statement::SetOptions {
        name,
        ttl_secs,
        options,
    } = parse("ALTER TABLE iot.r SET (ttl = '2d', json_mappings = 'v <- ''/a/*/0''')").unwrap()
    else {
        panic!("not SET")
    };
    assert_eq!(name.table, "r");
    assert_eq!(ttl_secs, Some(2 * 86400));
    assert_eq!(options["json_mappings"], "v <- '/a/*/0'");
    let e = parse("ALTER TABLE iot.r DROP COLUMN x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ADD [COLUMN] or SET"), "{e}");
    assert_eq!(
        parse("SELECT 'CREATE TABLE' FROM t").unwrap(),
        Statement::Query
    );
    assert_eq!(
        parse("-- CREATE TABLE x\nSELECT 1").unwrap(),
        Statement::Query
    );
}

mod fuzz {
    //! The SQL entry with arbitrary text and SQL-like token soup: an answer or an error,
    //! never a panic. `FUZZ_CASES` runs longer (bench/fuzz.sh).
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(512)
    }

    const WORDS: &[&str] = &[
        "CREATE",
        "DROP",
        "ALTER",
        "TABLE",
        "DATABASE",
        "USER",
        "ALERT",
        "GRANT",
        "REVOKE",
        "SHOW",
        "GRANTS",
        "ON",
        "TO",
        "FROM",
        "FOR",
        "SELECT",
        "INSERT",
        "INTO",
        "VALUES",
        "ALL",
        "ADMIN",
        "PASSWORD",
        "WITH",
        "PARTITION",
        "BY",
        "PARTS",
        "WHERE",
        "EVERY",
        "WHEN",
        "AS",
        "IF",
        "NOT",
        "EXISTS",
        "ADD",
        "COLUMN",
        "SET",
        "FLUSH",
        "DESCRIBE",
        "ANY",
        "ROWS",
        "PUBLISH",
        "WEBHOOK",
        "ttl",
        "yyyymmdd(ts)",
        "t",
        "db.t",
        "(",
        ")",
        ",",
        ";",
        "'x'",
        "''",
        "=",
        ">",
        "1",
        "-2.5e3",
        "$1",
        "'30 days'",
        "ts",
        "TIMESTAMP",
        "STRING",
        "DOUBLE",
        "NULL",
        "\"q\"",
        "*",
        "last",
        "5 SECONDS",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn token_soup_never_panics(words in prop::collection::vec(0..WORDS.len(), 0..24)) {
            let sql: Vec<&str> = words.iter().map(|&i| WORDS[i]).collect();
            let sql = sql.join(" ");
            let _ = parse(&sql);
            let _ = crate::query::dialect::parse(&sql);
        }

        #[test]
        fn arbitrary_text_never_panics(sql in "\\PC{0,80}") {
            let _ = parse(&sql);
            let _ = crate::query::dialect::parse(&sql);
        }
    }
}
