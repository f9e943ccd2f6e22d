//! The part of JSON Schema that tool parameters use, checked without a
//! general JSON Schema engine (which was a large share of the binary).
//!
//! Understood: boolean schemas; `type` (one or several; `integer` takes
//! `500.0` as well as `500`), `enum`, `const`; numbers: `minimum`,
//! `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (draft 4's boolean
//! form too), `multipleOf`; strings: `minLength`, `maxLength` (in
//! characters), `pattern`; arrays: `items` (one schema, or draft 4's list),
//! `prefixItems`, `minItems`, `maxItems`, `uniqueItems`; objects:
//! `properties`, `required`, `additionalProperties`, `patternProperties`,
//! `minProperties`, `maxProperties`; `allOf`, `anyOf`, `oneOf`, `not`; and
//! `$ref` to a place in the same schema (`#`, `#/$defs/...`,
//! `#/definitions/...`). Other keywords (`format`, `title`, `description`,
//! `default`, `examples`, ...) are annotations and change nothing. A
//! keyword rozd understands with a value of the wrong shape makes the
//! schema invalid, so a mistake is reported when the tool is registered
//! rather than silently accepting everything. Nothing is ever fetched.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// How deep `$ref`s and subschemas may nest while checking one value (a
/// schema that refers to itself without consuming input would loop).
const MAX_DEPTH: usize = 64;
/// At most this many problems are reported for one value.
const MAX_ERRORS: usize = 5;

/// A schema checked once and ready to validate values.
#[derive(Debug, Clone)]
pub(crate) struct Schema {
    root: Value,
    /// Compiled `pattern`s and `patternProperties`, by source.
    patterns: HashMap<String, regex::Regex>,
}

impl Schema {
    /// Checks that `root` is a schema rozd can apply.
    pub(crate) fn compile(root: &Value) -> Result<Schema, String> {
        let mut patterns = HashMap::new();
        check_schema(root, root, "#", &mut patterns, 0)?;
        Ok(Schema {
            root: root.clone(),
            patterns,
        })
    }

    /// Every problem of `value` (at most five), each `<path>: <problem>`
    /// where the path is a JSON pointer into the value (empty at the top).
    pub(crate) fn errors(&self, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.check(&self.root, value, "", &mut errors, 0);
        errors.truncate(MAX_ERRORS);
        errors
    }

    fn check(
        &self,
        schema: &Value,
        value: &Value,
        path: &str,
        errors: &mut Vec<String>,
        depth: usize,
    ) {
        if errors.len() >= MAX_ERRORS {
            return;
        }
        let mut fail = |message: String| {
            errors.push(if path.is_empty() {
                message
            } else {
                format!("{path}: {message}")
            });
        };
        if depth > MAX_DEPTH {
            fail("the schema nests too deeply to check".into());
            return;
        }
        let schema = match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => {
                fail(format!("{} is not allowed here", short(value)));
                return;
            }
            Value::Object(s) => s,
            // Refused by `compile`.
            _ => return,
        };
        if let Some(Value::String(reference)) = schema.get("$ref") {
            if let Some(target) = resolve(&self.root, reference) {
                self.check(target, value, path, errors, depth + 1);
            }
            if errors.len() >= MAX_ERRORS {
                return;
            }
        }
        let mut local = Vec::new();
        let mut fail = |message: String| local.push(message);
        if let Some(types) = schema.get("type")
            && !type_matches(types, value)
        {
            fail(format!("{} is not of type {}", short(value), types));
        }
        if let Some(Value::Array(allowed)) = schema.get("enum")
            && !allowed.iter().any(|a| json_equal(a, value))
        {
            fail(format!(
                "{} is not one of {}",
                short(value),
                Value::Array(allowed.clone())
            ));
        }
        if let Some(expected) = schema.get("const")
            && !json_equal(expected, value)
        {
            fail(format!("{} is not {}", short(value), expected));
        }
        if let Some(n) = value.as_f64() {
            number_checks(schema, n, &mut fail);
        }
        if let Value::String(text) = value {
            let chars = text.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                fail(format!("{} is shorter than {min} characters", short(value)));
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && chars > max
            {
                fail(format!("{} is longer than {max} characters", short(value)));
            }
            if let Some(Value::String(p)) = schema.get("pattern")
                && let Some(re) = self.patterns.get(p)
                && !re.is_match(text)
            {
                fail(format!("{} does not match {p:?}", short(value)));
            }
        }
        for message in local {
            errors.push(if path.is_empty() {
                message
            } else {
                format!("{path}: {message}")
            });
        }
        match value {
            Value::Array(items) => self.check_array(schema, items, path, errors, depth),
            Value::Object(object) => self.check_object(schema, object, path, errors, depth),
            _ => {}
        }
        self.check_combinators(schema, value, path, errors, depth);
    }

    fn check_array(
        &self,
        schema: &Map<String, Value>,
        items: &[Value],
        path: &str,
        errors: &mut Vec<String>,
        depth: usize,
    ) {
        let here = |message: String| {
            if path.is_empty() {
                message
            } else {
                format!("{path}: {message}")
            }
        };
        let len = items.len() as u64;
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
            && len < min
        {
            errors.push(here(format!("has {len} items, fewer than {min}")));
        }
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
            && len > max
        {
            errors.push(here(format!("has {len} items, more than {max}")));
        }
        if schema.get("uniqueItems") == Some(&Value::Bool(true)) {
            let duplicate = items
                .iter()
                .enumerate()
                .any(|(i, a)| items[..i].iter().any(|b| json_equal(a, b)));
            if duplicate {
                errors.push(here("has duplicate items".into()));
            }
        }
        let prefix: &[Value] = match (schema.get("prefixItems"), schema.get("items")) {
            (Some(Value::Array(p)), _) | (None, Some(Value::Array(p))) => p,
            _ => &[],
        };
        let rest = match (schema.get("prefixItems"), schema.get("items")) {
            (_, Some(s @ (Value::Object(_) | Value::Bool(_)))) => Some(s),
            (None, Some(Value::Array(_))) => schema.get("additionalItems"),
            _ => None,
        };
        for (i, item) in items.iter().enumerate() {
            let sub = prefix
                .get(i)
                .or(if i >= prefix.len() { rest } else { None });
            if let Some(sub) = sub {
                self.check(sub, item, &format!("{path}/{i}"), errors, depth + 1);
            }
        }
    }

    fn check_object(
        &self,
        schema: &Map<String, Value>,
        object: &Map<String, Value>,
        path: &str,
        errors: &mut Vec<String>,
        depth: usize,
    ) {
        let here = |message: String| {
            if path.is_empty() {
                message
            } else {
                format!("{path}: {message}")
            }
        };
        let len = object.len() as u64;
        if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
            && len < min
        {
            errors.push(here(format!("has {len} properties, fewer than {min}")));
        }
        if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
            && len > max
        {
            errors.push(here(format!("has {len} properties, more than {max}")));
        }
        if let Some(Value::Array(required)) = schema.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !object.contains_key(name) {
                    errors.push(here(format!("{name:?} is a required property")));
                }
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        let pattern_properties = schema.get("patternProperties").and_then(Value::as_object);
        for (name, item) in object {
            let item_path = format!("{path}/{}", escape_pointer(name));
            let mut matched = false;
            if let Some(sub) = properties.and_then(|p| p.get(name)) {
                matched = true;
                self.check(sub, item, &item_path, errors, depth + 1);
            }
            for (pattern, sub) in pattern_properties.into_iter().flatten() {
                if self
                    .patterns
                    .get(pattern)
                    .is_some_and(|re| re.is_match(name))
                {
                    matched = true;
                    self.check(sub, item, &item_path, errors, depth + 1);
                }
            }
            if !matched && let Some(additional) = schema.get("additionalProperties") {
                if additional == &Value::Bool(false) {
                    errors.push(here(format!("additional property {name:?} is not allowed")));
                } else {
                    self.check(additional, item, &item_path, errors, depth + 1);
                }
            }
        }
    }

    fn check_combinators(
        &self,
        schema: &Map<String, Value>,
        value: &Value,
        path: &str,
        errors: &mut Vec<String>,
        depth: usize,
    ) {
        let passes = |sub: &Value| {
            let mut scratch = Vec::new();
            self.check(sub, value, path, &mut scratch, depth + 1);
            scratch.is_empty()
        };
        let here = |message: &str| {
            if path.is_empty() {
                message.to_string()
            } else {
                format!("{path}: {message}")
            }
        };
        if let Some(Value::Array(all)) = schema.get("allOf") {
            for sub in all {
                self.check(sub, value, path, errors, depth + 1);
            }
        }
        if let Some(Value::Array(any)) = schema.get("anyOf")
            && !any.iter().any(passes)
        {
            errors.push(here("matches none of the anyOf schemas"));
        }
        if let Some(Value::Array(one)) = schema.get("oneOf") {
            let matching = one.iter().filter(|s| passes(s)).count();
            if matching != 1 {
                errors.push(here(&format!(
                    "matches {matching} of the oneOf schemas, not exactly one"
                )));
            }
        }
        if let Some(not) = schema.get("not")
            && passes(not)
        {
            errors.push(here("matches the schema under `not`"));
        }
    }
}

fn number_checks(schema: &Map<String, Value>, n: f64, fail: &mut impl FnMut(String)) {
    let draft4_exclusive = |key: &str| schema.get(key) == Some(&Value::Bool(true));
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        if draft4_exclusive("exclusiveMinimum") {
            if n <= min {
                fail(format!("{n} is not greater than {min}"));
            }
        } else if n < min {
            fail(format!("{n} is less than the minimum of {min}"));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        if draft4_exclusive("exclusiveMaximum") {
            if n >= max {
                fail(format!("{n} is not less than {max}"));
            }
        } else if n > max {
            fail(format!("{n} is greater than the maximum of {max}"));
        }
    }
    if let Some(min) = schema.get("exclusiveMinimum").and_then(Value::as_f64)
        && n <= min
    {
        fail(format!("{n} is not greater than {min}"));
    }
    if let Some(max) = schema.get("exclusiveMaximum").and_then(Value::as_f64)
        && n >= max
    {
        fail(format!("{n} is not less than {max}"));
    }
    if let Some(step) = schema.get("multipleOf").and_then(Value::as_f64) {
        let ratio = n / step;
        if !(ratio.is_finite() && (ratio - ratio.round()).abs() <= 1e-9 * ratio.abs().max(1.0)) {
            fail(format!("{n} is not a multiple of {step}"));
        }
    }
}

const TYPES: [&str; 7] = [
    "null", "boolean", "object", "array", "number", "integer", "string",
];

fn type_matches(types: &Value, value: &Value) -> bool {
    let one = |t: &str| match t {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "string" => value.is_string(),
        _ => false,
    };
    match types {
        Value::String(t) => one(t),
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).any(one),
        _ => false,
    }
}

/// JSON equality where numbers compare by value (1 == 1.0).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

/// A value for a message: short values whole, long ones cut.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 64 {
        format!("{}…", text.chars().take(64).collect::<String>())
    } else {
        text
    }
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// The schema at a local `$ref` (`#` or a JSON pointer after it).
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

/// Checks the shape of every keyword rozd applies, compiling patterns.
fn check_schema(
    schema: &Value,
    root: &Value,
    at: &str,
    patterns: &mut HashMap<String, regex::Regex>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("{at}: the schema nests too deeply"));
    }
    let s = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(s) => s,
        other => {
            return Err(format!(
                "{at}: a schema must be an object or a boolean, got {other}"
            ));
        }
    };
    let bad = |key: &str, what: &str| Err(format!("{at}/{key}: must be {what}"));
    if let Some(t) = s.get("type") {
        let known = |v: &Value| v.as_str().is_some_and(|t| TYPES.contains(&t));
        let ok = match t {
            Value::String(_) => known(t),
            Value::Array(ts) => !ts.is_empty() && ts.iter().all(known),
            _ => false,
        };
        if !ok {
            return bad("type", &format!("one of {TYPES:?} or a list of them"));
        }
    }
    for key in ["minimum", "maximum", "multipleOf"] {
        if s.get(key).is_some_and(|v| !v.is_number()) {
            return bad(key, "a number");
        }
    }
    if s.get("multipleOf")
        .and_then(Value::as_f64)
        .is_some_and(|m| m <= 0.0)
    {
        return bad("multipleOf", "greater than 0");
    }
    for key in ["exclusiveMinimum", "exclusiveMaximum"] {
        if s.get(key)
            .is_some_and(|v| !v.is_number() && !v.is_boolean())
        {
            return bad(key, "a number");
        }
    }
    for key in [
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
    ] {
        if s.get(key).is_some_and(|v| v.as_u64().is_none()) {
            return bad(key, "a non-negative integer");
        }
    }
    if s.get("enum").is_some_and(|v| !v.is_array()) {
        return bad("enum", "an array");
    }
    if s.get("uniqueItems").is_some_and(|v| !v.is_boolean()) {
        return bad("uniqueItems", "a boolean");
    }
    if let Some(required) = s.get("required")
        && !required
            .as_array()
            .is_some_and(|r| r.iter().all(Value::is_string))
    {
        return bad("required", "an array of strings");
    }
    if let Some(p) = s.get("pattern") {
        let Some(p) = p.as_str() else {
            return bad("pattern", "a string");
        };
        compile_pattern(p, &format!("{at}/pattern"), patterns)?;
    }
    if let Some(reference) = s.get("$ref") {
        let ok = reference
            .as_str()
            .is_some_and(|r| resolve(root, r).is_some());
        if !ok {
            return bad("$ref", "a reference to a place in this schema (`#/...`)");
        }
    }
    for key in ["properties", "patternProperties", "$defs", "definitions"] {
        match s.get(key) {
            None => {}
            Some(Value::Object(subs)) => {
                for (name, sub) in subs {
                    if key == "patternProperties" {
                        compile_pattern(name, &format!("{at}/{key}"), patterns)?;
                    }
                    check_schema(
                        sub,
                        root,
                        &format!("{at}/{key}/{name}"),
                        patterns,
                        depth + 1,
                    )?;
                }
            }
            Some(_) => return bad(key, "an object of schemas"),
        }
    }
    for key in ["allOf", "anyOf", "oneOf", "prefixItems"] {
        match s.get(key) {
            None => {}
            Some(Value::Array(subs)) if !subs.is_empty() || key == "prefixItems" => {
                for (i, sub) in subs.iter().enumerate() {
                    check_schema(sub, root, &format!("{at}/{key}/{i}"), patterns, depth + 1)?;
                }
            }
            Some(_) => return bad(key, "a non-empty array of schemas"),
        }
    }
    match s.get("items") {
        Some(Value::Array(subs)) => {
            for (i, sub) in subs.iter().enumerate() {
                check_schema(sub, root, &format!("{at}/items/{i}"), patterns, depth + 1)?;
            }
        }
        Some(sub) => check_schema(sub, root, &format!("{at}/items"), patterns, depth + 1)?,
        None => {}
    }
    for key in ["additionalProperties", "additionalItems", "not"] {
        if let Some(sub) = s.get(key) {
            check_schema(sub, root, &format!("{at}/{key}"), patterns, depth + 1)?;
        }
    }
    Ok(())
}

fn compile_pattern(
    pattern: &str,
    at: &str,
    patterns: &mut HashMap<String, regex::Regex>,
) -> Result<(), String> {
    if patterns.contains_key(pattern) {
        return Ok(());
    }
    // Bounded: a tool schema comes from a client.
    let re = regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("{at}: {pattern:?} is not a valid regular expression: {e}"))?;
    patterns.insert(pattern.to_string(), re);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(schema: Value, value: Value) -> Vec<String> {
        Schema::compile(&schema).unwrap().errors(&value)
    }

    #[test]
    fn types_numbers_and_the_integer_that_is_written_as_a_float() {
        let s = json!({"type": "object", "properties": {
            "value": {"type": "number", "minimum": -1, "maximum": 1},
            "hold_ms": {"type": "integer", "minimum": 1}
        }, "required": ["value"], "additionalProperties": false});
        assert!(errors(s.clone(), json!({"value": 0.5, "hold_ms": 500.0})).is_empty());
        assert_eq!(
            errors(s.clone(), json!({"value": 5})),
            ["/value: 5 is greater than the maximum of 1"]
        );
        assert_eq!(
            errors(s.clone(), json!({"value": 0, "hold_ms": 500.5})),
            ["/hold_ms: 500.5 is not of type \"integer\""]
        );
        assert_eq!(
            errors(s.clone(), json!({"hold_ms": 0, "x": 1})),
            [
                "\"value\" is a required property",
                "/hold_ms: 0 is less than the minimum of 1",
                "additional property \"x\" is not allowed"
            ]
        );
        assert_eq!(
            errors(s, json!("NaN")),
            ["\"NaN\" is not of type \"object\""]
        );
    }

    #[test]
    fn enums_strings_arrays_and_combinators() {
        assert!(errors(json!({"enum": [0, 1]}), json!(1.0)).is_empty());
        assert_eq!(errors(json!({"enum": [0, 1]}), json!(0.5)).len(), 1);
        let s = json!({"type": "string", "minLength": 2, "maxLength": 3, "pattern": "^[a-z]+$"});
        assert!(errors(s.clone(), json!("ab")).is_empty());
        assert_eq!(errors(s.clone(), json!("ABCD")).len(), 2);
        let a = json!({"type": "array", "items": {"type": "integer"}, "maxItems": 2, "uniqueItems": true});
        assert_eq!(errors(a.clone(), json!([1, "x", 1])).len(), 3);
        assert!(
            errors(
                json!({"anyOf": [{"type": "string"}, {"type": "null"}]}),
                json!(null)
            )
            .is_empty()
        );
        assert_eq!(
            errors(json!({"oneOf": [{"minimum": 0}, {"maximum": 5}]}), json!(3)).len(),
            1
        );
        assert_eq!(
            errors(json!({"not": {"type": "null"}}), json!(null)).len(),
            1
        );
        assert!(errors(json!({"exclusiveMinimum": 0}), json!(0)).len() == 1);
        assert!(errors(json!({"minimum": 0, "exclusiveMinimum": true}), json!(0)).len() == 1);
        assert!(errors(json!({"multipleOf": 0.1}), json!(0.3)).is_empty());
        assert!(errors(json!(true), json!({"any": "thing"})).is_empty());
        assert_eq!(errors(json!(false), json!(1)).len(), 1);
    }

    #[test]
    fn local_refs_resolve_and_self_reference_is_bounded() {
        let s = json!({"$defs": {"speed": {"type": "number", "maximum": 1}},
                       "properties": {"v": {"$ref": "#/$defs/speed"}}});
        assert_eq!(errors(s, json!({"v": 2})).len(), 1);
        let looping = json!({"$ref": "#"});
        assert_eq!(
            errors(looping, json!(1)).len(),
            1,
            "too deep, not a stack overflow"
        );
        let tree = json!({"type": "object", "properties": {"child": {"$ref": "#"}}});
        assert!(errors(tree, json!({"child": {"child": {}}})).is_empty());
    }

    #[test]
    fn malformed_schemas_are_refused_when_compiled() {
        for bad in [
            json!({"type": null}),
            json!({"type": "float"}),
            json!({"maximum": "1"}),
            json!({"required": "a"}),
            json!({"pattern": "("}),
            json!({"properties": {"a": 5}}),
            json!({"$ref": "https://example.com/schema"}),
            json!({"$ref": "#/nowhere"}),
            json!({"anyOf": []}),
            json!("object"),
        ] {
            assert!(Schema::compile(&bad).is_err(), "{bad}");
        }
        // Annotations and unknown keywords are fine.
        assert!(Schema::compile(&json!({"format": "uri", "title": "t", "x-custom": 1})).is_ok());
    }

    #[test]
    fn at_most_five_errors_with_pointer_paths() {
        let s = json!({"additionalProperties": {"type": "string"}});
        let value = json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "a/b": 7});
        let e = errors(s, value);
        assert_eq!(e.len(), 5);
        assert!(e[0].starts_with("/a: "), "{e:?}");
    }
}
