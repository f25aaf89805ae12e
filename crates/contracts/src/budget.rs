//! The step budget of a JSON Schema check.
//!
//! jsonschema remembers whether a recursive subschema accepts a value, so asking whether
//! a payload is valid costs about what the payload's size does; but finding the first
//! error of an invalid one builds, for every `anyOf`/`oneOf`, the errors of each
//! branch, and with recursive branches that tree doubles at every level (2^depth:
//! seconds and gigabytes at depth 20). jsonschema has no budget of its own, so every
//! subschema of a contract gets one more keyword, [`STEP_KEYWORD`], which counts a step
//! each time the subschema is applied to a value; past the budget it unwinds out of the
//! validator ([`std::panic::resume_unwind`], which runs no panic hook and prints
//! nothing) to [`run`], which says the check was too costly.
//!
//! Invariants:
//! - Outside [`run`] the keyword counts nothing and never unwinds (a validator used
//!   elsewhere behaves as jsonschema's own).
//! - The keyword accepts every value: it changes no check's outcome or its first error.
//! - It is added to subschemas only (reached by the keywords that hold them), never to a
//!   `const`, `enum`, `default` or `examples` value, nor to the maps `properties`,
//!   `$defs` and their like hold, whose names are not keywords.
//! - Needs unwinding (the default `panic = "unwind"`); the workspace sets no `abort`.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use serde_json::Value;

/// The keyword that counts; a name no JSON Schema vocabulary uses.
pub(crate) const STEP_KEYWORD: &str = "x-walpost-step";

thread_local! {
    /// Steps left for the check running on this thread; `None`: none is.
    static LEFT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// What unwinds out of the validator when the budget is spent.
struct Spent;

/// Ends the budget when [`run`] returns or unwinds.
struct Reset;

impl Drop for Reset {
    fn drop(&mut self) {
        LEFT.with(|l| l.set(None));
    }
}

/// `check` with at most `budget` steps; `None` when it needed more.
pub(crate) fn run<T>(budget: u64, check: impl FnOnce() -> T) -> Option<T> {
    LEFT.with(|l| l.set(Some(budget)));
    let _reset = Reset;
    match catch_unwind(AssertUnwindSafe(check)) {
        Ok(done) => Some(done),
        Err(payload) if payload.is::<Spent>() => None,
        Err(payload) => resume_unwind(payload),
    }
}

/// One step of the running check.
fn step() {
    let spent = LEFT.with(|l| match l.get() {
        None => false,
        Some(0) => true,
        Some(n) => {
            l.set(Some(n - 1));
            false
        }
    });
    if spent {
        resume_unwind(Box::new(Spent));
    }
}

/// The keyword's validator: a step, and a pass.
struct Step;

impl<'i> jsonschema::Keyword<'i> for Step {
    fn validate(&self, _: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        step();
        Ok(())
    }

    fn is_valid(&self, _: &'i Value) -> bool {
        step();
        true
    }
}

/// Options that know [`STEP_KEYWORD`].
pub(crate) fn with_steps(options: jsonschema::ValidationOptions<'_>) -> jsonschema::ValidationOptions<'_> {
    options.with_keyword(STEP_KEYWORD, |_, _, _| Ok(Box::new(Step)))
}

/// `schema` with [`STEP_KEYWORD`] in each of its subschemas.
pub(crate) fn counted(schema: &Value) -> Value {
    let mut schema = schema.clone();
    mark(&mut schema);
    schema
}

/// Marks a subschema and the subschemas it holds.
fn mark(schema: &mut Value) {
    let Value::Object(map) = schema else { return }; // true, false: nothing to count.
    for (keyword, value) in map.iter_mut() {
        match keyword.as_str() {
            // Values, not schemas.
            "const" | "enum" | "default" | "examples" | "required" | "type" | "format" | "pattern"
            | "dependentRequired" | "$comment" | "title" | "description" | "$schema" | "$id" | "id" | "$ref"
            | "$dynamicRef" | "$recursiveRef" | "$anchor" | "$dynamicAnchor" | "$vocabulary" | "discriminator" => {}
            // Maps of name -> schema.
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" | "dependencies" => {
                if let Value::Object(children) = value {
                    children.values_mut().for_each(mark); // An array (dependencies' names) is left alone.
                }
            }
            // A schema, or a list of them; an unknown keyword's object may be a `$ref`'s
            // target, and counting in it changes nothing else.
            _ => match value {
                Value::Array(items) => items.iter_mut().for_each(mark),
                value => mark(value),
            },
        }
    }
    map.insert(STEP_KEYWORD.to_owned(), Value::Bool(true));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn subschemas_are_marked_and_values_and_names_are_not() {
        let schema = serde_json::json!({
            "properties": {"a": {"type": "string"}, "b": true},
            "const": {"k": 1}, "enum": [{"k": 2}], "default": {}, "examples": [{}],
            "$defs": {"d": {"anyOf": [{"$ref": "#"}, {"minimum": 1}]}},
            "dependencies": {"a": ["b"], "b": {"required": ["a"]}},
            "items": [{}], "not": {"not": {}}
        });
        let m = counted(&schema);
        let marked = |p: &str| m.pointer(p).unwrap().get(STEP_KEYWORD) == Some(&Value::Bool(true));
        for p in [
            "",
            "/properties/a",
            "/$defs/d",
            "/$defs/d/anyOf/0",
            "/$defs/d/anyOf/1",
            "/dependencies/b",
            "/items/0",
            "/not",
            "/not/not",
        ] {
            assert!(marked(p), "{p} is a subschema");
        }
        for p in ["/properties", "/const", "/enum/0", "/default", "/examples/0", "/$defs", "/dependencies"] {
            assert!(!marked(p), "{p} is not a subschema");
        }
        assert_eq!(m["properties"]["b"], Value::Bool(true));
        assert_eq!(m["dependencies"]["a"], serde_json::json!(["b"]));
    }

    #[test]
    fn steps_count_only_inside_run_and_a_spent_budget_ends_the_check_quietly() {
        let v = with_steps(jsonschema::options()).build(&counted(&serde_json::json!({"items": {}}))).unwrap();
        let items = serde_json::json!([1, 2, 3]);
        assert!(v.is_valid(&items), "outside run: no budget, no unwinding");
        assert_eq!(run(10, || v.is_valid(&items)), Some(true));
        assert_eq!(run(2, || v.is_valid(&items)), None, "four subschema steps, two allowed");
        assert!(v.is_valid(&items), "the budget ended with its run");
        let other = catch_unwind(|| run(10, || panic!("not ours")));
        assert!(other.is_err(), "another panic goes on unwinding");
    }
}
