//! `[mqtt]`: the broker URL, TLS files, credentials.

use super::*;
use tokio_rustls::rustls::{
    self, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer},
};

/// A broker URL, parsed: `mqtt://host[:port]` or `mqtts://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttUrl {
    /// `mqtts://`.
    pub tls: bool,
    /// A name or an address (an IPv6 one without its brackets).
    pub host: String,
    /// The given port, else [`MQTT_PORT`] or [`MQTTS_PORT`].
    pub port: u16,
}

/// Parses a broker URL. Messages never repeat the url (it might hold a
/// password).
pub fn parse_mqtt_url(url: &str) -> Result<MqttUrl, String> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtts://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("mqtt://") {
        (false, rest)
    } else {
        return Err("`url` must start with mqtt:// or mqtts://".to_owned());
    };
    if rest.contains('@') {
        return Err(
            "`url` must not hold credentials: use `username` and `password_file`".to_owned(),
        );
    }
    if rest.contains(['/', '?', '#']) {
        return Err("`url` must be mqtt(s)://host[:port], with no path or query".to_owned());
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err("`url` has an unclosed [ in its host".to_owned());
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("`url` host in [ ] is not an IPv6 address".to_owned());
        }
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err("`url` has text after its host".to_owned()),
            },
        };
        (addr.to_owned(), port)
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (rest.to_owned(), None),
        }
    };
    if !rest.starts_with('[')
        && (host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')))
    {
        return Err("`url` needs a host name or address (A-Z a-z 0-9 . - _)".to_owned());
    }
    let port = match port {
        None => {
            if tls {
                MQTTS_PORT
            } else {
                MQTT_PORT
            }
        }
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err("`url` port must be 1..=65535".to_owned()),
        },
    };
    Ok(MqttUrl { tls, host, port })
}

pub(super) fn read_mqtt(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    base: &Path,
    hub_id: &str,
) -> Option<MqttConfig> {
    let t = root.table(
        d,
        "mqtt",
        "[mqtt]",
        &[
            "url",
            "client_id",
            "topic_prefix",
            "ca_file",
            "cert_file",
            "key_file",
            "username",
            "password_file",
        ],
        true,
    )?;
    let mut ok = true;
    let url = t
        .str(d, "url", true)
        .and_then(|(s, span)| match parse_mqtt_url(s) {
            Ok(parsed) => Some((s.to_owned(), parsed)),
            Err(m) => {
                d.at(span, m);
                None
            }
        });
    let tls = url.as_ref().map(|(_, u)| u.tls);

    let client_id = match t.get("client_id") {
        None => Some(hub_id.to_owned()),
        Some(_) => t.str(d, "client_id", false).and_then(|(s, span)| {
            if s.is_empty() || s.len() > 65535 || s.chars().any(char::is_control) {
                d.at(
                    span,
                    "`client_id` must be a non-empty string without control characters",
                );
                None
            } else {
                Some(s.to_owned())
            }
        }),
    };
    let topic_prefix = match t.get("topic_prefix") {
        None => Some(lockhub_proto::topics::DEFAULT_PREFIX.to_owned()),
        Some(_) => t.str(d, "topic_prefix", false).and_then(|(s, span)| {
            let bad = s.is_empty()
                || s.starts_with('/')
                || s.ends_with('/')
                || s.contains("//")
                || s.contains(['+', '#', '\0']);
            if bad {
                d.at(
                    span,
                    "`topic_prefix` must be topic levels joined by / (no wildcards, no empty level, no leading or trailing /)",
                );
                None
            } else {
                Some(s.to_owned())
            }
        }),
    };

    // TLS files: only with mqtts://, and then the CA is required (the hub
    // bundles no root store) and a client certificate comes with its key.
    let mut file = |d: &mut Diag<'_>, key: &str| -> Option<(PathBuf, Range<usize>)> {
        let before = d.errors.len();
        let r = t.path(d, key, false, base);
        if d.errors.len() != before {
            ok = false;
        }
        r
    };
    let ca = file(d, "ca_file");
    let cert = file(d, "cert_file");
    let key = file(d, "key_file");
    let password = file(d, "password_file");
    let username = t.text(d, "username", false);
    if t.get("username").is_some() && username.is_none() {
        ok = false;
    }

    if tls == Some(false) {
        for (name, f) in [("ca_file", &ca), ("cert_file", &cert), ("key_file", &key)] {
            if let Some((_, span)) = f {
                d.at(
                    span.clone(),
                    format!("`{name}` is only used with mqtts:// (the url is mqtt://)"),
                );
                ok = false;
            }
        }
    }
    if tls == Some(true) && ca.is_none() && t.get("ca_file").is_none() {
        d.at(
            t.span.clone(),
            "mqtts:// needs `ca_file` (the CA that signed the broker's certificate)",
        );
        ok = false;
    }
    match (&cert, &key) {
        (Some((_, span)), None) if t.get("key_file").is_none() => {
            d.at(span.clone(), "`cert_file` needs `key_file`");
            ok = false;
        }
        (None, Some((_, span))) if t.get("cert_file").is_none() => {
            d.at(span.clone(), "`key_file` needs `cert_file`");
            ok = false;
        }
        _ => {}
    }
    if let Some((_, span)) = &password
        && t.get("username").is_none()
    {
        d.at(span.clone(), "`password_file` needs `username`");
        ok = false;
    }

    if tls == Some(true) {
        if let Some((p, span)) = &ca {
            if check_file(d, "ca_file", p, span).is_none() {
                ok = false;
            } else if let Err(m) = read_roots(p) {
                d.at(span.clone(), format!("`ca_file` {} {m}", p.display()));
                ok = false;
            }
        }
        let cert_ok = cert
            .as_ref()
            .map(|(p, span)| check_file(d, "cert_file", p, span).is_some());
        let key_ok = key
            .as_ref()
            .map(|(p, span)| match check_file(d, "key_file", p, span) {
                None => false,
                Some(meta) => {
                    let before = d.errors.len();
                    check_private(d, "key_file", "the MQTT client key", p, &meta, span);
                    d.errors.len() == before
                }
            });
        ok &= cert_ok != Some(false) && key_ok != Some(false);
        if let (Some((c, c_span)), Some((k, k_span)), Some(true), Some(true)) =
            (&cert, &key, cert_ok, key_ok)
        {
            match read_client_identity(c, k) {
                Ok(_) => {}
                Err(IdentityError::Cert(m)) => {
                    d.at(c_span.clone(), format!("`cert_file` {} {m}", c.display()));
                    ok = false;
                }
                Err(IdentityError::Key(m)) => {
                    d.at(k_span.clone(), format!("`key_file` {} {m}", k.display()));
                    ok = false;
                }
            }
        }
    }
    if let Some((p, span)) = &password {
        match check_file(d, "password_file", p, span) {
            None => ok = false,
            Some(meta) => {
                let before = d.errors.len();
                check_private(d, "password_file", "the MQTT password file", p, &meta, span);
                match std::fs::read(p) {
                    Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {
                        d.at(
                            span.clone(),
                            format!("`password_file` {} is empty", p.display()),
                        );
                    }
                    // The connection reads it as text.
                    Ok(bytes) if std::str::from_utf8(&bytes).is_err() => {
                        d.at(
                            span.clone(),
                            format!("`password_file` {} is not UTF-8 text", p.display()),
                        );
                    }
                    Ok(_) => {}
                    Err(e) => d.at(
                        span.clone(),
                        format!("`password_file` {} {}", p.display(), io_message(&e)),
                    ),
                }
                ok &= d.errors.len() == before;
            }
        }
    }

    let (url, MqttUrl { tls, host, port }) = url?;
    if !ok {
        return None;
    }
    Some(MqttConfig {
        url,
        tls,
        host,
        port,
        client_id: client_id?,
        topic_prefix: topic_prefix?,
        ca_file: ca.map(|f| f.0),
        cert_file: cert.map(|f| f.0),
        key_file: key.map(|f| f.0),
        username: username.map(|u| u.0.to_owned()),
        password_file: password.map(|f| f.0),
    })
}

// The TLS files, read as the connection uses them. check-config and the
// connection (`sync::client::tls_config`) both read them here, so a file
// check-config passes is one the connection can use: a CA rustls accepts as
// a root, a client key of a supported type that matches its certificate.

/// The certificates of `ca_file`, each accepted as a root. The message
/// says what is wrong, never what the file holds.
pub fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let pem = std::fs::read(path).map_err(|e| io_message(&e))?;
    let mut roots = RootCertStore::empty();
    for (n, cert) in rustls_pemfile::certs(&mut pem.as_slice()).enumerate() {
        let cert = cert.map_err(|e| format!("holds a PEM block that does not parse ({e})"))?;
        roots.add(cert).map_err(|e| {
            format!(
                "holds certificate {} that is not usable as a CA ({e})",
                n + 1
            )
        })?;
    }
    if roots.is_empty() {
        return Err("holds no PEM certificate".to_owned());
    }
    Ok(roots)
}

/// Which of the client's two files is at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityError {
    Cert(String),
    Key(String),
}

/// The client's identity from `cert_file` and `key_file`: the chain, and
/// its key checked to be of a supported type and to match the chain's
/// first certificate (a key paired with the wrong certificate is the
/// usual mistake).
pub fn read_client_identity(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), IdentityError> {
    let pem = std::fs::read(cert).map_err(|e| IdentityError::Cert(io_message(&e)))?;
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| IdentityError::Cert(format!("holds a PEM block that does not parse ({e})")))?;
    if chain.is_empty() {
        return Err(IdentityError::Cert("holds no PEM certificate".to_owned()));
    }
    let pem = std::fs::read(key).map_err(|e| IdentityError::Key(io_message(&e)))?;
    let private = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|_| IdentityError::Key("holds a PEM block that does not parse".to_owned()))?
        .ok_or_else(|| IdentityError::Key("holds no PEM private key".to_owned()))?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain.clone(), private.clone_key(), &provider).map_err(
        |e| match e {
            rustls::Error::InconsistentKeys(_) => {
                IdentityError::Key("does not match the certificate in `cert_file`".to_owned())
            }
            _ => IdentityError::Key(format!("holds a key rustls cannot use ({e})")),
        },
    )?;
    Ok((chain, private))
}
