//! The TLS files of the xDS section, read and checked through rustls
//! (ring): the CA that signs the management server's certificate and, for
//! mutual TLS, this appliance's certificate and key. Every file is checked
//! here, with a message that names the file and what is wrong with it,
//! before tonic sees it (tonic silently skips a CA it cannot parse).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read the {what} {}: {source}", path.display())]
    Read {
        /// Which file (`CA certificate`, `client certificate`, `client key`).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is larger than any certificate or key.
    #[error("the {what} {} is larger than {MAX_PEM_BYTES} bytes: not a certificate or key file", path.display())]
    TooLarge {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
    },
    /// A file holds no PEM certificate, or a broken one.
    #[error("the {what} {} is not a PEM certificate: {reason}", path.display())]
    BadCertificate {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key file holds no usable private key.
    #[error("the client key {} is not a usable PEM private key: {reason}", path.display())]
    BadKey {
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key is not the certificate's.
    #[error("the client key {} does not go with the client certificate {}: {reason}", key.display(), cert.display())]
    Mismatch {
        /// The certificate.
        cert: PathBuf,
        /// The key.
        key: PathBuf,
        /// What rustls says.
        reason: String,
    },
}

impl TlsError {
    /// True when the problem is the key file's (to report it at its key in
    /// the configuration).
    pub(crate) fn is_about_key(&self) -> bool {
        match self {
            TlsError::Read { what, .. } | TlsError::TooLarge { what, .. } => *what == "client key",
            TlsError::BadKey { .. } => true,
            TlsError::BadCertificate { .. } | TlsError::Mismatch { .. } => false,
        }
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|source| TlsError::Read { what, path: path.to_owned(), source })?;
    let mut buf = Vec::new();
    f.take(MAX_PEM_BYTES + 1).read_to_end(&mut buf).map_err(|source| TlsError::Read { what, path: path.to_owned(), source })?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(TlsError::TooLarge { what, path: path.to_owned() });
    }
    Ok(buf)
}

fn certificates(what: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::BadCertificate { what, path: path.to_owned(), reason };
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pem).collect::<Result<_, _>>().map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no \"BEGIN CERTIFICATE\" block".into()));
    }
    Ok(certs)
}

/// The CA file, checked: PEM certificates that rustls accepts as trust anchors.
pub fn read_ca(path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read("CA certificate", path)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates("CA certificate", path, &pem)? {
        roots.add(c).map_err(|e| TlsError::BadCertificate {
            what: "CA certificate",
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(pem)
}

/// The client certificate and key, checked: parseable, and the key is the
/// certificate's.
pub fn read_identity(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let cert_pem = read("client certificate", cert)?;
    let key_pem = read("client key", key)?;
    let chain = certificates("client certificate", cert, &cert_pem)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::BadKey { path: key.to_owned(), reason: e.to_string() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::BadKey { path: key.to_owned(), reason: e.to_string() })?
        .with_root_certificates(rustls::RootCertStore::empty());
    builder.with_client_auth_cert(chain, private).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            TlsError::Mismatch { cert: cert.to_owned(), key: key.to_owned(), reason: e.to_string() }
        }
        other => TlsError::BadKey { path: key.to_owned(), reason: other.to_string() },
    })?;
    Ok((cert_pem, key_pem))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("sluice-xds-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn pair(name: &str) -> (String, String) {
        let k = rcgen::KeyPair::generate().unwrap();
        let c = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap().self_signed(&k).unwrap();
        (c.pem(), k.serialize_pem())
    }

    #[test]
    fn files_are_checked_with_a_reason() {
        let d = dir("files");
        let (cert, key) = pair("client");
        let (_, other_key) = pair("other");
        let w = |n: &str, t: &str| {
            let p = d.0.join(n);
            std::fs::write(&p, t).unwrap();
            p
        };
        let (c, k, k2) = (w("c.pem", &cert), w("k.pem", &key), w("k2.pem", &other_key));
        let junk = w("junk.pem", "hello\n");
        let broken = w("broken.pem", "-----BEGIN CERTIFICATE-----\nAAAA!!\n-----END CERTIFICATE-----\n");
        assert!(read_ca(&c).is_ok());
        assert!(read_identity(&c, &k).is_ok());
        let e = read_ca(&d.0.join("missing.pem")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read the CA certificate ") && e.contains("No such file"), "{e}");
        let e = read_ca(&junk).unwrap_err().to_string();
        assert!(e.contains("is not a PEM certificate: no \"BEGIN CERTIFICATE\" block"), "{e}");
        assert!(read_ca(&broken).unwrap_err().to_string().contains("is not a PEM certificate"));
        let e = read_identity(&c, &k2).unwrap_err();
        assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
        assert!(!e.is_about_key());
        let e = read_identity(&c, &junk).unwrap_err();
        assert!(e.is_about_key() && e.to_string().contains("not a usable PEM private key"), "{e}");
        let e = read_identity(&k, &k).unwrap_err();
        assert!(!e.is_about_key() && e.to_string().contains("client certificate"), "{e}");
    }
}
