//! TLS to the management server: the tonic settings built from the files
//! of the `xds-control-plane` section, read and checked again at every
//! connection ([`crate::config::tls`]), so renewed certificates are picked
//! up without a restart.

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::config::tls::{read_ca, read_identity, TlsError};
use crate::config::xds::TlsPaths;

/// The tonic TLS settings for `paths`, verifying the server as `host`;
/// every file read now.
pub(super) fn client_config(paths: &TlsPaths, host: &str) -> Result<ClientTlsConfig, TlsError> {
    let ca = read_ca(&paths.ca)?;
    let mut cfg = ClientTlsConfig::new().domain_name(host).ca_certificate(Certificate::from_pem(ca));
    if let Some((c, k)) = &paths.client {
        let (cert, key) = read_identity(c, k)?;
        cfg = cfg.identity(Identity::from_pem(cert, key));
    }
    Ok(cfg)
}
