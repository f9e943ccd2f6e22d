//! `google.protobuf.Struct` <-> JSON: tool parameters and schemas travel
//! as `Struct`s on the wire and as JSON everywhere else.

use prost_types::value::Kind;
use serde_json::{Map, Number, Value};

/// Converts `s`; `path` names it in the error (a `Value` without a kind, a
/// number that is not finite).
pub fn struct_to_json(s: &prost_types::Struct, path: &str) -> Result<Value, String> {
    let mut map = Map::with_capacity(s.fields.len());
    for (k, v) in &s.fields {
        map.insert(k.clone(), value_to_json(v, &format!("{path}.{k}"))?);
    }
    Ok(Value::Object(map))
}

fn value_to_json(v: &prost_types::Value, path: &str) -> Result<Value, String> {
    Ok(match &v.kind {
        None => return Err(format!("{path}: google.protobuf.Value has no kind set")),
        Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                // Integral values stay integers so JSON Schema `integer` accepts them.
                Value::Number(Number::from(*n as i64))
            } else {
                Value::Number(
                    Number::from_f64(*n)
                        .ok_or_else(|| format!("{path}: number {n} is not finite"))?,
                )
            }
        }
        Some(Kind::StructValue(s)) => struct_to_json(s, path)?,
        Some(Kind::ListValue(l)) => Value::Array(
            l.values
                .iter()
                .enumerate()
                .map(|(i, v)| value_to_json(v, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// A JSON value as a `Struct`. Non-objects are wrapped as `{"value": ...}`.
pub fn json_to_struct(v: &Value) -> prost_types::Struct {
    match v {
        Value::Object(map) => prost_types::Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        },
        other => prost_types::Struct {
            fields: [("value".to_string(), json_to_value(other))]
                .into_iter()
                .collect(),
        },
    }
}

fn json_to_value(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        Value::Object(_) => Kind::StructValue(json_to_struct(v)),
    };
    prost_types::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_struct_round_trip_keeps_integers_and_nesting() {
        let v = serde_json::json!({"a": 1, "b": [true, null, "x", 2.5], "c": {"d": -3}});
        assert_eq!(struct_to_json(&json_to_struct(&v), "p").unwrap(), v);
    }

    #[test]
    fn value_without_kind_is_rejected_with_its_path() {
        let s = prost_types::Struct {
            fields: [("x".to_string(), prost_types::Value { kind: None })]
                .into_iter()
                .collect(),
        };
        let err = struct_to_json(&s, "tool.parameters").unwrap_err();
        assert!(err.contains("tool.parameters.x"), "{err}");
    }

    #[test]
    fn non_finite_number_is_rejected() {
        let s = json_to_struct(&serde_json::json!({}));
        let mut s = s;
        s.fields.insert(
            "n".into(),
            prost_types::Value {
                kind: Some(Kind::NumberValue(f64::NAN)),
            },
        );
        assert!(struct_to_json(&s, "p").is_err());
    }
}

/// A tool's parameters survive the trip through `google.protobuf.Struct`.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            "\\PC{0,12}".prop_map(Value::String),
            (-1_000_000i64..1_000_000).prop_map(Value::from),
            (-1e6..1e6f64)
                .prop_filter("a fraction", |v| v.fract() != 0.0)
                .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn objects_round_trip(
            object in prop::collection::btree_map("[a-z]{1,6}", json(), 0..6)
        ) {
            let value = Value::Object(object.into_iter().collect());
            let back = struct_to_json(&json_to_struct(&value), "input").unwrap();
            prop_assert_eq!(back, value);
        }
    }
}
