//! TLS for the listeners (MQTT over TLS, and HTTPS for the HTTP API): certificates read
//! from PEM files and read again when they change or on SIGHUP ([`CertFiles::reload`]),
//! optional client certificates verified against a CA (`mqtt.tls_client_ca`), and the
//! subject common name of a verified client certificate, which may be the MQTT user.

use crate::error::{Error, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

fn setup(what: impl Into<String>, reason: impl ToString) -> Error {
    Error::Setup {
        what: what.into(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its key, as files, served to each new handshake; read again by
/// [`CertFiles::reload`] (a failed read keeps the previous pair).
#[derive(Debug)]
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: parking_lot::RwLock<Arc<CertifiedKey>>,
    /// The files' modification times when last read.
    stamp: parking_lot::Mutex<[Option<SystemTime>; 2]>,
}

impl CertFiles {
    /// Reads both files; fails (at start) when they do not hold a certificate and its key.
    pub fn open(cert: &Path, key: &Path) -> Result<Arc<Self>> {
        let provider = provider();
        let files = Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: parking_lot::RwLock::new(Arc::new(load(cert, key, &provider)?)),
            provider,
            stamp: parking_lot::Mutex::new([None, None]),
        };
        *files.stamp.lock() = files.stamps();
        Ok(Arc::new(files))
    }

    fn stamps(&self) -> [Option<SystemTime>; 2] {
        [&self.cert, &self.key].map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
    }

    /// Reads the files again; new handshakes get the new certificate, open connections keep
    /// theirs. On failure the previous certificate stays.
    pub fn reload(&self) -> Result<()> {
        let stamps = self.stamps();
        let pair = load(&self.cert, &self.key, &self.provider)?;
        *self.current.write() = Arc::new(pair);
        *self.stamp.lock() = stamps;
        Ok(())
    }

    /// Reads the files again if either changed since last read (polled); says whether it
    /// did. A failed read is logged and tried again at the next change.
    pub fn reload_if_changed(&self) -> bool {
        let stamps = self.stamps();
        if stamps == *self.stamp.lock() {
            return false;
        }
        match self.reload() {
            Ok(()) => {
                tracing::info!(cert = %self.cert.display(), "TLS certificate changed on disk: reloaded");
                true
            }
            Err(e) => {
                *self.stamp.lock() = stamps;
                tracing::warn!(error = %e, "TLS certificate changed on disk but could not be read; the previous one stays");
                false
            }
        }
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

/// A chain and key from PEM files, the key checked to match the certificate.
fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey> {
    let reading = |p: &Path| format!("reading {}", p.display());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<std::result::Result<_, _>>())
        .map_err(|e| setup(reading(cert), e))?;
    if chain.is_empty() {
        return Err(setup(reading(cert), "no certificate in the file"));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| setup(reading(key), e))?;
    CertifiedKey::from_der(chain, der, provider)
        .map_err(|e| setup(format!("{} with {}", cert.display(), key.display()), e))
}

/// Client certificates: verified against the CAs in `ca` (PEM); `required` refuses a
/// handshake without one (otherwise a client without a certificate logs in with a password,
/// while a certificate that does not verify is still refused).
#[derive(Debug, Clone)]
pub struct ClientCerts<'a> {
    /// The CA file.
    pub ca: &'a Path,
    /// Whether every client must present a certificate.
    pub required: bool,
}

/// A server configuration serving `certs`, verifying client certificates when asked, and
/// offering `alpn` protocols.
pub fn server_config(
    certs: Arc<CertFiles>,
    clients: Option<ClientCerts<'_>>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>> {
    let p = provider();
    let builder = ServerConfig::builder_with_provider(p.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| setup("TLS configuration", e))?;
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let reading = || format!("reading {}", c.ca.display());
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(c.ca).map_err(|e| setup(reading(), e))? {
                let cert = cert.map_err(|e| setup(reading(), e))?;
                roots.add(cert).map_err(|e| setup(reading(), e))?;
            }
            let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), p);
            if !c.required {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier.build().map_err(|e| setup(reading(), e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(certs);
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The first subject common name (OID 2.5.4.3) of a DER certificate, if it has one as
/// text: a walk of the DER structure, no more (the certificate was verified already).
pub fn common_name(cert: &[u8]) -> Option<String> {
    /// (tag, contents, rest) of the first DER element of `b`.
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, b) = b.split_first()?;
        let (&first, mut b) = b.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || b.len() < n {
                return None;
            }
            let v = b[..n]
                .iter()
                .fold(0usize, |a, &x| (a << 8) | usize::from(x));
            b = &b[n..];
            v
        };
        (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
    }
    let (_, cert, _) = tlv(cert)?;
    let (_, mut tbs, _) = tlv(cert)?;
    // [0] version, if there; then serial, signature algorithm, issuer, validity.
    if tbs.first() == Some(&0xa0) {
        tbs = tlv(tbs)?.2;
    }
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (_, mut names, _) = tlv(tbs)?;
    while !names.is_empty() {
        let (_, mut set, rest) = tlv(names)?;
        names = rest;
        while !set.is_empty() {
            let (_, pair, rest) = tlv(set)?;
            set = rest;
            let (tag, oid, value) = tlv(pair)?;
            if tag == 0x06 && oid == [0x55, 0x04, 0x03] {
                let (kind, text, _) = tlv(value)?;
                // UTF8String, PrintableString, IA5String.
                if matches!(kind, 0x0c | 0x13 | 0x16) {
                    return std::str::from_utf8(text).ok().map(str::to_owned);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650
    /// -subj "/O=Plant/CN=dev-7"`.
    const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBlDCCATugAwIBAgIUCyofqZzmwBAZ9CjiRCJTeTXfYBQwCgYIKoZIzj0EAwIw
IDEOMAwGA1UECgwFUGxhbnQxDjAMBgNVBAMMBWRldi03MB4XDTI2MTEyNjE4MDYz
MFoXDTM2MTEyMzE4MDYzMFowIDEOMAwGA1UECgwFUGxhbnQxDjAMBgNVBAMMBWRl
di03MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE/5VoIQnbg2quSg4Evq+oh7Z3
0rzDxlKmAx00waDUlFAWdQQwZovYODBEHrz+I+temvASR/cdnEPZ8P69yBq8G6NT
MFEwHQYDVR0OBBYEFAMpHn0YfFFygIaZYw8SzrmtzjnYMB8GA1UdIwQYMBaAFAMp
Hn0YfFFygIaZYw8SzrmtzjnYMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwID
RwAwRAIgVm3iG1b1Ys1V25EIDTskrvbGmL/lK+fsjfrgX8CCVzUCIFowlrb9hL1z
FBdCzaR7xO09s8zk05EB5o/c0AWIcdV0
-----END CERTIFICATE-----";

    #[test]
    fn common_name_of_a_certificate_and_no_panic_on_garbage() {
        let der = CertificateDer::from_pem_slice(CERT.as_bytes()).unwrap();
        assert_eq!(common_name(&der).as_deref(), Some("dev-7"));
        // Every cut of it, and junk, without a panic.
        for cut in 0..der.len() {
            assert_eq!(common_name(&der[..cut]), None);
        }
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let _ = common_name(&junk);
        }
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
