//! A throwaway fleet PKI generated at test time: a CA, a broker certificate for loopback, and one
//! client certificate per machine or gateway, whose CN is the identity the broker's ACL sees.
//!
//! Invariants:
//! - Keys never leave the temporary directory owned by [`FleetPki`]; they are not reused across runs.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::mosquitto::BrokerTls;
use crate::{HarnessError, Result};

/// A certificate and its key, as PEM text and as files.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Common name (the machine or gateway id).
    pub common_name: String,
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PKCS#8 PEM.
    pub key_pem: String,
    /// Certificate file.
    pub cert_file: PathBuf,
    /// Key file.
    pub key_file: PathBuf,
}

/// The fleet CA and what it issued.
pub struct FleetPki {
    dir: tempfile::TempDir,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    ca_pem: String,
}

impl FleetPki {
    /// Generates a new CA in a new temporary directory.
    pub fn generate() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("edgewatch-pki-")
            .tempdir()
            .map_err(HarnessError::io("creating the PKI directory"))?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name = name("edgewatch test fleet CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_pem = ca_params.self_signed(&ca_key)?.pem();
        write(&dir.path().join("ca.crt"), &ca_pem)?;
        Ok(Self {
            dir,
            ca_params,
            ca_key,
            ca_pem,
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// Issues the broker's certificate (SAN `127.0.0.1` and `localhost`) and returns the broker's
    /// TLS settings.
    pub fn broker_tls(&self) -> Result<BrokerTls> {
        let identity = self.issue(
            "broker",
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        Ok(BrokerTls {
            ca_file: self.ca_file(),
            cert_file: identity.cert_file,
            key_file: identity.key_file,
            crl_file: None,
        })
    }

    /// Issues a client certificate whose CN is `common_name`.
    pub fn issue_client(&self, common_name: &str) -> Result<Identity> {
        self.issue(common_name, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(
        &self,
        common_name: &str,
        subject_alt_names: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<Identity> {
        let mut params = CertificateParams::new(subject_alt_names)?;
        params.distinguished_name = name(common_name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert_pem = params.signed_by(&key, &issuer)?.pem();
        let key_pem = key.serialize_pem();
        let cert_file = self.dir.path().join(format!("{common_name}.crt"));
        let key_file = self.dir.path().join(format!("{common_name}.key"));
        write(&cert_file, &cert_pem)?;
        write(&key_file, &key_pem)?;
        Ok(Identity {
            common_name: common_name.to_owned(),
            cert_pem,
            key_pem,
            cert_file,
            key_file,
        })
    }

    /// The directory holding every PEM file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(HarnessError::io(format!("writing {}", path.display())))
}
