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
mod tests;

/// Properties over arbitrary input (bounded case counts; the fuzz targets
/// in `fuzz/` run the same parsers for long).
#[cfg(test)]
mod properties;
