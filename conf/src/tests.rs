//! Defaults against `conf/sluice.toml`, the environment layer and validation.

use super::*;

#[test]
fn documented_defaults_equal_code_defaults() {
    let text = include_str!("../sluice.toml");
    let parsed = Config::from_toml(text).expect("conf/sluice.toml parses");
    assert_eq!(parsed, Config::default());
    // Every key of the default must be written in the file, not merely defaulted.
    let written: toml::Value = toml::from_str(text).unwrap();
    let full = toml::Value::try_from(Config::default()).unwrap();
    assert_eq!(written, full, "conf/sluice.toml must spell out every key");
    parsed.validate().unwrap();
}

#[test]
fn env_overrides_file() {
    let mut c = Config::from_toml("[http]\nlisten = \"127.0.0.1:1\"\n").unwrap();
    c.apply_env([
        ("SLUICE_HTTP_LISTEN".to_string(), "127.0.0.1:2".to_string()),
        ("SLUICE_DATA_DIR".into(), "/tmp/x".into()),
        ("SLUICE_WAL_DURABILITY".into(), "none".into()),
        ("SLUICE_BUFFER_PARTITION_MAX_ROWS".into(), "7".into()),
        ("SLUICE_STORAGE_S3_ALLOW_HTTP".into(), "true".into()),
        ("PATH".into(), "/bin".into()),
    ])
    .unwrap();
    assert_eq!(c.http.listen.port(), 2);
    assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
    assert_eq!(c.wal.durability, Durability::None);
    assert_eq!(c.buffer.partition_max_rows, 7);
    assert!(c.storage.s3_allow_http);
}

#[test]
fn bad_env_is_named() {
    let mut c = Config::default();
    let mut err = |var: &str, value: &str| {
        (c.apply_env([(var.to_string(), value.to_string())])
            .unwrap_err())
        .to_string()
    };
    let e = err("SLUICE_HTTP_LISTNE", "x");
    assert!(e.contains("SLUICE_HTTP_LISTNE"), "{e}");
    // A key of the optional [cluster] section on a single node says what is missing.
    let e = err("SLUICE_CLUSTER_STANDBY_COPY", "false");
    assert!(e.contains("[cluster]"), "{e}");
    let e = err("SLUICE_BUFFER_PARTITION_MAX_ROWS", "many");
    assert!(e.contains("many"), "{e}");
}

#[test]
fn public_listener_without_users_is_refused() {
    let mut c = Config::default();
    c.mqtt.listen = "0.0.0.0:1883".parse().unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("mqtt.listen") && err.contains("loopback"),
        "{err}"
    );
}

#[test]
fn public_plain_text_listeners_must_be_asked_for() {
    let mut c = Config::default();
    c.user.push(crate::UserConfig {
        name: "a".into(),
        password_hash: "x".into(),
        role: "admin".into(),
    });
    c.http.listen = "0.0.0.0:8080".parse().unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("http.listen") && err.contains("in clear"),
        "{err}"
    );
    c.http.tls_cert = "cert.pem".into();
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("go together")
    );
    c.http.tls_key = "key.pem".into();
    c.validate().unwrap();
    c.mqtt.listen = "0.0.0.0:1883".parse().unwrap();
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("mqtt.listen")
    );
    c.mqtt.allow_plaintext = true;
    c.validate().unwrap();
    c.mqtt.tls_cert_user = true;
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("tls_client_ca")
    );
    c.user[0].role = "root".into();
    c.mqtt.tls_cert_user = false;
    assert!(c.validate().unwrap_err().to_string().contains("role"));
}

#[test]
fn unknown_file_keys_are_refused() {
    assert!(Config::from_toml("[http]\nlistem = \"x\"\n").is_err());
}

#[test]
fn cluster_section() {
    let text = "[cluster]\nnode_id = 2\nlisten = \"127.0.0.1:7002\"\n\
                shared_store = \"file:///tmp/shared\"\n\
                peers = { 1 = \"127.0.0.1:7001\", 3 = \"127.0.0.1:7003\" }\n";
    let c = Config::from_toml(text).unwrap();
    c.validate().unwrap();
    let cl = c.cluster.as_ref().unwrap();
    assert_eq!(cl.replication_factor, 3);
    let nodes = cl.nodes();
    assert_eq!(nodes.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(nodes[&2], "127.0.0.1:7002");
    assert_eq!(cl.shard_count(), 6);
    // A single node has no [cluster] at all.
    assert!(Config::default().cluster.is_none());

    let mut wrong = c.clone();
    wrong
        .cluster
        .as_mut()
        .unwrap()
        .peers
        .insert("2".into(), "127.0.0.1:9".into());
    let err = wrong.validate().unwrap_err().to_string();
    assert!(
        err.contains("cluster.peers") && err.contains("listens on"),
        "{err}"
    );
    let mut wrong = c.clone();
    wrong.cluster.as_mut().unwrap().shared_store = "shared".into();
    let err = wrong.validate().unwrap_err().to_string();
    assert!(err.contains("cluster.shared_store"), "{err}");
    let mut wrong = c;
    wrong
        .cluster
        .as_mut()
        .unwrap()
        .peers
        .insert("x".into(), "h:1".into());
    assert!(wrong.validate().is_err());
}

#[test]
fn validate_names_the_key() {
    let mut c = Config::default();
    c.buffer.max_age = "soon".into();
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("buffer.max_age")
    );
}

#[test]
fn retained_rows_need_named_levels() {
    let rule = |filter: &str| {
        format!("[[topic]]\nfilter = \"{filter}\"\ntable = \"t\"\nretain = \"latest\"\n")
    };
    let ok = Config::from_toml(&rule("f/+site/+device")).unwrap();
    assert_eq!(ok.topic[0].retain, crate::RetainFrom::Latest);
    ok.validate().unwrap();
    for bad in ["f/+/+device", "f/+device/#"] {
        let err = Config::from_toml(&rule(bad))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("topic[0].retain"), "{err}");
    }
    assert!(Config::from_toml(&rule("f").replace("latest", "newest")).is_err());
}

#[test]
fn the_hot_cache_is_bytes_or_a_share_of_the_memory() {
    let memory = crate::machine_memory() as usize;
    let share = |t: &str| crate::MemoryBudget::Share(t.into()).bytes();
    assert_eq!(share("25%"), Ok(memory / 4));
    assert_eq!(share("1048576"), Ok(1 << 20));
    assert_eq!(crate::MemoryBudget::Bytes(0).bytes(), Ok(0));
    assert!(share("150%").unwrap_err().contains("0% to 100%"));
    let mut c = Config::default();
    c.apply_env([("SLUICE_QUERY_HOT_CACHE_BYTES".into(), "4096".into())])
        .unwrap();
    assert_eq!(c.query.hot_cache_bytes.bytes(), Ok(4096));
    let from_file: Config = toml::from_str("[query]\nhot_cache_bytes = 8192").unwrap();
    assert_eq!(from_file.query.hot_cache_bytes.bytes(), Ok(8192));
    c.query.hot_cache_bytes = crate::MemoryBudget::Share("lots".into());
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("query.hot_cache_bytes"), "{err}");
}
