//! What rozd reads from a certificate itself: the subject (to name a client
//! by its certificate) and its validity period (for `/v1/status`, `rozd
//! check`, and a reload that refuses a certificate clients would refuse).
//! x509-parser reads the DER; rustls and webpki have already verified (or
//! will verify) the certificate, this only reads it.

use std::fmt::Write as _;

/// What is read from a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The subject as an RFC 4514 string: most specific first, e.g.
    /// `CN=rover-1,O=Lab` (the reverse of the order in the certificate).
    pub subject: String,
    /// The subject's first common name (`CN`), if any.
    pub common_name: Option<String>,
    /// `notBefore`, seconds since the Unix epoch.
    pub not_before: i64,
    /// `notAfter`, seconds since the Unix epoch.
    pub not_after: i64,
}

/// Where a moment falls in a certificate's validity period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// `notBefore <= now <= notAfter` (RFC 5280 4.1.2.5: both ends included).
    Valid,
    /// Before `notBefore`.
    NotYetValid,
    /// After `notAfter`.
    Expired,
}

impl CertInfo {
    /// Where `now_secs` (Unix seconds) falls in this certificate's validity.
    pub fn validity(&self, now_secs: i64) -> Validity {
        if now_secs < self.not_before {
            Validity::NotYetValid
        } else if now_secs > self.not_after {
            Validity::Expired
        } else {
            Validity::Valid
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an X.509 certificate this reader understands: {0}")]
pub(crate) struct X509Error(String);

/// Reads the subject and validity of a DER certificate (x509-parser does
/// the DER; the subject's string form is rozd's own, below).
pub(crate) fn parse(der: &[u8]) -> Result<CertInfo, X509Error> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| X509Error(e.to_string()))?;
    let validity = cert.validity();
    let (subject, common_name) = subject_string(cert.subject());
    Ok(CertInfo {
        subject,
        common_name,
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
    })
}

/// A `Name`'s RFC 4514 string (most specific RDN first, multi-valued RDNs
/// joined by `+`), and its first common name. These strings are what
/// `[[server.clients]]` subjects are matched against: keep them stable
/// (`subject_strings_are_pinned`).
fn subject_string(name: &x509_parser::x509::X509Name<'_>) -> (String, Option<String>) {
    let mut parts = Vec::new();
    let mut common_name = None;
    for rdn in name.iter() {
        let mut attributes = Vec::new();
        for attribute in rdn.iter() {
            let oid = attribute.attr_type().to_id_string();
            let value = attribute.attr_value();
            let tag = value.tag().0;
            let text = u8::try_from(tag)
                .ok()
                .and_then(|tag| string_value(tag, value.data));
            if oid == "2.5.4.3" && common_name.is_none() {
                common_name = text.clone();
            }
            let name = match oid.as_str() {
                "2.5.4.3" => "CN".to_string(),
                "2.5.4.6" => "C".to_string(),
                "2.5.4.7" => "L".to_string(),
                "2.5.4.8" => "ST".to_string(),
                "2.5.4.9" => "STREET".to_string(),
                "2.5.4.10" => "O".to_string(),
                "2.5.4.11" => "OU".to_string(),
                "2.5.4.5" => "serialNumber".to_string(),
                "0.9.2342.19200300.100.1.25" => "DC".to_string(),
                "0.9.2342.19200300.100.1.1" => "UID".to_string(),
                "1.2.840.113549.1.9.1" => "emailAddress".to_string(),
                _ => oid,
            };
            let value = match text {
                Some(text) => escape(&text),
                // RFC 4514: an attribute without a string form is `#` and
                // the hex of its whole BER encoding.
                None => ber_hex(tag, value.data),
            };
            attributes.push(format!("{name}={value}"));
        }
        parts.push(attributes.join("+"));
    }
    parts.reverse();
    (parts.join(","), common_name)
}

/// `#` and the hex of a (primitive, universal) element's BER encoding.
fn ber_hex(tag: u32, content: &[u8]) -> String {
    let mut hex = format!("#{tag:02x}");
    let len = content.len();
    if len < 0x80 {
        let _ = write!(hex, "{len:02x}");
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let _ = write!(hex, "{:02x}", 0x80 | (bytes.len() - skip));
        for b in &bytes[skip..] {
            let _ = write!(hex, "{b:02x}");
        }
    }
    for b in content {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// The text of a directory string; `None` for other types.
fn string_value(tag: u8, value: &[u8]) -> Option<String> {
    match tag {
        // UTF8String, PrintableString, IA5String, NumericString, VisibleString
        0x0c | 0x13 | 0x16 | 0x12 | 0x1a => std::str::from_utf8(value).ok().map(str::to_string),
        // TeletexString: Latin-1 in practice.
        0x14 => Some(value.iter().map(|&b| char::from(b)).collect()),
        // BMPString: UTF-16BE.
        0x1e if value.len().is_multiple_of(2) => {
            let units: Vec<u16> = value
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

/// RFC 4514 escaping of an attribute value.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        if c == '\0' {
            out.push_str("\\00");
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Unix seconds at the start of a (UTC) day.
    pub(crate) fn unix_secs(year: i32, month: u32, day: u32) -> i64 {
        chrono::NaiveDate::from_ymd_opt(year, month, day)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc().timestamp())
            .unwrap()
    }

    #[test]
    fn validity_includes_both_ends() {
        let info = CertInfo {
            subject: "CN=x".into(),
            common_name: Some("x".into()),
            not_before: 100,
            not_after: 200,
        };
        assert_eq!(info.validity(99), Validity::NotYetValid);
        assert_eq!(info.validity(100), Validity::Valid);
        assert_eq!(info.validity(200), Validity::Valid);
        assert_eq!(info.validity(201), Validity::Expired);
    }

    /// rcgen certificates with set validity periods read back as written.
    #[test]
    fn reads_the_validity_period_of_a_real_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2001, 2, 3);
        params.not_after = rcgen::date_time_ymd(2061, 4, 5);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let info = parse(cert.der()).unwrap();
        assert_eq!(info.not_before, unix_secs(2001, 2, 3));
        assert_eq!(info.not_after, unix_secs(2061, 4, 5));
        assert_eq!(info.validity(unix_secs(2000, 1, 1)), Validity::NotYetValid);
        assert_eq!(info.validity(unix_secs(2030, 1, 1)), Validity::Valid);
        assert_eq!(info.validity(unix_secs(2062, 1, 1)), Validity::Expired);
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape(" x "), "\\ x\\ ");
        assert_eq!(escape("#1"), "\\#1");
    }

    /// The subject strings that configured clients (`[[server.clients]]`
    /// `subject`) are matched against, pinned: a change of reader must not
    /// change them.
    #[test]
    fn subject_strings_are_pinned() {
        use rcgen::{DnType, DnValue};
        let subject = |entries: Vec<(DnType, DnValue)>| {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name = rcgen::DistinguishedName::new();
            for (t, v) in entries {
                params.distinguished_name.push(t, v);
            }
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            let info = parse(cert.der()).unwrap();
            (info.subject, info.common_name)
        };
        let utf8 = |s: &str| DnValue::Utf8String(s.into());
        assert_eq!(
            subject(vec![(DnType::CommonName, utf8("rover-1"))]),
            ("CN=rover-1".to_string(), Some("rover-1".to_string()))
        );
        assert_eq!(
            subject(vec![
                (
                    DnType::CountryName,
                    DnValue::PrintableString("DE".try_into().unwrap())
                ),
                (DnType::OrganizationName, utf8("Lab, Inc.")),
                (DnType::OrganizationalUnitName, utf8("Fleet+Ops")),
                (DnType::CommonName, utf8(" rover #2 ")),
            ]),
            (
                "CN=\\ rover #2\\ ,OU=Fleet\\+Ops,O=Lab\\, Inc.,C=DE".to_string(),
                Some(" rover #2 ".to_string())
            )
        );
        assert_eq!(
            subject(vec![
                (
                    DnType::LocalityName,
                    DnValue::Ia5String("Munich".try_into().unwrap())
                ),
                (
                    DnType::StateOrProvinceName,
                    DnValue::BmpString("Bayern".try_into().unwrap())
                ),
                (
                    DnType::CustomDnType(vec![0, 9, 2342, 19200300, 100, 1, 25]),
                    utf8("lab")
                ),
                (DnType::CustomDnType(vec![2, 5, 4, 99]), utf8("x")),
                (
                    DnType::CommonName,
                    DnValue::UniversalString("ü".try_into().unwrap())
                ),
            ]),
            // No string form (UniversalString): `#` and the hex of its BER.
            (
                "CN=#1c04000000fc,2.5.4.99=x,DC=lab,ST=Bayern,L=Munich".to_string(),
                None
            )
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            &b""[..],
            b"\x30",
            b"\x30\x84\xff\xff\xff\xff",
            b"\x30\x02\x30\x00",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
