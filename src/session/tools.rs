//! The client tools of a session: unique names, compiled parameter schemas,
//! and `RegisterTools` replacement by source.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::ToolSpec;
use super::schema::Schema;
use crate::model::ToolDef;

/// A tool with its compiled parameter schema.
#[derive(Debug, Clone)]
pub(crate) struct Tool {
    pub spec: ToolSpec,
    schema: Arc<Schema>,
    /// Estimated tokens of its definition in a model request, counted once:
    /// every turn needs the sum, and counting serialises the schema.
    tokens: u32,
}

impl Tool {
    pub(crate) fn new(spec: ToolSpec) -> Result<Tool, String> {
        if !spec.parameters_schema.is_object() {
            return Err(format!(
                "tool `{}`: parameters_schema must be a JSON object",
                spec.name
            ));
        }
        // Only local `$ref`s are understood: a schema can never make the
        // daemon fetch anything.
        let schema = Schema::compile(&spec.parameters_schema).map_err(|e| {
            format!(
                "tool `{}`: parameters_schema is not a valid JSON Schema: {e}",
                spec.name
            )
        })?;
        let mut tool = Tool {
            spec,
            schema: Arc::new(schema),
            tokens: 0,
        };
        tool.tokens = crate::model::estimate_tool_tokens(&tool.definition());
        Ok(tool)
    }

    /// Checks parameters against the schema; the message lists what is wrong.
    pub(crate) fn validate(&self, parameters: &Value) -> Result<(), String> {
        let errors = self.schema.errors(parameters);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    pub(crate) fn definition(&self) -> ToolDef {
        ToolDef {
            name: self.spec.name.clone(),
            description: self.spec.description.clone(),
            input_schema: self.spec.parameters_schema.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ToolRegistry {
    tools: Vec<Tool>,
}

impl ToolRegistry {
    /// A registry from a list that must have unique names.
    pub(crate) fn from_specs(specs: Vec<ToolSpec>, field: &str) -> Result<ToolRegistry, String> {
        let mut registry = ToolRegistry::default();
        registry.add(specs, field)?;
        Ok(registry)
    }

    fn add(&mut self, specs: Vec<ToolSpec>, field: &str) -> Result<(), String> {
        let mut seen: HashSet<String> = self.tools.iter().map(|t| t.spec.name.clone()).collect();
        let mut new = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            if !seen.insert(spec.name.clone()) {
                return Err(format!(
                    "{field}[{i}]: a tool named `{}` is already registered",
                    spec.name
                ));
            }
            new.push(Tool::new(spec).map_err(|e| format!("{field}[{i}]: {e}"))?);
        }
        self.tools.extend(new);
        Ok(())
    }

    /// `RegisterTools`: drops every tool named `{source}__*`, then adds
    /// `specs` (each must carry that prefix). All or nothing: on error the
    /// registry is unchanged.
    pub(crate) fn register(
        &mut self,
        source: Option<&str>,
        specs: Vec<ToolSpec>,
    ) -> Result<RegisterSummary, String> {
        let mut next = self.clone();
        let mut removed = 0;
        if let Some(source) = source {
            if source.is_empty() {
                return Err("register_tools.source must not be empty when present".into());
            }
            let prefix = format!("{source}__");
            if let Some((i, bad)) = specs
                .iter()
                .enumerate()
                .find(|(_, s)| !s.name.starts_with(&prefix))
            {
                return Err(format!(
                    "register_tools.tools[{i}]: `{}` must be named `{prefix}<name>` to belong to source `{source}`",
                    bad.name
                ));
            }
            let before = next.tools.len();
            next.tools.retain(|t| !t.spec.name.starts_with(&prefix));
            removed = before - next.tools.len();
        }
        let added = specs.len();
        next.add(specs, "register_tools.tools")?;
        *self = next;
        Ok(RegisterSummary { removed, added })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.spec.name == name)
    }

    pub(crate) fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.spec.name.as_str()).collect()
    }

    pub(crate) fn definitions(&self) -> Vec<ToolDef> {
        self.tools.iter().map(Tool::definition).collect()
    }

    /// Estimated tokens of [`ToolRegistry::definitions`]
    /// ([`crate::model::estimate_tools_tokens`]), counted when the tools
    /// were added.
    pub(crate) fn tokens(&self) -> u32 {
        self.tools
            .iter()
            .map(|t| t.tokens)
            .fold(0u32, u32::saturating_add)
    }

    pub(crate) fn len(&self) -> usize {
        self.tools.len()
    }

    /// Bytes of the tools' definitions (names, descriptions, schemas).
    pub(crate) fn bytes(&self) -> u64 {
        self.tools
            .iter()
            .map(|t| super::state::tool_bytes(&t.spec))
            .sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegisterSummary {
    pub removed: usize,
    pub added: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::types::ToolCategory;
    use serde_json::json;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters_schema: json!({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}, "required": ["n"]}),
            timeout_ms: 0,
            category: ToolCategory::Pure,
        }
    }

    #[test]
    fn validates_parameters_against_the_schema() {
        let t = Tool::new(spec("t")).unwrap();
        assert!(t.validate(&json!({"n": 2})).is_ok());
        let err = t.validate(&json!({"n": 9})).unwrap_err();
        assert!(err.contains("/n"), "{err}");
        assert!(t.validate(&json!({})).is_err());
    }

    #[test]
    fn invalid_schema_is_refused() {
        let mut s = spec("t");
        s.parameters_schema = json!({"type": 12});
        assert!(Tool::new(s).is_err());
    }

    #[test]
    fn register_replaces_by_source_and_is_atomic() {
        let mut r =
            ToolRegistry::from_specs(vec![spec("local"), spec("sim__a"), spec("sim__b")], "tools")
                .unwrap();
        let s = r.register(Some("sim"), vec![spec("sim__c")]).unwrap();
        assert_eq!(
            s,
            RegisterSummary {
                removed: 2,
                added: 1
            }
        );
        assert_eq!(r.names(), ["local", "sim__c"]);
        assert!(
            r.register(Some("sim"), vec![spec("sim__x"), spec("sim__x")])
                .is_err()
        );
        assert!(r.register(Some("sim"), vec![spec("other")]).is_err());
        assert_eq!(
            r.names(),
            ["local", "sim__c"],
            "a failed register changes nothing"
        );
        r.register(Some("sim"), vec![]).unwrap();
        assert_eq!(r.names(), ["local"]);
        assert!(
            r.register(None, vec![spec("local")]).is_err(),
            "name conflict"
        );
        assert!(ToolRegistry::from_specs(vec![spec("a"), spec("a")], "tools").is_err());
    }
}
