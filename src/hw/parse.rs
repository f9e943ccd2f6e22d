//! Pure parsers that turn one line (or one MQTT payload) into a sensor value.
//!
//! Every parser answers `Ok(Some(v))` (a finite value for this sensor),
//! `Ok(None)` (the line is fine but carries nothing for this sensor, e.g. an
//! RMC sentence for a GGA-only field, a JSON object without the pointer, a
//! GPS sentence without a fix) or `Err` (the line is garbage for this parser:
//! not JSON, a bad NMEA checksum, a non-numeric value, a non-finite number).
//!
//! [`Line`] parses a line lazily and at most once per format, so a port that
//! feeds several sensors from one line decodes the JSON (or NMEA sentence)
//! once, not once per sensor.

use std::cell::OnceCell;

use serde_json::Value;

use crate::hw::config::{LineParser, NmeaField};

/// Metres per second in one knot (1852 m / 3600 s).
pub const MPS_PER_KNOT: f64 = 1852.0 / 3600.0;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("not JSON: {0}")]
    Json(String),
    #[error("the value at {pointer} is {found}, not a number")]
    NotNumeric {
        pointer: String,
        found: &'static str,
    },
    #[error("not a number: {0:?}")]
    NotANumber(String),
    #[error("non-finite value {0}")]
    NonFinite(String),
    #[error("no key=value pairs")]
    NotKv,
    #[error("not an NMEA sentence")]
    NotNmea,
    #[error("NMEA sentence without a *hh checksum")]
    NmeaNoChecksum,
    #[error("NMEA checksum mismatch: the sentence says {stated}, its bytes give {computed:02X}")]
    NmeaChecksum { stated: String, computed: u8 },
    #[error("malformed NMEA {sentence} sentence: {what}")]
    NmeaMalformed {
        sentence: &'static str,
        what: String,
    },
}

impl ParseError {
    /// The line is not in this parser's format at all (not JSON, no
    /// `key=value` pair, not an NMEA sentence), as opposed to a line in the
    /// right format with a bad value or checksum.
    pub fn is_format_mismatch(&self) -> bool {
        matches!(
            self,
            ParseError::Json(_) | ParseError::NotKv | ParseError::NotNmea
        )
    }
}

/// Parses `line` for one sensor. See [`Line`] to feed several sensors.
pub fn parse(parser: &LineParser, line: &str) -> Result<Option<f64>, ParseError> {
    Line::new(line).value(parser)
}

impl LineParser {
    /// The value this parser reads from `line` (see the module docs).
    pub fn parse(&self, line: &str) -> Result<Option<f64>, ParseError> {
        parse(self, line)
    }
}

/// One received line, decoded lazily (at most once per format).
#[derive(Debug)]
pub struct Line<'a> {
    text: &'a str,
    json: OnceCell<Result<Value, ParseError>>,
    kv: OnceCell<Result<Vec<(&'a str, &'a str)>, ParseError>>,
    nmea: OnceCell<Result<Option<Nmea>, ParseError>>,
}

impl<'a> Line<'a> {
    /// `text` without its line terminator; surrounding whitespace is ignored.
    pub fn new(text: &'a str) -> Self {
        Line {
            text: text.trim(),
            json: OnceCell::new(),
            kv: OnceCell::new(),
            nmea: OnceCell::new(),
        }
    }

    pub fn text(&self) -> &'a str {
        self.text
    }

    pub fn value(&self, parser: &LineParser) -> Result<Option<f64>, ParseError> {
        match parser {
            LineParser::Json { pointer } => {
                let doc = self.json.get_or_init(|| {
                    serde_json::from_str(self.text).map_err(|e| ParseError::Json(e.to_string()))
                });
                match doc {
                    Ok(doc) => json_pointer_value(doc, pointer),
                    Err(e) => Err(e.clone()),
                }
            }
            LineParser::Kv { key } => {
                let pairs = self.kv.get_or_init(|| kv_pairs(self.text));
                match pairs {
                    Ok(pairs) => match pairs.iter().find(|(k, _)| *k == key.as_str()) {
                        Some((_, v)) => plain_number(unquote(v)).map(Some),
                        None => Ok(None),
                    },
                    Err(e) => Err(e.clone()),
                }
            }
            LineParser::Regex { pattern, group } => {
                match pattern.captures(self.text).and_then(|c| c.name(group)) {
                    Some(m) => plain_number(m.as_str()).map(Some),
                    None => Ok(None),
                }
            }
            LineParser::Nmea { field } => match self.nmea.get_or_init(|| Nmea::parse(self.text)) {
                Ok(Some(sentence)) => Ok(sentence.field(*field)),
                Ok(None) => Ok(None),
                Err(e) => Err(e.clone()),
            },
            LineParser::Number => {
                if self.text.is_empty() {
                    Ok(None)
                } else {
                    plain_number(self.text).map(Some)
                }
            }
        }
    }
}

/// A finite number, or `true`/`false` as 1/0 (surrounding whitespace ignored).
pub fn plain_number(text: &str) -> Result<f64, ParseError> {
    let t = text.trim();
    match t {
        "true" => return Ok(1.0),
        "false" => return Ok(0.0),
        _ => {}
    }
    let v: f64 = t.parse().map_err(|_| ParseError::NotANumber(snippet(t)))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ParseError::NonFinite(snippet(t)))
    }
}

/// The value at `pointer` in a JSON text: numbers, numeric strings, booleans
/// (1/0). A missing pointer or `null` is `Ok(None)`.
pub fn json_value(text: &str, pointer: &str) -> Result<Option<f64>, ParseError> {
    let doc: Value =
        serde_json::from_str(text.trim()).map_err(|e| ParseError::Json(e.to_string()))?;
    json_pointer_value(&doc, pointer)
}

fn json_pointer_value(doc: &Value, pointer: &str) -> Result<Option<f64>, ParseError> {
    let not_numeric = |found| ParseError::NotNumeric {
        pointer: pointer.to_string(),
        found,
    };
    match doc.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(if *b { 1.0 } else { 0.0 })),
        // serde_json refuses NaN/inf literals and out-of-range numbers;
        // checked anyway, since a non-finite value must never pass.
        Some(Value::Number(n)) => match n.as_f64() {
            Some(v) if v.is_finite() => Ok(Some(v)),
            _ => Err(ParseError::NonFinite(n.to_string())),
        },
        Some(Value::String(s)) => plain_number(s).map(Some).map_err(|e| match e {
            ParseError::NotANumber(_) => not_numeric("a non-numeric string"),
            other => other,
        }),
        Some(Value::Array(_)) => Err(not_numeric("an array")),
        Some(Value::Object(_)) => Err(not_numeric("an object")),
    }
}

/// `key=value` pairs separated by whitespace, commas or semicolons. Tokens
/// without `=` are ignored (e.g. a `DATA:` prefix); a line without any pair
/// is not a kv line. The first occurrence of a key wins.
fn kv_pairs(text: &str) -> Result<Vec<(&str, &str)>, ParseError> {
    let pairs: Vec<(&str, &str)> = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == ';')
        .filter_map(|token| token.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .collect();
    if pairs.is_empty() {
        Err(ParseError::NotKv)
    } else {
        Ok(pairs)
    }
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v)
}

/// At most 40 characters of `s`, for error messages about device input.
fn snippet(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

// ------------------------------------------------------------------ NMEA 0183

/// The fields of a GGA or RMC sentence that sensors can read.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Nmea {
    pub latitude: Option<f64>,
    pub longitude: Option<f64>,
    pub altitude: Option<f64>,
    pub fix_quality: Option<f64>,
    pub satellites: Option<f64>,
    pub speed_knots: Option<f64>,
    pub course: Option<f64>,
}

impl Nmea {
    /// Parses one NMEA 0183 sentence. The `*hh` checksum is required and
    /// verified for every sentence. GGA and RMC sentences (any talker: GP,
    /// GN, GL, GA, BD, ...) give `Some`; other valid sentences give `None`.
    /// Without a fix (GGA quality 0, RMC status `V`) the position, altitude,
    /// speed and course are absent; GGA's fix quality and satellite count are
    /// still reported.
    pub fn parse(line: &str) -> Result<Option<Nmea>, ParseError> {
        let line = line.trim();
        let body = line.strip_prefix('$').ok_or(ParseError::NotNmea)?;
        let (data, stated) = body.rsplit_once('*').ok_or(ParseError::NmeaNoChecksum)?;
        let computed = data.bytes().fold(0u8, |acc, b| acc ^ b);
        let stated_value = (stated.len() == 2)
            .then(|| u8::from_str_radix(stated, 16).ok())
            .flatten()
            .ok_or_else(|| ParseError::NmeaChecksum {
                stated: snippet(stated),
                computed,
            })?;
        if stated_value != computed {
            return Err(ParseError::NmeaChecksum {
                stated: stated.to_string(),
                computed,
            });
        }
        if !data.is_ascii() {
            return Err(ParseError::NotNmea);
        }
        let fields: Vec<&str> = data.split(',').collect();
        let address = fields[0];
        if address.len() < 5 || !address.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(ParseError::NotNmea);
        }
        match &address[address.len() - 3..] {
            "GGA" => Self::gga(&fields).map(Some),
            "RMC" => Self::rmc(&fields).map(Some),
            _ => Ok(None),
        }
    }

    /// `$xxGGA,time,lat,N,lon,E,quality,sats,hdop,alt,M,sep,M,age,station`
    fn gga(f: &[&str]) -> Result<Nmea, ParseError> {
        const S: &str = "GGA";
        if f.len() < 11 {
            return Err(malformed(
                S,
                format!("{} fields, expected at least 15", f.len()),
            ));
        }
        let fix_quality = opt_number(S, "fix quality", f[6])?;
        let satellites = opt_number(S, "satellites", f[7])?;
        let mut out = Nmea {
            fix_quality,
            satellites,
            ..Nmea::default()
        };
        if fix_quality.is_some_and(|q| q > 0.0) {
            out.latitude = coordinate(S, f[2], f[3], 'N', 'S', 90.0)?;
            out.longitude = coordinate(S, f[4], f[5], 'E', 'W', 180.0)?;
            out.altitude = opt_number(S, "altitude", f[9])?;
            if out.altitude.is_some() && !f[10].is_empty() && f[10] != "M" {
                return Err(malformed(
                    S,
                    format!("altitude unit {:?}, expected M", f[10]),
                ));
            }
        }
        Ok(out)
    }

    /// `$xxRMC,time,status,lat,N,lon,E,speed_kn,course,date,magvar,E[,mode]`
    fn rmc(f: &[&str]) -> Result<Nmea, ParseError> {
        const S: &str = "RMC";
        if f.len() < 10 {
            return Err(malformed(
                S,
                format!("{} fields, expected at least 12", f.len()),
            ));
        }
        match f[2] {
            "A" => Ok(Nmea {
                latitude: coordinate(S, f[3], f[4], 'N', 'S', 90.0)?,
                longitude: coordinate(S, f[5], f[6], 'E', 'W', 180.0)?,
                speed_knots: opt_number(S, "speed", f[7])?,
                course: opt_number(S, "course", f[8])?,
                ..Nmea::default()
            }),
            "V" => Ok(Nmea::default()),
            other => Err(malformed(S, format!("status {other:?}, expected A or V"))),
        }
    }

    pub fn field(&self, field: NmeaField) -> Option<f64> {
        match field {
            NmeaField::Latitude => self.latitude,
            NmeaField::Longitude => self.longitude,
            NmeaField::Altitude => self.altitude,
            NmeaField::FixQuality => self.fix_quality,
            NmeaField::Satellites => self.satellites,
            NmeaField::SpeedKnots => self.speed_knots,
            NmeaField::SpeedMps => self.speed_knots.map(|k| k * MPS_PER_KNOT),
            NmeaField::Course => self.course,
        }
    }
}

fn malformed(sentence: &'static str, what: String) -> ParseError {
    ParseError::NmeaMalformed { sentence, what }
}

fn opt_number(sentence: &'static str, name: &str, field: &str) -> Result<Option<f64>, ParseError> {
    if field.is_empty() {
        return Ok(None);
    }
    match field.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(Some(v)),
        _ => Err(malformed(
            sentence,
            format!("{name} {:?} is not a number", snippet(field)),
        )),
    }
}

/// `ddmm.mmmm` / `dddmm.mmmm` plus hemisphere -> signed decimal degrees.
fn coordinate(
    sentence: &'static str,
    value: &str,
    hemisphere: &str,
    positive: char,
    negative: char,
    limit: f64,
) -> Result<Option<f64>, ParseError> {
    if value.is_empty() && hemisphere.is_empty() {
        return Ok(None);
    }
    let bad = || {
        malformed(
            sentence,
            format!("coordinate {:?} {:?}", snippet(value), snippet(hemisphere)),
        )
    };
    if !value.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let raw: f64 = value.parse().map_err(|_| bad())?;
    let degrees = (raw / 100.0).trunc();
    let minutes = raw - degrees * 100.0;
    if minutes >= 60.0 {
        return Err(bad());
    }
    let decimal = degrees + minutes / 60.0;
    if decimal > limit {
        return Err(bad());
    }
    let mut chars = hemisphere.chars();
    match (chars.next(), chars.next()) {
        (Some(h), None) if h == positive => Ok(Some(decimal)),
        (Some(h), None) if h == negative => Ok(Some(-decimal)),
        _ => Err(bad()),
    }
}

/// Appends `*hh` to `$`-prefixed sentence data (for tests and simulators).
pub fn nmea_with_checksum(data: &str) -> String {
    let body = data.strip_prefix('$').unwrap_or(data);
    let sum = body.bytes().fold(0u8, |acc, b| acc ^ b);
    format!("${body}*{sum:02X}")
}

// ------------------------------------------------------------------ templates

/// A value as text without float noise: 0.5 -> "0.5", 1.0 -> "1",
/// 0.1 + 0.2 -> "0.3", -0.0 -> "0" (rounded to 12 significant digits).
pub fn format_value(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".to_string()
        } else {
            v.to_string()
        };
    }
    let rounded: f64 = format!("{v:.11e}").parse().unwrap_or(v);
    format!("{rounded}")
}

/// `template` with every `{value}` replaced by [`format_value`]`(value)`.
pub fn render_template(template: &str, value: f64) -> String {
    template.replace("{value}", &format_value(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(p: &str) -> LineParser {
        LineParser::Json {
            pointer: p.to_string(),
        }
    }
    fn kv(k: &str) -> LineParser {
        LineParser::Kv { key: k.to_string() }
    }
    fn re(p: &str, g: &str) -> LineParser {
        LineParser::Regex {
            pattern: regex::Regex::new(p).unwrap(),
            group: g.to_string(),
        }
    }
    fn nmea(f: NmeaField) -> LineParser {
        LineParser::Nmea { field: f }
    }
    fn approx(got: Result<Option<f64>, ParseError>, want: f64) {
        let v = got.unwrap().unwrap();
        assert!((v - want).abs() < 1e-9, "got {v}, want {want}");
    }

    #[test]
    fn json_numbers_strings_booleans() {
        let line = r#"{"t": 21.5, "h": "40.25", "on": true, "off": false, "n": {"x": [1, -2e3]}, "z": null}"#;
        assert_eq!(parse(&json("/t"), line), Ok(Some(21.5)));
        assert_eq!(parse(&json("/h"), line), Ok(Some(40.25)));
        assert_eq!(parse(&json("/on"), line), Ok(Some(1.0)));
        assert_eq!(parse(&json("/off"), line), Ok(Some(0.0)));
        assert_eq!(parse(&json("/n/x/1"), line), Ok(Some(-2000.0)));
        assert_eq!(parse(&json("/missing"), line), Ok(None));
        assert_eq!(parse(&json("/z"), line), Ok(None));
        assert!(matches!(
            parse(&json("/n"), line),
            Err(ParseError::NotNumeric {
                found: "an object",
                ..
            })
        ));
        assert!(matches!(
            parse(&json("/n/x"), line),
            Err(ParseError::NotNumeric {
                found: "an array",
                ..
            })
        ));
        assert!(matches!(
            parse(&json("/t"), r#"{"t": "warm"}"#),
            Err(ParseError::NotNumeric { .. })
        ));
        assert!(matches!(
            parse(&json("/t"), r#"{"t": 2"#),
            Err(ParseError::Json(_))
        ));
        assert!(matches!(
            parse(&json("/t"), "garbage"),
            Err(ParseError::Json(_))
        ));
        assert!(matches!(
            parse(&json("/t"), r#"{"t": NaN}"#),
            Err(ParseError::Json(_))
        ));
        assert!(matches!(
            parse(&json("/t"), r#"{"t": "inf"}"#),
            Err(ParseError::NonFinite(_))
        ));
        // out of f64 range: serde_json refuses it
        assert!(matches!(
            parse(&json("/t"), r#"{"t": 1e999}"#),
            Err(ParseError::Json(_))
        ));
        // escaped pointer tokens
        assert_eq!(parse(&json("/a~1b"), r#"{"a/b": 3}"#), Ok(Some(3.0)));
        assert_eq!(json_value(" 7 ", "/x"), Ok(None));
        assert_eq!(json_value(r#"{"x": 7}"#, "/x"), Ok(Some(7.0)));
    }

    #[test]
    fn kv_separators_and_errors() {
        for line in [
            "T=21.5 H=40",
            "T=21.5,H=40",
            "T=21.5;H=40",
            "DATA: T=21.5, H=40;",
            "  T=\"21.5\"\tH=40 ",
        ] {
            assert_eq!(parse(&kv("T"), line), Ok(Some(21.5)), "{line}");
            assert_eq!(parse(&kv("H"), line), Ok(Some(40.0)), "{line}");
            assert_eq!(parse(&kv("P"), line), Ok(None), "{line}");
        }
        assert_eq!(parse(&kv("T"), "T=1 T=2"), Ok(Some(1.0)));
        assert_eq!(parse(&kv("ok"), "ok=true"), Ok(Some(1.0)));
        assert_eq!(parse(&kv("T"), "t=1"), Ok(None), "keys are case-sensitive");
        assert_eq!(parse(&kv("T"), "garbage line"), Err(ParseError::NotKv));
        assert!(matches!(
            parse(&kv("T"), "T=21.5C"),
            Err(ParseError::NotANumber(_))
        ));
        assert!(matches!(
            parse(&kv("T"), "T=nan"),
            Err(ParseError::NonFinite(_))
        ));
        assert!(matches!(
            parse(&kv("T"), "T="),
            Err(ParseError::NotANumber(_))
        ));
    }

    #[test]
    fn regex_named_group() {
        let p = re(r"^TEMP (?P<value>-?\d+(\.\d+)?) C$", "value");
        assert_eq!(parse(&p, "TEMP -3.5 C"), Ok(Some(-3.5)));
        assert_eq!(parse(&p, "HUM 40 %"), Ok(None));
        let p = re(r"v=(?P<v>\S+)", "v");
        assert!(matches!(parse(&p, "v=abc"), Err(ParseError::NotANumber(_))));
        assert!(matches!(parse(&p, "v=inf"), Err(ParseError::NonFinite(_))));
        let p = re(r"a=(?P<a>\d+)|b=(?P<b>\d+)", "a");
        assert_eq!(
            parse(&p, "b=4"),
            Ok(None),
            "a group that did not participate"
        );
    }

    #[test]
    fn number_lines() {
        assert_eq!(parse(&LineParser::Number, " 42 "), Ok(Some(42.0)));
        assert_eq!(parse(&LineParser::Number, "-1.5e-3"), Ok(Some(-0.0015)));
        assert_eq!(parse(&LineParser::Number, ""), Ok(None));
        assert!(matches!(
            parse(&LineParser::Number, "4 2"),
            Err(ParseError::NotANumber(_))
        ));
        assert!(matches!(
            parse(&LineParser::Number, "NaN"),
            Err(ParseError::NonFinite(_))
        ));
        assert!(matches!(
            parse(&LineParser::Number, "-inf"),
            Err(ParseError::NonFinite(_))
        ));
        assert!(matches!(
            parse(&LineParser::Number, "0x10"),
            Err(ParseError::NotANumber(_))
        ));
        assert_eq!(plain_number("false"), Ok(0.0));
    }

    // Reference sentences: the NMEA 0183 GGA/RMC examples everyone quotes
    // (checksums as published), a multi-GNSS (GN talker) fix in the southern
    // and western hemispheres, receivers' no-fix sentences and a GSV sentence
    // (checksums computed independently of this code).
    const GGA: &str = "$GPGGA,123519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,*47";
    const RMC: &str = "$GPRMC,123519,A,4807.038,N,01131.000,E,022.4,084.4,230394,003.1,W*6A";
    const GNGGA_SW: &str =
        "$GNGGA,001043.00,3354.1380,S,15112.8740,W,2,12,0.72,27.6,M,21.3,M,,0000*7B";
    const GPRMC_NO_FIX: &str = "$GPRMC,,V,,,,,,,,,,N*53";
    const GPGGA_NO_FIX: &str = "$GPGGA,,,,,,0,00,99.99,,,,,,*48";
    const GSV: &str = "$GPGSV,3,1,11,03,03,111,00,04,15,270,00,06,01,010,00,13,06,292,00*74";

    #[test]
    fn nmea_checksums_of_reference_sentences() {
        for s in [GGA, RMC, GNGGA_SW, GPRMC_NO_FIX, GPGGA_NO_FIX, GSV] {
            let data = &s[..s.rfind('*').unwrap()];
            assert_eq!(nmea_with_checksum(data), s, "checksum of {s}");
            assert!(Nmea::parse(s).is_ok(), "{s}: {:?}", Nmea::parse(s));
        }
    }

    #[test]
    fn nmea_gga() {
        approx(parse(&nmea(NmeaField::Latitude), GGA), 48.0 + 7.038 / 60.0);
        approx(parse(&nmea(NmeaField::Longitude), GGA), 11.0 + 31.0 / 60.0);
        approx(parse(&nmea(NmeaField::Altitude), GGA), 545.4);
        approx(parse(&nmea(NmeaField::FixQuality), GGA), 1.0);
        approx(parse(&nmea(NmeaField::Satellites), GGA), 8.0);
        assert_eq!(parse(&nmea(NmeaField::SpeedKnots), GGA), Ok(None));
        assert_eq!(parse(&nmea(NmeaField::Course), GGA), Ok(None));
        // southern and western hemispheres are negative; any talker id
        approx(
            parse(&nmea(NmeaField::Latitude), GNGGA_SW),
            -(33.0 + 54.138 / 60.0),
        );
        approx(
            parse(&nmea(NmeaField::Longitude), GNGGA_SW),
            -(151.0 + 12.874 / 60.0),
        );
        approx(parse(&nmea(NmeaField::FixQuality), GNGGA_SW), 2.0);
        approx(parse(&nmea(NmeaField::Satellites), GNGGA_SW), 12.0);
    }

    #[test]
    fn nmea_rmc() {
        approx(parse(&nmea(NmeaField::Latitude), RMC), 48.0 + 7.038 / 60.0);
        approx(parse(&nmea(NmeaField::Longitude), RMC), 11.0 + 31.0 / 60.0);
        approx(parse(&nmea(NmeaField::SpeedKnots), RMC), 22.4);
        approx(
            parse(&nmea(NmeaField::SpeedMps), RMC),
            22.4 * 1852.0 / 3600.0,
        );
        approx(parse(&nmea(NmeaField::Course), RMC), 84.4);
        // RMC carries no altitude, fix quality or satellites: not for those sensors
        assert_eq!(parse(&nmea(NmeaField::Altitude), RMC), Ok(None));
        assert_eq!(parse(&nmea(NmeaField::FixQuality), RMC), Ok(None));
        assert_eq!(parse(&nmea(NmeaField::Satellites), RMC), Ok(None));
    }

    #[test]
    fn nmea_without_fix_and_other_sentences() {
        for f in [
            NmeaField::Latitude,
            NmeaField::Longitude,
            NmeaField::SpeedKnots,
            NmeaField::Course,
        ] {
            assert_eq!(parse(&nmea(f), GPRMC_NO_FIX), Ok(None));
            assert_eq!(parse(&nmea(f), GPGGA_NO_FIX), Ok(None));
            assert_eq!(parse(&nmea(f), GSV), Ok(None));
        }
        assert_eq!(parse(&nmea(NmeaField::Altitude), GPGGA_NO_FIX), Ok(None));
        assert_eq!(
            parse(&nmea(NmeaField::FixQuality), GPGGA_NO_FIX),
            Ok(Some(0.0))
        );
        assert_eq!(
            parse(&nmea(NmeaField::Satellites), GPGGA_NO_FIX),
            Ok(Some(0.0))
        );
        // a stationary receiver may leave the course empty
        let still =
            nmea_with_checksum("$GPRMC,081836,A,3751.65,S,14507.36,E,000.0,,130998,011.3,E");
        assert_eq!(parse(&nmea(NmeaField::Course), &still), Ok(None));
        assert_eq!(parse(&nmea(NmeaField::SpeedMps), &still), Ok(Some(0.0)));
        approx(
            parse(&nmea(NmeaField::Latitude), &still),
            -(37.0 + 51.65 / 60.0),
        );
        // trailing whitespace / CR is ignored; lowercase hex checksums are accepted
        assert!(parse(&nmea(NmeaField::Latitude), &format!("{GGA}\r")).is_ok());
        let lower = format!("{}6a", &RMC[..RMC.len() - 2]);
        approx(parse(&nmea(NmeaField::Course), &lower), 84.4);
    }

    #[test]
    fn nmea_rejections() {
        let lat = nmea(NmeaField::Latitude);
        // one flipped digit: the checksum no longer matches
        let corrupted = GGA.replace("4807.038", "4807.039");
        assert!(matches!(
            parse(&lat, &corrupted),
            Err(ParseError::NmeaChecksum { computed: 0x46, .. })
        ));
        assert!(matches!(
            parse(&lat, &GGA.replace("*47", "*48")),
            Err(ParseError::NmeaChecksum { .. })
        ));
        assert!(matches!(
            parse(&lat, &GGA.replace("*47", "*4")),
            Err(ParseError::NmeaChecksum { .. })
        ));
        assert!(matches!(
            parse(&lat, &GGA.replace("*47", "*ZZ")),
            Err(ParseError::NmeaChecksum { .. })
        ));
        assert_eq!(
            parse(&lat, &GGA.replace("*47", "")),
            Err(ParseError::NmeaNoChecksum)
        );
        assert_eq!(parse(&lat, "GPGGA,1*00"), Err(ParseError::NotNmea));
        assert_eq!(parse(&lat, "hello"), Err(ParseError::NotNmea));
        // a partial sentence (cut off) has no checksum
        assert_eq!(parse(&lat, &GGA[..30]), Err(ParseError::NmeaNoChecksum));
        // structurally broken sentences with valid checksums
        let few = nmea_with_checksum("$GPGGA,123519,4807.038,N");
        assert!(matches!(
            parse(&lat, &few),
            Err(ParseError::NmeaMalformed {
                sentence: "GGA",
                ..
            })
        ));
        let hemi =
            nmea_with_checksum("$GPGGA,123519,4807.038,X,01131.000,E,1,08,0.9,545.4,M,46.9,M,,");
        assert!(matches!(
            parse(&lat, &hemi),
            Err(ParseError::NmeaMalformed { .. })
        ));
        let minutes =
            nmea_with_checksum("$GPGGA,123519,4867.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,");
        assert!(matches!(
            parse(&lat, &minutes),
            Err(ParseError::NmeaMalformed { .. })
        ));
        let range =
            nmea_with_checksum("$GPGGA,123519,9107.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,");
        assert!(matches!(
            parse(&lat, &range),
            Err(ParseError::NmeaMalformed { .. })
        ));
        let sign =
            nmea_with_checksum("$GPGGA,123519,-4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,");
        assert!(matches!(
            parse(&lat, &sign),
            Err(ParseError::NmeaMalformed { .. })
        ));
        let status =
            nmea_with_checksum("$GPRMC,123519,X,4807.038,N,01131.000,E,022.4,084.4,230394,003.1,W");
        assert!(matches!(
            parse(&lat, &status),
            Err(ParseError::NmeaMalformed {
                sentence: "RMC",
                ..
            })
        ));
        let speed =
            nmea_with_checksum("$GPRMC,123519,A,4807.038,N,01131.000,E,fast,084.4,230394,003.1,W");
        let speed_parser = nmea(NmeaField::SpeedKnots);
        assert!(matches!(
            parse(&speed_parser, &speed),
            Err(ParseError::NmeaMalformed { .. })
        ));
        let non_ascii = nmea_with_checksum("$GPGGA,é");
        assert_eq!(parse(&lat, &non_ascii), Err(ParseError::NotNmea));
    }

    #[test]
    fn one_line_many_sensors() {
        let line = Line::new(r#" {"a": 1, "b": {"c": "2.5"}} "#);
        assert_eq!(line.value(&json("/a")), Ok(Some(1.0)));
        assert_eq!(line.value(&json("/b/c")), Ok(Some(2.5)));
        assert!(line.value(&kv("a")).is_err());
        assert!(line.value(&LineParser::Number).is_err());
        let gga = Line::new(GGA);
        assert!(gga.value(&nmea(NmeaField::Latitude)).unwrap().is_some());
        assert!(gga.value(&nmea(NmeaField::Satellites)).unwrap().is_some());
    }

    #[test]
    fn values_render_without_noise() {
        assert_eq!(format_value(0.5), "0.5");
        assert_eq!(format_value(1.0), "1");
        assert_eq!(format_value(-2.0), "-2");
        assert_eq!(format_value(-0.0), "0");
        assert_eq!(format_value(0.1 + 0.2), "0.3");
        assert_eq!(format_value(1.0 / 3.0), "0.333333333333");
        assert_eq!(format_value(1500.0), "1500");
        assert_eq!(format_value(1e-7), "0.0000001");
        assert_eq!(format_value(123456.789), "123456.789");
        assert_eq!(render_template("M {value}\n", 0.5), "M 0.5\n");
        assert_eq!(
            render_template(r#"{"speed": {value}, "v": {value}}"#, 1.0),
            r#"{"speed": 1, "v": 1}"#
        );
    }
}

/// Properties over arbitrary input (bounded case counts; the fuzz targets
/// in `fuzz/` run the same parsers for long).
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn parsers() -> Vec<LineParser> {
        let mut all = vec![
            LineParser::Json {
                pointer: "/a/0".into(),
            },
            LineParser::Kv { key: "t".into() },
            LineParser::Regex {
                pattern: regex::Regex::new(r"T=(?P<value>[-0-9.eE+]+)").unwrap(),
                group: "value".into(),
            },
            LineParser::Number,
        ];
        for field in [
            NmeaField::Latitude,
            NmeaField::Longitude,
            NmeaField::Altitude,
            NmeaField::FixQuality,
            NmeaField::Satellites,
            NmeaField::SpeedKnots,
            NmeaField::SpeedMps,
            NmeaField::Course,
        ] {
            all.push(LineParser::Nmea { field });
        }
        all
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Garbage on a serial line is an error or nothing, never a panic,
        /// and never a non-finite value.
        #[test]
        fn no_line_panics_or_yields_a_non_finite_value(line in "\\PC{0,200}") {
            for parser in parsers() {
                if let Ok(Some(v)) = parse(&parser, &line) {
                    prop_assert!(v.is_finite());
                }
            }
        }

        /// Lines that look almost right (the shapes the parsers look for,
        /// with arbitrary pieces) are handled the same way.
        #[test]
        fn near_miss_lines_never_panic(
            head in prop::sample::select(vec!["$GPGGA,", "$GPRMC,", "{\"a\":[", "t=", "T=", ""]),
            body in "[-0-9.,:eE+*A-Z\"\\]\\[{} ]{0,80}",
        ) {
            let line = format!("{head}{body}");
            for parser in parsers() {
                let _ = parse(&parser, &line);
            }
        }

        /// What `format_value` writes, `plain_number` reads back (to the
        /// 12 significant digits it keeps).
        #[test]
        fn a_formatted_value_reads_back(v in prop::num::f64::NORMAL | prop::num::f64::ZERO) {
            let read = plain_number(&format_value(v)).unwrap();
            prop_assert!((read - v).abs() <= v.abs() * 1e-11, "{v} -> {read}");
        }

        /// An NMEA sentence with its checksum computed parses; flipping the
        /// checksum makes it a checksum error.
        #[test]
        fn nmea_checksums_are_checked(fields in prop::collection::vec("[0-9.NSEW]{0,8}", 14)) {
            let data = format!("GPGGA,{}", fields.join(","));
            let sentence = nmea_with_checksum(&data);
            prop_assert!(
                !matches!(
                    Nmea::parse(&sentence),
                    Err(ParseError::NmeaChecksum { .. } | ParseError::NmeaNoChecksum)
                ),
                "{sentence}"
            );
            let star = sentence.rfind('*').unwrap();
            let stated = u8::from_str_radix(&sentence[star + 1..], 16).unwrap();
            let broken = format!("{}*{:02X}", &sentence[..star], stated ^ 0x5a);
            prop_assert!(
                matches!(Nmea::parse(&broken), Err(ParseError::NmeaChecksum { .. })),
                "{broken}"
            );
        }
    }
}
