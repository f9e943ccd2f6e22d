//! What rozd reads from a certificate itself: the subject (to name a client
//! by its certificate) and its validity period (for `/v1/status`, `rozd
//! check`, and a reload that refuses a certificate clients would refuse). A
//! small DER walk of the fields in front of them; rustls and webpki have
//! already verified (or will verify) the certificate, this only reads it.

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
pub struct X509Error(&'static str);

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element: its tag, its content and what follows it.
fn element(input: &[u8]) -> Result<(u8, &[u8], &[u8]), X509Error> {
    let [tag, first, rest @ ..] = input else {
        return Err(X509Error("truncated element"));
    };
    let (len, rest) = if first & 0x80 == 0 {
        (usize::from(*first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(X509Error("bad length"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(X509Error("element longer than its input"));
    }
    Ok((*tag, &rest[..len], &rest[len..]))
}

fn expect(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), X509Error> {
    match element(input)? {
        (t, content, rest) if t == tag => Ok((content, rest)),
        _ => Err(X509Error("unexpected element")),
    }
}

/// Reads the subject and validity of a DER certificate.
pub fn parse(der: &[u8]) -> Result<CertInfo, X509Error> {
    let (certificate, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(certificate, SEQUENCE)?;
    let mut rest = tbs;
    // version [0] EXPLICIT, optional
    if rest.first() == Some(&0xa0) {
        rest = element(rest)?.2;
    }
    let (_serial, rest) = expect(rest, 0x02)?;
    let (_signature, rest) = expect(rest, SEQUENCE)?;
    let (_issuer, rest) = expect(rest, SEQUENCE)?;
    let (validity, rest) = expect(rest, SEQUENCE)?;
    let (subject, _) = expect(rest, SEQUENCE)?;
    let (tag, time, after_not_before) = element(validity)?;
    let not_before = parse_time(tag, time)?;
    let (tag, time, _) = element(after_not_before)?;
    let not_after = parse_time(tag, time)?;
    let (subject, common_name) = parse_name(subject)?;
    Ok(CertInfo {
        subject,
        common_name,
        not_before,
        not_after,
    })
}

/// A `Name`'s RFC 4514 string, and its first common name.
fn parse_name(mut rdns: &[u8]) -> Result<(String, Option<String>), X509Error> {
    let mut parts = Vec::new();
    let mut common_name = None;
    while !rdns.is_empty() {
        let (set, rest) = expect(rdns, SET)?;
        rdns = rest;
        let mut attributes = Vec::new();
        let mut set = set;
        while !set.is_empty() {
            let (pair, rest) = expect(set, SEQUENCE)?;
            set = rest;
            let (oid, value) = expect(pair, OID)?;
            let (tag, value, _) = element(value)?;
            let oid = oid_string(oid);
            let text = string_value(tag, value);
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
                None => {
                    let mut hex = format!("#{tag:02x}");
                    let len = value.len();
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
                    for b in value {
                        let _ = write!(hex, "{b:02x}");
                    }
                    hex
                }
            };
            attributes.push(format!("{name}={value}"));
        }
        parts.push(attributes.join("+"));
    }
    parts.reverse();
    Ok((parts.join(","), common_name))
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

fn oid_string(oid: &[u8]) -> String {
    let mut arcs: Vec<u64> = Vec::new();
    let mut value = 0u64;
    for (i, b) in oid.iter().enumerate() {
        value = (value << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() && i < oid.len() {
                let first = (value / 40).min(2);
                arcs.push(first);
                arcs.push(value - first * 40);
            } else {
                arcs.push(value);
            }
            value = 0;
        }
    }
    arcs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) to Unix seconds.
fn parse_time(tag: u8, text: &[u8]) -> Result<i64, X509Error> {
    let bad = X509Error("bad validity time");
    // ASCII only: the digits are sliced by byte position below.
    if !text.is_ascii() {
        return Err(bad);
    }
    let text = std::str::from_utf8(text).map_err(|_| bad.clone())?;
    let text = text.strip_suffix('Z').ok_or(bad.clone())?;
    let (year, rest) = match tag {
        UTC_TIME if text.len() == 12 => {
            let yy: i64 = text[..2].parse().map_err(|_| bad.clone())?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        GENERALIZED_TIME if text.len() == 14 => {
            (text[..4].parse().map_err(|_| bad.clone())?, &text[4..])
        }
        _ => return Err(bad),
    };
    let field = |i: usize| -> Result<i64, X509Error> {
        rest.get(i..i + 2)
            .and_then(|s| s.parse().ok())
            .ok_or(bad.clone())
    };
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return Err(bad);
    }
    Ok(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub(crate) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_times() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(parse_time(UTC_TIME, b"700101000001Z"), Ok(1));
        assert_eq!(
            parse_time(GENERALIZED_TIME, b"20380119031408Z"),
            Ok(2_147_483_648)
        );
        assert!(parse_time(UTC_TIME, b"700101000001").is_err());
        assert!(parse_time(UTC_TIME, b"701301000001Z").is_err());
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
        assert_eq!(info.not_before, days_from_civil(2001, 2, 3) * 86_400);
        assert_eq!(info.not_after, days_from_civil(2061, 4, 5) * 86_400);
        assert_eq!(
            info.validity(days_from_civil(2000, 1, 1) * 86_400),
            Validity::NotYetValid
        );
        assert_eq!(
            info.validity(days_from_civil(2030, 1, 1) * 86_400),
            Validity::Valid
        );
        assert_eq!(
            info.validity(days_from_civil(2062, 1, 1) * 86_400),
            Validity::Expired
        );
    }

    #[test]
    fn oids_and_escaping() {
        assert_eq!(oid_string(&[0x55, 0x04, 0x03]), "2.5.4.3");
        assert_eq!(
            oid_string(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01]),
            "1.2.840.113549.1.9.1"
        );
        assert_eq!(escape("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape(" x "), "\\ x\\ ");
        assert_eq!(escape("#1"), "\\#1");
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

    #[test]
    fn a_validity_time_that_is_not_ascii_is_an_error_not_a_panic() {
        // The lengths each form takes (12 and 14 bytes before the Z), with
        // a two-byte character across the year's slice.
        for (tag, text) in [
            (UTC_TIME, "1\u{e9}010100000Z"),
            (GENERALIZED_TIME, "202\u{e9}010100000Z"),
        ] {
            assert!(parse_time(tag, text.as_bytes()).is_err(), "{text}");
        }
        assert!(parse_time(UTC_TIME, b"300101000000Z").is_ok());
    }
}
