//! Catalog values (a tool's `inputSchema`) as JSON: the same text for the command line's JSON
//! contract and for the gRPC messages that carry a schema as a JSON string.

use capgate_core::capabilities::PlainValue;
use serde_json::{Map, Number, Value};

/// A catalog value (an `inputSchema`) as JSON. Numbers JSON cannot carry
/// (`.nan`, `.inf`) become `null`; integers beyond 64 bits become doubles.
pub fn json(value: &PlainValue) -> Value {
    match value {
        PlainValue::Null => Value::Null,
        PlainValue::Bool(flag) => Value::Bool(*flag),
        PlainValue::Integer(integer) => {
            if let Ok(small) = i64::try_from(*integer) {
                Value::Number(small.into())
            } else if let Ok(large) = u64::try_from(*integer) {
                Value::Number(large.into())
            } else {
                // Precision loss is the JSON data model's, and intended.
                #[allow(clippy::cast_precision_loss)]
                let approximate = *integer as f64;
                Number::from_f64(approximate).map_or(Value::Null, Value::Number)
            }
        }
        PlainValue::Float(float) => Number::from_f64(*float).map_or(Value::Null, Value::Number),
        PlainValue::String(text) => Value::String(text.clone()),
        PlainValue::Array(items) => Value::Array(items.iter().map(json).collect()),
        PlainValue::Object(entries) => Value::Object(
            entries
                .iter()
                .map(|(key, value)| (key.clone(), json(value)))
                .collect::<Map<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json as value;

    use super::*;

    #[test]
    fn catalog_values_that_json_cannot_carry_become_null() {
        assert_eq!(json(&PlainValue::Float(f64::NAN)), Value::Null);
        assert_eq!(json(&PlainValue::Integer(i128::from(u64::MAX))), value!(u64::MAX));
        assert_eq!(json(&PlainValue::Integer(-3)), value!(-3));
        assert_eq!(
            json(&PlainValue::Object(vec![
                ("b".into(), PlainValue::Bool(true)),
                ("a".into(), PlainValue::Null)
            ])),
            value!({"b": true, "a": null})
        );
    }
}
