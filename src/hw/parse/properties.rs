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
