//! TLS for the tests: an HTTPS front, with a CA of its own, for a plain server.

/// An HTTPS front for a server on `backend` (the mock): TLS for `localhost` with a certificate signed by a CA
/// made here (one that expired in 2020 when `expired`), each connection relayed to the
/// mock's plain port. Returns its port and the CA's PEM.
pub fn tls_front(
    rt: &tokio::runtime::Runtime,
    backend: std::net::SocketAddr,
    expired: bool,
) -> (u16, String) {
    use tokio_rustls::rustls;
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    if expired {
        leaf.not_before = rcgen::date_time_ymd(2019, 1, 1);
        leaf.not_after = rcgen::date_time_ymd(2020, 1, 1);
    }
    let leaf = leaf.signed_by(&key, &ca, &ca_key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake: nothing to relay.
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                if let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    (port, ca.pem())
}
