//! Serial line parsers (`hw::parse`): every format on one arbitrary line.
//! The first byte picks the JSON pointer, key and regex group to look for;
//! every parser must give a value, nothing or an error, never a panic or a
//! non-finite value.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rozd::hw::config::{LineParser, NmeaField};
use rozd::hw::parse::Line;

const POINTERS: [&str; 4] = ["/t", "/a/0/b", "", "/~1x~0"];
const KEYS: [&str; 4] = ["t", "temp", "", "a b"];
const FIELDS: [NmeaField; 8] = [
    NmeaField::Latitude,
    NmeaField::Longitude,
    NmeaField::Altitude,
    NmeaField::FixQuality,
    NmeaField::Satellites,
    NmeaField::SpeedKnots,
    NmeaField::SpeedMps,
    NmeaField::Course,
];

fn regex() -> &'static regex::Regex {
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    RE.get_or_init(|| regex::Regex::new(r"(?P<v>[-+0-9.eE]+)\s*(?P<unit>\w*)").expect("regex"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let line = Line::new(text);
    let pick = usize::from(pick);
    let parsers = [
        LineParser::Json {
            pointer: POINTERS[pick % 4].to_string(),
        },
        LineParser::Kv {
            key: KEYS[(pick / 4) % 4].to_string(),
        },
        LineParser::Regex {
            pattern: regex().clone(),
            group: if pick % 2 == 0 { "v" } else { "unit" }.to_string(),
        },
        LineParser::Nmea {
            field: FIELDS[pick % 8],
        },
        LineParser::Number,
    ];
    for parser in &parsers {
        // Through the shared line (each format decoded once) and alone.
        for value in [line.value(parser), parser.parse(text)] {
            if let Ok(Some(v)) = value {
                assert!(v.is_finite(), "{parser:?} read {v} from {text:?}");
            }
        }
    }
    if let Ok(v) = rozd::hw::parse::plain_number(text) {
        assert!(v.is_finite());
        // What rozd writes reads back as the same number, to the 12
        // significant digits `format_value` keeps.
        let written = rozd::hw::parse::format_value(v);
        let read = rozd::hw::parse::plain_number(&written).expect("format_value reads back");
        assert!((read - v).abs() <= v.abs() * 1e-11, "{v} -> {written}");
    }
});
