//! TLS for tests: a certificate authority made per run (with a server
//! certificate for `localhost` and 127.0.0.1, an expired one, and a second
//! CA that signed none of them), and a TLS-terminating proxy in front of a
//! plaintext server — how the tests put TLS in front of tansu, whose own
//! TLS listener cannot be configured from its command line in 0.6.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

/// A server certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct ServerCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The files of one run's CA, in a directory removed on drop.
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
    /// The CA that signed `server` and `expired`.
    pub ca: PathBuf,
    /// A CA that signed nothing here: a client trusting only it must refuse.
    pub other_ca: PathBuf,
    /// Valid now, for `localhost` and 127.0.0.1.
    pub server: ServerCert,
    /// The same names, expired yesterday.
    pub expired: ServerCert,
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, name);
    params.distinguished_name = subject;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = OffsetDateTime::now_utc() - Duration::days(2);
    params.not_after = OffsetDateTime::now_utc() + Duration::days(2);
    params
}

fn server_params(not_before: OffsetDateTime, not_after: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, "localhost");
    params.distinguished_name = subject;
    params.not_before = not_before;
    params.not_after = not_after;
    params
}

impl TestCa {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("entrega-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = CertifiedIssuer::self_signed(
            ca_params("entrega test CA"),
            KeyPair::generate().unwrap(),
        )
        .unwrap();
        let other =
            CertifiedIssuer::self_signed(ca_params("another CA"), KeyPair::generate().unwrap())
                .unwrap();
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let now = OffsetDateTime::now_utc();
        let sign = |name: &str, params: CertificateParams| {
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            ServerCert {
                cert: write(&format!("{name}.pem"), &cert.pem()),
                key: write(&format!("{name}.key"), &key.serialize_pem()),
            }
        };
        let server = sign(
            "server",
            server_params(now - Duration::days(1), now + Duration::days(1)),
        );
        let expired = sign(
            "expired",
            server_params(now - Duration::days(2), now - Duration::days(1)),
        );
        Self {
            ca: write("ca.pem", &ca.pem()),
            other_ca: write("other-ca.pem", &other.pem()),
            server,
            expired,
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server side of TLS with `cert`, by aws-lc (one provider named, so
/// that another crate's choice of default cannot make it ambiguous).
pub fn server_config(cert: &ServerCert) -> Arc<ServerConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&cert.key).unwrap();
    let config = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    Arc::new(config)
}

/// Accepts TLS on a loopback port and forwards the plaintext to `upstream`.
/// Bind first ([`TlsProxy::bind`]) when the upstream must be told the
/// proxy's address before it starts (a broker advertises it).
#[derive(Debug)]
pub struct TlsProxy {
    pub address: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

/// A bound listener, not yet forwarding.
#[derive(Debug)]
pub struct BoundTlsProxy {
    listener: TcpListener,
    pub address: SocketAddr,
}

impl TlsProxy {
    pub async fn bind() -> BoundTlsProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        BoundTlsProxy { listener, address }
    }
}

impl BoundTlsProxy {
    pub fn start(self, upstream: SocketAddr, cert: &ServerCert) -> TlsProxy {
        let acceptor = TlsAcceptor::from(server_config(cert));
        let listener = self.listener;
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that fails the handshake is the client's
                    // problem: it sees the alert; the proxy goes on.
                    let Ok(mut client) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        TlsProxy {
            address: self.address,
            accepting,
        }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}
