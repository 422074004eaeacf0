//! TLS for the outbound clients (InfluxDB, OTLP over HTTP and gRPC, Pushgateway): one
//! [`TlsConfig`] per sink, read from the sink's `tls` table (`[influxdb.tls]`, `[otlp.tls]`,
//! `[pushgateway.tls]`).
//!
//! With the `tls` cargo feature (on by default in the `gpumon` facade) an `https://` URL is
//! verified against the system's CA certificates (rustls-native-certs), or, when `ca_file` is
//! set, against that file only (a private CA). `client_cert_file` + `client_key_file` present a
//! client certificate (mutual TLS). `insecure_skip_verify` turns verification off — encrypted but
//! not authenticated — and is logged as a warning whenever a client is built with it.
//!
//! ```toml
//! [influxdb.tls]
//! ca_file = "/etc/gpumon/ca.pem"            # PEM, one or more certificates
//! client_cert_file = "/etc/gpumon/client.pem"
//! client_key_file = "/etc/gpumon/client.key" # PKCS#8, PKCS#1 or SEC1 PEM
//! # insecure_skip_verify = true             # never in production
//! ```
//!
//! rustls uses the `ring` crypto provider. reqwest's rustls needs a process-wide provider: the
//! sinks install ring when they build a client, unless the process already has one (an
//! embedder's choice wins). An embedder that builds its own reqwest clients before any sink can
//! call [`install_crypto_provider`] first.

// With `tls` but no client sink (only `install_crypto_provider` is of use then), the helpers
// for the clients have no caller.
#![cfg_attr(not(any(feature = "_http-client", feature = "otlp")), allow(dead_code, unused_imports))]

use std::path::PathBuf;

use gpumon_core::BuildError;

/// TLS settings of one outbound client. All optional: the default verifies `https://` servers
/// against the system's CA certificates and presents no client certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TlsConfig {
    /// PEM file of the CA certificate(s) that sign the server's certificate. When set, only these
    /// are trusted (the system's store is not used).
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate chain (mutual TLS); needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub client_key_file: Option<PathBuf>,
    /// Accept any server certificate. The connection is encrypted but anyone on the path can
    /// impersonate the server; a warning is logged when a client is built with it.
    pub insecure_skip_verify: bool,
}

impl TlsConfig {
    /// A config trusting only the CA certificates in `ca_file`.
    pub fn with_ca_file(ca_file: impl Into<PathBuf>) -> Self {
        Self { ca_file: Some(ca_file.into()), ..Self::default() }
    }

    /// Adds a client certificate and its key (mutual TLS).
    pub fn client_cert(mut self, cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        self.client_cert_file = Some(cert_file.into());
        self.client_key_file = Some(key_file.into());
        self
    }

    /// Whether any setting differs from the default.
    pub fn is_set(&self) -> bool {
        self != &Self::default()
    }

    /// Checks the settings and the URL's scheme together. `url_key` names the URL setting
    /// (`influxdb.url`), `key` the TLS table (`influxdb.tls`).
    ///
    /// # Errors
    /// A scheme other than http/https; https in a build without the `tls` feature; TLS settings
    /// with an `http://` URL (they would silently do nothing); a certificate without its key.
    pub(crate) fn check(&self, key: &str, url_key: &str, url: &reqwest::Url) -> Result<(), BuildError> {
        let endpoint = || url.as_str().to_owned();
        match url.scheme() {
            "http" if self.is_set() => {
                return Err(BuildError::invalid(
                    key,
                    format!("is set but `{url_key}` ({url}) is http://; use https:// or remove the TLS settings"),
                ))
            }
            "http" => {}
            "https" if !cfg!(feature = "tls") => {
                return Err(BuildError::InvalidEndpoint {
                    endpoint: endpoint(),
                    reason: format!(
                        "{url_key}: https needs the `tls` cargo feature of gpumon-sinks (on by default in gpumon); \
                         rebuild with it or use http://"
                    ),
                })
            }
            "https" => {}
            other => {
                return Err(BuildError::InvalidEndpoint {
                    endpoint: endpoint(),
                    reason: format!("{url_key}: scheme `{other}` is not supported; use http:// or https://"),
                })
            }
        }
        match (&self.client_cert_file, &self.client_key_file) {
            (Some(_), None) => {
                Err(BuildError::invalid(format!("{key}.client_key_file"), "required with `client_cert_file`"))
            }
            (None, Some(_)) => {
                Err(BuildError::invalid(format!("{key}.client_cert_file"), "required with `client_key_file`"))
            }
            _ => Ok(()),
        }
    }
}

/// Whether a transport error's text (its whole cause chain) says this client refused the
/// server's certificate: a setting to fix (the CA file, the URL's host), not an outage to wait
/// out, so the push sinks do not retry it as one.
pub(crate) fn certificate_refused(detail: &str) -> bool {
    detail.contains("invalid peer certificate") || detail.contains("InvalidCertificate")
}

/// A hint appended to a transport error whose cause is a rejected server certificate, naming
/// the sink's own key (`key` is its TLS table, `influxdb.tls`): no list of sinks to keep here.
pub(crate) fn certificate_hint(detail: &str, key: &str) -> String {
    if !certificate_refused(detail) {
        return String::new();
    }
    if key.is_empty() {
        return " (the server's certificate is not trusted: check the TLS ca_file)".to_owned();
    }
    format!(" (the server's certificate is not trusted: check {key}.ca_file)")
}

#[cfg(all(feature = "tls", feature = "otlp"))]
pub(crate) use imp::client_config;
#[cfg(feature = "tls")]
pub use imp::install_crypto_provider;
#[cfg(feature = "tls")]
pub(crate) use imp::reqwest_tls;

/// A lazily connecting gRPC channel to `endpoint` (`http://` or, with the `tls` feature,
/// `https://` with the settings of `tls`). Must be called inside a tokio runtime.
#[cfg(feature = "otlp-grpc")]
pub(crate) fn grpc_channel(
    tls: &TlsConfig,
    key: &str,
    endpoint: &str,
    timeout: std::time::Duration,
) -> Result<tonic::transport::Channel, BuildError> {
    let invalid = |reason: String| BuildError::InvalidEndpoint { endpoint: endpoint.to_owned(), reason };
    let url = reqwest::Url::parse(endpoint).map_err(|e| invalid(e.to_string()))?;
    if url.scheme() == "https" {
        #[cfg(feature = "tls")]
        return imp::tls_channel(tls, key, &url, timeout);
    }
    let _ = (tls, key);
    Ok(tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| invalid(e.to_string()))?
        .timeout(timeout)
        .connect_timeout(timeout)
        .connect_lazy())
}

/// Without the `tls` feature: nothing to install, URLs are http:// (checked by `TlsConfig::check`).
#[cfg(not(feature = "tls"))]
pub(crate) fn reqwest_tls(
    builder: reqwest::ClientBuilder,
    _tls: &TlsConfig,
    _key: &str,
    _url: &reqwest::Url,
) -> Result<reqwest::ClientBuilder, BuildError> {
    Ok(builder)
}

#[cfg(feature = "tls")]
mod imp {
    use std::sync::{Arc, OnceLock};

    use gpumon_core::BuildError;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

    use super::TlsConfig;

    /// The process-wide rustls crypto provider: the one already installed (by the embedder, or
    /// by an earlier call), else `ring`, installed now. reqwest's rustls panics when it builds a
    /// client without one, so every sink calls this before building its client.
    pub fn install_crypto_provider() -> Arc<CryptoProvider> {
        if let Some(p) = CryptoProvider::get_default() {
            return p.clone();
        }
        // Err means another thread installed one between the check and here: use theirs.
        let _ = rustls::crypto::ring::default_provider().install_default();
        CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
    }

    /// The system's CA certificates, loaded once per process.
    fn native_roots() -> Result<Arc<RootCertStore>, String> {
        static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
        ROOTS
            .get_or_init(|| {
                let loaded = rustls_native_certs::load_native_certs();
                let mut store = RootCertStore::empty();
                let (added, _ignored) = store.add_parsable_certificates(loaded.certs);
                if added == 0 {
                    let why = loaded.errors.first().map(|e| format!(" ({e})")).unwrap_or_default();
                    return Err(format!(
                        "no system CA certificates found{why}; install the ca-certificates package or set `ca_file`"
                    ));
                }
                Ok(Arc::new(store))
            })
            .clone()
    }

    fn read_certs(setting: &str, path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, BuildError> {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| BuildError::invalid(setting, format!("cannot read `{}`: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(BuildError::invalid(
                setting,
                format!("`{}` holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display()),
            ));
        }
        Ok(certs)
    }

    /// A client configuration with `provider` and its safe protocol versions, before its
    /// verifier is chosen. `key` names the TLS table in errors.
    fn config_builder(
        provider: &Arc<CryptoProvider>,
        key: &str,
    ) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, BuildError> {
        ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| BuildError::invalid(key, format!("the installed rustls crypto provider cannot do TLS: {e}")))
    }

    /// The rustls client configuration for `url` (whose scheme is https), offering `alpn`.
    /// `key` names the TLS table in errors (`influxdb.tls`).
    ///
    /// # Errors
    /// An unreadable or empty file, a key that does not match the certificate, no system CA
    /// certificates: each naming the setting and the file.
    pub(crate) fn client_config(
        tls: &TlsConfig,
        key: &str,
        url: &str,
        alpn: &[&[u8]],
    ) -> Result<ClientConfig, BuildError> {
        let provider = install_crypto_provider();
        let builder = config_builder(&provider, key)?;
        let builder = if tls.insecure_skip_verify {
            tracing::warn!(
                url,
                "{key}.insecure_skip_verify is set: the server's certificate is NOT verified; the connection is \
                 encrypted but anyone on the path can impersonate the server"
            );
            builder.dangerous().with_custom_certificate_verifier(Verifier::new(provider, Trust::Anything))
        } else if let Some(path) = &tls.ca_file {
            let setting = format!("{key}.ca_file");
            let mut roots = RootCertStore::empty();
            for cert in read_certs(&setting, path)? {
                roots.add(cert).map_err(|e| {
                    BuildError::invalid(&setting, format!("`{}`: not a usable CA certificate: {e}", path.display()))
                })?;
            }
            builder.with_root_certificates(roots)
        } else {
            let roots = native_roots().map_err(|reason| BuildError::invalid(format!("{key}.ca_file"), reason))?;
            builder.with_root_certificates(roots)
        };
        let mut config = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key_file)) => {
                let chain = read_certs(&format!("{key}.client_cert_file"), cert)?;
                let private = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
                    BuildError::invalid(
                        format!("{key}.client_key_file"),
                        format!("cannot read a PEM private key from `{}`: {e}", key_file.display()),
                    )
                })?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    BuildError::invalid(
                        format!("{key}.client_key_file"),
                        format!("`{}` does not fit `{}`: {e}", key_file.display(), cert.display()),
                    )
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// Installs the provider, and for an https `url` gives `builder` the TLS configuration of
    /// `tls` (HTTP/1.1 only: the clients are built without HTTP/2).
    pub(crate) fn reqwest_tls(
        builder: reqwest::ClientBuilder,
        tls: &TlsConfig,
        key: &str,
        url: &reqwest::Url,
    ) -> Result<reqwest::ClientBuilder, BuildError> {
        let provider = install_crypto_provider();
        if url.scheme() != "https" {
            return Ok(builder.use_preconfigured_tls(plain_http_config(provider, key)?));
        }
        Ok(builder.use_preconfigured_tls(client_config(tls, key, url.as_str(), &[b"http/1.1"])?))
    }

    /// The TLS configuration of a client whose URL is `http://`. Left to itself, reqwest builds
    /// one when the client is built, and its platform verifier reads every system CA
    /// certificate then (≈ 2.5 ms, a quarter of the CPU of an agent's `--once` with an OTLP/HTTP
    /// sink, measured once; again for each such client) although the client may never speak
    /// TLS. This one trusts the same certificates, read when a TLS connection first needs them
    /// (a redirect to `https://`).
    fn plain_http_config(provider: Arc<CryptoProvider>, key: &str) -> Result<ClientConfig, BuildError> {
        let mut config = config_builder(&provider, key)?
            .dangerous()
            .with_custom_certificate_verifier(Verifier::new(provider, Trust::SystemOnFirstUse(OnceLock::new())))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A lazily connecting gRPC channel to `url` (https), TLS done by our own connector so that
    /// it shares the configuration (and the verifier) of the HTTP clients. tonic is given the
    /// `http://` form of the address, so that its own TLS (if another crate enabled it) stays
    /// out of the way, and the https origin for the requests' `:scheme`.
    #[cfg(feature = "otlp-grpc")]
    pub(crate) fn tls_channel(
        tls: &TlsConfig,
        key: &str,
        url: &reqwest::Url,
        timeout: std::time::Duration,
    ) -> Result<tonic::transport::Channel, BuildError> {
        let invalid = |reason: String| BuildError::InvalidEndpoint { endpoint: url.to_string(), reason };
        let config = Arc::new(client_config(tls, key, url.as_str(), &[b"h2"])?);
        let host = url.host_str().ok_or_else(|| invalid("no host".into()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = url.port_or_known_default().unwrap_or(443);
        let server_name = ServerName::try_from(host.clone()).map_err(|e| invalid(format!("host `{host}`: {e}")))?;
        let origin: tonic::transport::Uri = url.as_str().parse().map_err(|e| invalid(format!("not a URI: {e}")))?;
        let plain = format!("http://{}", origin.authority().map_or(host.as_str(), |a| a.as_str()));
        let endpoint = tonic::transport::Endpoint::from_shared(plain)
            .map_err(|e| invalid(format!("not a URI: {e}")))?
            .origin(origin)
            .timeout(timeout)
            .connect_timeout(timeout);
        let connector = tower::service_fn(move |_uri: tonic::transport::Uri| {
            let config = config.clone();
            let server_name = server_name.clone();
            let host = host.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                let stream = tokio_rustls::TlsConnector::from(config).connect(server_name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        Ok(endpoint.connect_with_connector_lazy(connector))
    }

    /// A certificate verifier of our own: which certificates it trusts is [`Trust`]; the
    /// handshake signatures are checked the same way whatever it trusts (so the key exchange is
    /// with the holder of the presented certificate).
    #[derive(Debug)]
    struct Verifier {
        provider: Arc<CryptoProvider>,
        trust: Trust,
    }

    #[derive(Debug)]
    enum Trust {
        /// `insecure_skip_verify`: any certificate.
        Anything,
        /// The system's CA certificates ([`native_roots`]), loaded at the first certificate to
        /// verify rather than when the client is built.
        SystemOnFirstUse(OnceLock<Result<Arc<WebPkiServerVerifier>, String>>),
    }

    impl Verifier {
        fn new(provider: Arc<CryptoProvider>, trust: Trust) -> Arc<Self> {
            Arc::new(Self { provider, trust })
        }
    }

    impl ServerCertVerifier for Verifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            let Trust::SystemOnFirstUse(system) = &self.trust else { return Ok(ServerCertVerified::assertion()) };
            let verifier = system.get_or_init(|| {
                native_roots().and_then(|roots| {
                    WebPkiServerVerifier::builder_with_provider(roots, self.provider.clone())
                        .build()
                        .map_err(|e| format!("cannot verify with the system's CA certificates: {e}"))
                })
            });
            match verifier {
                Ok(v) => v.verify_server_cert(end_entity, intermediates, server_name, ocsp, now),
                Err(why) => Err(rustls::Error::General(why.clone())),
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(all(test, feature = "tls", feature = "_http-client"))]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::http::test_server::{Reply, TestServer};
    use gpumon_core::error_chain;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/testdata/tls").join(name)
    }

    /// GET `url` with a client configured by `tls`: the status, or the build/transport error.
    async fn get(tls: &TlsConfig, url: &str) -> Result<u16, String> {
        let url = reqwest::Url::parse(url).unwrap();
        let builder = reqwest_tls(reqwest::Client::builder(), tls, "test.tls", &url).map_err(|e| e.to_string())?;
        let client = builder.build().map_err(|e| error_chain(&e))?;
        client.get(url).send().await.map(|r| r.status().as_u16()).map_err(|e| error_chain(&e))
    }

    #[tokio::test]
    async fn a_private_ca_is_trusted_and_a_wrong_one_is_refused_naming_the_url() {
        let server = TestServer::start_tls(Reply::status(204)).await;
        assert_eq!(get(&TlsConfig::with_ca_file(fixture("ca.pem")), &server.url).await, Ok(204));
        assert_eq!(server.requests(), 1);
        // The leaf itself is no CA: the handshake fails before any request is sent.
        let e = get(&TlsConfig::with_ca_file(fixture("localhost.pem")), &server.url).await.unwrap_err();
        assert!(e.contains("invalid peer certificate") && e.contains(&server.url), "{e}");
        assert!(certificate_hint(&e, "influxdb.tls").contains("influxdb.tls.ca_file"));
        // The system store does not know the test CA either (or there is no store at all).
        assert!(get(&TlsConfig::default(), &server.url).await.is_err());
        assert_eq!(server.requests(), 1);
    }

    #[tokio::test]
    async fn a_client_built_for_http_still_verifies_any_https_server_it_reaches() {
        // Its TLS configuration is ours (system certificates read on first use), not reqwest's;
        // it must refuse a certificate the system does not trust, before any request.
        let server = TestServer::start_tls(Reply::status(204)).await;
        let http = reqwest::Url::parse("http://127.0.0.1:1/").unwrap();
        let client =
            reqwest_tls(reqwest::Client::builder(), &TlsConfig::default(), "test.tls", &http).unwrap().build().unwrap();
        let e = error_chain(&client.get(&server.url).send().await.unwrap_err());
        assert!(e.contains("certificate"), "{e}");
        assert_eq!(server.requests(), 0);
    }

    #[tokio::test]
    async fn insecure_skip_verify_accepts_an_unknown_certificate() {
        let server = TestServer::start_tls(Reply::status(204)).await;
        let tls = TlsConfig { insecure_skip_verify: true, ..TlsConfig::default() };
        assert_eq!(get(&tls, &server.url).await, Ok(204));
    }

    #[tokio::test]
    async fn unusable_files_are_named_with_their_key() {
        let url = "https://localhost:1";
        let e = get(&TlsConfig::with_ca_file("/nonexistent/ca.pem"), url).await.unwrap_err();
        assert!(e.contains("test.tls.ca_file") && e.contains("/nonexistent/ca.pem"), "{e}");
        // A key file is no certificate file.
        let e = get(&TlsConfig::with_ca_file(fixture("localhost.key")), url).await.unwrap_err();
        assert!(e.contains("test.tls.ca_file") && e.contains("no PEM certificate"), "{e}");
        let tls = TlsConfig::with_ca_file(fixture("ca.pem")).client_cert(fixture("localhost.pem"), fixture("ca.pem"));
        let e = get(&tls, url).await.unwrap_err();
        assert!(e.contains("test.tls.client_key_file"), "{e}");
    }

    #[test]
    fn settings_are_checked_with_the_scheme() {
        let check = |tls: &TlsConfig, url: &str| tls.check("x.tls", "x.url", &reqwest::Url::parse(url).unwrap());
        assert!(check(&TlsConfig::default(), "http://h").is_ok());
        assert!(check(&TlsConfig::default(), "https://h").is_ok());
        let e = check(&TlsConfig::with_ca_file("/ca"), "http://h").unwrap_err().to_string();
        assert!(e.contains("x.tls") && e.contains("x.url") && e.contains("http://"), "{e}");
        let e = check(&TlsConfig::default(), "ftp://h").unwrap_err().to_string();
        assert!(e.contains("scheme `ftp`"), "{e}");
        let half = TlsConfig { client_key_file: Some("/k".into()), ..TlsConfig::default() };
        assert!(check(&half, "https://h").unwrap_err().to_string().contains("x.tls.client_cert_file"));
    }

    #[test]
    fn the_table_deserializes_and_rejects_unknown_keys() {
        let t: TlsConfig = toml::from_str("ca_file = \"/ca.pem\"\ninsecure_skip_verify = true\n").unwrap();
        assert_eq!(t.ca_file, Some(PathBuf::from("/ca.pem")));
        assert!(t.insecure_skip_verify && t.is_set());
        let e = toml::from_str::<TlsConfig>("ca = \"/x\"\n").unwrap_err().to_string();
        assert!(e.contains("ca"), "{e}");
    }
}
