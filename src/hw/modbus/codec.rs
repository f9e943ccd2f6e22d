//! Register codecs: what a sensor or actuator reads and writes at its
//! address, as plain data with pure functions.
//!
//! A value of `type` takes one register (`u16`, `i16`), two (`u32`,
//! `i32`, `f32`) or one bit (`bool`, coils and discrete inputs only). Two
//! registers are joined by `word_order` (`big`: the register at the lower
//! address holds the high word, as Modbus itself is big-endian; `little`:
//! the low word comes first, "word swap"); within each register
//! `byte_order` (`big`, the Modbus default, or `little`, "byte swap").
//!
//! The engineering value is `raw * scale + offset`; a command in
//! engineering units is written as `(value - offset) / scale`, rounded to
//! the nearest integer for integer types, and refused when it does not fit.

use serde::Deserialize;

/// The four Modbus tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    /// Read/write 16-bit registers (FC 3, 6, 16).
    Holding,
    /// Read-only 16-bit registers (FC 4).
    Input,
    /// Read/write bits (FC 1, 5, 15).
    Coil,
    /// Read-only bits (FC 2).
    DiscreteInput,
}

impl Table {
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Holding => "holding",
            Table::Input => "input",
            Table::Coil => "coil",
            Table::DiscreteInput => "discrete_input",
        }
    }

    /// Coils and discrete inputs hold bits; the others 16-bit registers.
    pub fn is_bits(self) -> bool {
        matches!(self, Table::Coil | Table::DiscreteInput)
    }

    /// Whether a client may write it.
    pub fn is_writable(self) -> bool {
        matches!(self, Table::Holding | Table::Coil)
    }

    /// The most items one read request may ask for (Modbus application
    /// protocol 1.1b3: 125 registers, 2000 bits).
    pub fn max_read(self) -> u16 {
        if self.is_bits() { 2000 } else { 125 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
}

impl ValueType {
    pub fn as_str(self) -> &'static str {
        match self {
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
        }
    }

    /// Registers (or bits, for `bool`) one value takes.
    pub fn width(self) -> u16 {
        match self {
            ValueType::U16 | ValueType::I16 | ValueType::Bool => 1,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 2,
        }
    }

    /// The raw values it can hold (integer types are rounded to them).
    fn raw_range(self) -> (f64, f64) {
        match self {
            ValueType::U16 => (0.0, f64::from(u16::MAX)),
            ValueType::I16 => (f64::from(i16::MIN), f64::from(i16::MAX)),
            ValueType::U32 => (0.0, f64::from(u32::MAX)),
            ValueType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
            ValueType::F32 => (f64::from(f32::MIN), f64::from(f32::MAX)),
            ValueType::Bool => (0.0, 1.0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    #[default]
    Big,
    Little,
}

impl Order {
    pub fn as_str(self) -> &'static str {
        match self {
            Order::Big => "big",
            Order::Little => "little",
        }
    }
}

/// How one value sits in its registers, and how raw becomes engineering.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Codec {
    pub value_type: ValueType,
    pub word_order: Order,
    pub byte_order: Order,
    /// Finite and not zero.
    pub scale: f64,
    /// Finite.
    pub offset: f64,
}

/// Why a value cannot be written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EncodeError {
    #[error("{0} is not a finite number")]
    NotFinite(f64),
    #[error("{value} is {raw} as a raw {ty} value, which does not fit ({min} to {max})")]
    OutOfRange {
        value: f64,
        raw: f64,
        ty: &'static str,
        min: f64,
        max: f64,
    },
    #[error("a bool takes 0 or 1, not {0}")]
    NotABool(f64),
}

impl Codec {
    /// A plain codec: `value_type`, big-endian, scale 1, offset 0.
    pub fn plain(value_type: ValueType) -> Codec {
        Codec {
            value_type,
            word_order: Order::Big,
            byte_order: Order::Big,
            scale: 1.0,
            offset: 0.0,
        }
    }

    /// The engineering value of the registers `words` (at least
    /// [`ValueType::width`] of them; `None` otherwise).
    pub fn decode_words(&self, words: &[u16]) -> Option<f64> {
        let fix = |w: u16| match self.byte_order {
            Order::Big => w,
            Order::Little => w.swap_bytes(),
        };
        let raw = match self.value_type {
            ValueType::U16 => f64::from(fix(*words.first()?)),
            ValueType::I16 => f64::from(fix(*words.first()?) as i16),
            ValueType::Bool => f64::from(u8::from(*words.first()? != 0)),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => {
                let (a, b) = (fix(*words.first()?), fix(*words.get(1)?));
                let (high, low) = match self.word_order {
                    Order::Big => (a, b),
                    Order::Little => (b, a),
                };
                let bits = (u32::from(high) << 16) | u32::from(low);
                match self.value_type {
                    ValueType::U32 => f64::from(bits),
                    ValueType::I32 => f64::from(bits as i32),
                    _ => f64::from(f32::from_bits(bits)),
                }
            }
        };
        Some(raw * self.scale + self.offset)
    }

    /// The engineering value of a bit.
    pub fn decode_bit(&self, bit: bool) -> f64 {
        f64::from(u8::from(bit)) * self.scale + self.offset
    }

    /// The raw value `value` (engineering units) is written as: rounded
    /// for integer types, checked against the type's range.
    pub fn raw(&self, value: f64) -> Result<f64, EncodeError> {
        if !value.is_finite() {
            return Err(EncodeError::NotFinite(value));
        }
        let exact = (value - self.offset) / self.scale;
        let raw = match self.value_type {
            ValueType::F32 => exact,
            _ => exact.round(),
        };
        let (min, max) = self.value_type.raw_range();
        if !(raw.is_finite() && raw >= min && raw <= max) {
            return Err(EncodeError::OutOfRange {
                value,
                raw,
                ty: self.value_type.as_str(),
                min,
                max,
            });
        }
        if self.value_type == ValueType::Bool && (exact - raw).abs() > 1e-9 {
            return Err(EncodeError::NotABool(value));
        }
        Ok(raw)
    }

    /// The registers that hold `value` (engineering units).
    pub fn encode_words(&self, value: f64) -> Result<Vec<u16>, EncodeError> {
        let raw = self.raw(value)?;
        let fix = |w: u16| match self.byte_order {
            Order::Big => w,
            Order::Little => w.swap_bytes(),
        };
        // `raw` is within the type's range: the casts below are exact
        // (integers) or the nearest f32.
        let bits: u32 = match self.value_type {
            ValueType::U16 | ValueType::Bool => return Ok(vec![fix(raw as u16)]),
            ValueType::I16 => return Ok(vec![fix((raw as i16) as u16)]),
            ValueType::U32 => raw as u32,
            ValueType::I32 => (raw as i32) as u32,
            ValueType::F32 => (raw as f32).to_bits(),
        };
        let (high, low) = (fix((bits >> 16) as u16), fix(bits as u16));
        Ok(match self.word_order {
            Order::Big => vec![high, low],
            Order::Little => vec![low, high],
        })
    }

    /// The bit that holds `value` (engineering units).
    pub fn encode_bit(&self, value: f64) -> Result<bool, EncodeError> {
        let raw = self.raw(value)?;
        Ok(raw != 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(ty: ValueType, word: Order, byte: Order) -> Codec {
        Codec {
            value_type: ty,
            word_order: word,
            byte_order: byte,
            scale: 1.0,
            offset: 0.0,
        }
    }

    #[test]
    fn every_type_and_order_round_trips_and_lays_words_out_as_documented() {
        use Order::{Big, Little};
        // 0x42C88000 is 100.25f32; 0x12345678 as u32.
        let cases: &[(ValueType, Order, Order, f64, &[u16])] = &[
            (ValueType::U16, Big, Big, 4660.0, &[0x1234]),
            (ValueType::U16, Big, Little, 4660.0, &[0x3412]),
            (ValueType::I16, Big, Big, -2.0, &[0xFFFE]),
            (ValueType::U32, Big, Big, 305_419_896.0, &[0x1234, 0x5678]),
            (
                ValueType::U32,
                Little,
                Big,
                305_419_896.0,
                &[0x5678, 0x1234],
            ),
            (
                ValueType::U32,
                Big,
                Little,
                305_419_896.0,
                &[0x3412, 0x7856],
            ),
            (
                ValueType::U32,
                Little,
                Little,
                305_419_896.0,
                &[0x7856, 0x3412],
            ),
            (ValueType::I32, Big, Big, -2.0, &[0xFFFF, 0xFFFE]),
            (ValueType::I32, Little, Big, -70_000.0, &[0xEE90, 0xFFFE]),
            (ValueType::F32, Big, Big, 100.25, &[0x42C8, 0x8000]),
            (ValueType::F32, Little, Little, 100.25, &[0x0080, 0xC842]),
        ];
        for &(ty, word, byte, value, words) in cases {
            let c = codec(ty, word, byte);
            assert_eq!(
                c.encode_words(value).unwrap(),
                words,
                "{ty:?} {word:?} {byte:?}"
            );
            assert_eq!(
                c.decode_words(words),
                Some(value),
                "{ty:?} {word:?} {byte:?}"
            );
        }
    }

    #[test]
    fn scale_and_offset_map_raw_to_engineering_and_back() {
        // A VFD frequency in 0.01 Hz steps, a temperature with an offset.
        let hz = Codec {
            scale: 0.01,
            ..Codec::plain(ValueType::U16)
        };
        assert_eq!(hz.decode_words(&[5000]), Some(50.0));
        assert_eq!(hz.encode_words(50.0).unwrap(), [5000]);
        assert_eq!(hz.encode_words(12.345).unwrap(), [1235], "rounded");
        let temp = Codec {
            scale: 0.1,
            offset: -40.0,
            ..Codec::plain(ValueType::I16)
        };
        assert!((temp.decode_words(&[625]).unwrap() - 22.5).abs() < 1e-9);
        assert_eq!(temp.encode_words(22.5).unwrap(), [625]);
    }

    #[test]
    fn a_value_that_does_not_fit_its_type_is_refused_not_wrapped() {
        let hz = Codec {
            scale: 0.01,
            ..Codec::plain(ValueType::U16)
        };
        assert!(matches!(
            hz.encode_words(655.36),
            Err(EncodeError::OutOfRange { .. })
        ));
        assert!(matches!(
            hz.encode_words(-0.01),
            Err(EncodeError::OutOfRange { .. })
        ));
        assert!(matches!(
            Codec::plain(ValueType::I16).encode_words(f64::NAN),
            Err(EncodeError::NotFinite(_))
        ));
        assert!(Codec::plain(ValueType::Bool).encode_bit(0.5).is_err());
        assert_eq!(Codec::plain(ValueType::Bool).encode_bit(1.0), Ok(true));
        assert_eq!(Codec::plain(ValueType::Bool).encode_bit(0.0), Ok(false));
    }

    #[test]
    fn too_few_words_decode_to_nothing() {
        assert_eq!(Codec::plain(ValueType::F32).decode_words(&[1]), None);
        assert_eq!(Codec::plain(ValueType::U16).decode_words(&[]), None);
        assert_eq!(Codec::plain(ValueType::Bool).decode_bit(true), 1.0);
    }
}
