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
    let line =
        r#"{"t": 21.5, "h": "40.25", "on": true, "off": false, "n": {"x": [1, -2e3]}, "z": null}"#;
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
const GNGGA_SW: &str = "$GNGGA,001043.00,3354.1380,S,15112.8740,W,2,12,0.72,27.6,M,21.3,M,,0000*7B";
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
    let still = nmea_with_checksum("$GPRMC,081836,A,3751.65,S,14507.36,E,000.0,,130998,011.3,E");
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
    let hemi = nmea_with_checksum("$GPGGA,123519,4807.038,X,01131.000,E,1,08,0.9,545.4,M,46.9,M,,");
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

/// From the `serial_line` fuzz target (its input `\x03 000…013399722918938673152`):
/// a number past 12 significant digits is written rounded to 12, as
/// documented, and reads back within that precision — not exactly, which
/// is what the target's first assertion wrongly demanded.
#[test]
fn a_large_number_is_written_to_twelve_significant_digits() {
    let line = " 0000000000000000000013399722918938673152";
    let v = plain_number(line.trim()).unwrap();
    assert_eq!(v, 13_399_722_918_938_673_152.0);
    let written = format_value(v);
    assert_eq!(written, "13399722918900000000");
    let read = plain_number(&written).unwrap();
    assert!((read - v).abs() <= v.abs() * 1e-11, "{v} -> {read}");
}
