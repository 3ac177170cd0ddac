//! TLS on every listener, with a private CA made by the openssl tool: HTTPS for the API
//! (certificate reloaded on SIGHUP), and MQTT over mutual TLS where a verified client
//! certificate's common name is the user (mosquitto_pub --cert), while a certificate from
//! another CA is refused.

mod common;

use common::{Server, password_hash};
use rumqttc::mqttbytes::v4;
use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `{ca}.pem`/`{ca}.key` (P-256).
fn make_ca(dir: &Path, ca: &str) {
    let (pem, key) = (format!("{ca}.pem"), format!("{ca}.key"));
    let subject = format!("/CN={ca}");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &subject,
            "-keyout",
            &key,
            "-out",
            &pem,
        ],
    );
}

/// `{name}.pem`/`{name}.key` with common name `cn`, signed by `ca`: a server certificate
/// for 127.0.0.1 or a client certificate.
fn make_cert(dir: &Path, ca: &str, name: &str, cn: &str, server: bool) {
    let ext = format!("{name}.ext");
    let text = match server {
        true => "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        false => "extendedKeyUsage=clientAuth\n",
    };
    std::fs::write(dir.join(&ext), text).unwrap();
    let (csr, key, pem) = (
        format!("{name}.csr"),
        format!("{name}.key"),
        format!("{name}.pem"),
    );
    let subject = format!("/CN={cn}");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &subject,
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    );
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}

/// Publishes one QoS 1 message as `admin` over `wss://addr/mqtt` (a TLS connection trusting
/// `ca.pem`, then the WebSocket upgrade); returns the packet after the CONNACK.
async fn wss_publish(dir: &Path, addr: &str) -> v4::Packet {
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tls = connector
        .connect(name, tcp)
        .await
        .expect("TLS to the HTTPS port");
    let mut request = format!("wss://{addr}/mqtt").into_client_request().unwrap();
    let protocol = "mqtt".parse().unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol);
    let (mut ws, _) = tokio_tungstenite::client_async(request, tls)
        .await
        .expect("websocket upgrade over TLS");
    let payload = r#"{"dev":"wss","v":1}"#;
    let login = Some(("admin", "pw"));
    let mut packets = common::publish_over_websocket(&mut ws, login, "/iot/t", payload).await;
    assert!(matches!(packets[0], v4::Packet::ConnAck(_)), "{packets:?}");
    packets.remove(1)
}

/// The CA `ca`, a server certificate for 127.0.0.1 and a client certificate for `dev`
/// signed by it; returns the hash of the password `pw` the tests' users share.
fn private_ca(dir: &Path) -> String {
    make_ca(dir, "ca");
    make_cert(dir, "ca", "server", "localhost", true);
    make_cert(dir, "ca", "dev", "dev", false);
    password_hash("pw")
}

/// An HTTPS client trusting only `ca`.
fn https_client(dir: &Path, ca: &str) -> reqwest::Client {
    let pem = std::fs::read(dir.join(format!("{ca}.pem"))).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn https_mutual_tls_and_certificate_reload() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hash = private_ca(d);
    make_ca(d, "other-ca");
    make_cert(d, "other-ca", "rogue", "admin", false);
    let p = |f: &str| d.join(f).display().to_string();
    let s = Server::start_with_config(
        d,
        &format!(
            r#"
[http]
tls_cert = "{cert}"
tls_key = "{key}"

[mqtt]
tls_listen = "127.0.0.1:0"
tls_cert = "{cert}"
tls_key = "{key}"
tls_client_ca = "{ca}"
tls_cert_user = true

[[user]]
name = "admin"
password_hash = "{hash}"

[[user]]
name = "dev"
password_hash = "{hash}"
role = "user"
"#,
            cert = p("server.pem"),
            key = p("server.key"),
            ca = p("ca.pem"),
        ),
    );
    let url = |path: &str| format!("https://{}{path}", s.addr);
    let https = https_client(d, "ca");
    let sql = |q: &'static str| {
        https
            .post(url("/v1/sql"))
            .basic_auth("admin", Some("pw"))
            .body(q)
            .send()
    };
    for q in [
        "CREATE DATABASE iot",
        "CREATE TABLE iot.t (ts TIMESTAMP, dev STRING NOT NULL, v DOUBLE) PARTITION BY yyyymmdd(ts)",
        "GRANT INSERT ON DATABASE iot TO dev",
    ] {
        let r = sql(q).await.unwrap();
        assert_eq!(r.status(), 200, "{q}: {}", r.text().await.unwrap());
    }
    // MQTT over WebSocket on the HTTPS port: wss, logged in as admin.
    assert_eq!(
        wss_publish(d, &s.addr).await,
        v4::Packet::PubAck(v4::PubAck { pkid: 7 })
    );
    // Plain HTTP on the HTTPS port gets no answer.
    let plain = format!("http://{}/health", s.addr);
    assert!(reqwest::get(&plain).await.is_err());

    // MQTT over mutual TLS: the certificate's common name is the user (dev, granted INSERT).
    let port = s.tls_port().unwrap().to_string();
    let publish = |extra: &[&str], dev: &str| {
        let message = format!(r#"{{"dev":"{dev}","v":1}}"#);
        let base = [
            "-h",
            "localhost",
            "-p",
            &port,
            "--cafile",
            &p("ca.pem"),
            "-q",
            "1",
            "-t",
            "/iot/t",
            "-m",
            &message,
        ];
        let out = Command::new("mosquitto_pub")
            .args(base)
            .args(extra)
            .output()
            .expect("mosquitto_pub (package mosquitto-clients)");
        out.status.success()
    };
    let (dev_pem, dev_key) = (p("dev.pem"), p("dev.key"));
    assert!(publish(&["--cert", &dev_pem, "--key", &dev_key], "mtls"));
    // A certificate from another CA is refused at the handshake, whatever its name says.
    let (rogue_pem, rogue_key) = (p("rogue.pem"), p("rogue.key"));
    assert!(!publish(
        &["--cert", &rogue_pem, "--key", &rogue_key],
        "rogue"
    ));
    // Without a certificate: a password login, or nothing.
    assert!(!publish(&[], "anonymous"));
    assert!(publish(&["-u", "admin", "-P", "pw"], "password"));
    let r = sql("SELECT dev FROM iot.t ORDER BY dev").await.unwrap();
    let rows: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(
        rows,
        serde_json::json!([{"dev": "mtls"}, {"dev": "password"}, {"dev": "wss"}])
    );

    // A new certificate from another CA, put in place and signalled, is served at once.
    make_ca(d, "new-ca");
    make_cert(d, "new-ca", "server2", "localhost", true);
    std::fs::copy(d.join("server2.pem"), d.join("server.pem")).unwrap();
    std::fs::copy(d.join("server2.key"), d.join("server.key")).unwrap();
    let renewed = https_client(d, "new-ca");
    unsafe { libc::kill(s.child.id() as i32, libc::SIGHUP) };
    common::eventually("the renewed certificate served", 10, || {
        let get = renewed.get(url("/health")).send();
        async move { get.await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    // A new connection trusting only the old CA no longer gets through (open ones, such as
    // `https`'s pooled one, keep the certificate they began with).
    let old = https_client(d, "ca");
    assert!(old.get(url("/health")).send().await.is_err());
    assert!(s.log_text().contains("SIGHUP: TLS certificate reloaded"));
}

/// With `mqtt.tls_require_client_cert`, a TLS client without a certificate is refused at
/// the handshake, even with a right password; one with a certificate from the CA gets in.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_certificate_can_be_required() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hash = private_ca(d);
    let p = |f: &str| d.join(f).display().to_string();
    let s = Server::start_with_config(
        d,
        &format!(
            "[mqtt]\ntls_listen = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n\
             tls_client_ca = \"{}\"\ntls_require_client_cert = true\n\
             [[user]]\nname = \"dev\"\npassword_hash = \"{hash}\"\n",
            p("server.pem"),
            p("server.key"),
            p("ca.pem"),
        ),
    );
    let port = s.tls_port().unwrap().to_string();
    let publish = |extra: &[&str]| {
        let base = [
            "-h",
            "localhost",
            "-p",
            &port,
            "--cafile",
            &p("ca.pem"),
            "-t",
            "x",
            "-m",
            "1",
        ];
        let out = Command::new("mosquitto_pub")
            .args(base)
            .args(extra)
            .output();
        out.expect("mosquitto_pub (package mosquitto-clients)")
            .status
            .success()
    };
    assert!(!publish(&["-u", "dev", "-P", "pw"]));
    let (cert, key) = (p("dev.pem"), p("dev.key"));
    assert!(publish(&[
        "--cert", &cert, "--key", &key, "-u", "dev", "-P", "pw"
    ]));
}
