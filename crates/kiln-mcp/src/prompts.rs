//! Prompts: investigations a person starts from the assistant's prompt menu, each a
//! chain of tool calls written out for the model.

use serde_json::{json, Value};

struct Prompt {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    /// `{service}` is replaced by the argument.
    text: &'static str,
}

const PROMPTS: &[Prompt] = &[
    Prompt {
        name: "investigate_cpu_regression",
        title: "Investigate a CPU regression",
        description: "Find what made SERVICE use more CPU, in which version, and on which lines.",
        text: "Investigate a CPU regression in the service \"{service}\" with Kiln's tools.\n\
1. Call list_regressions with service \"{service}\". If it finds an increase, note the versions and the function.\n\
2. Call compare for \"{service}\" with the old version's selector as left and the new one's as right (or, with no finding, the last hour against the hour before). Report only the functions marked significant, with their change in percentage points and confidence.\n\
3. For the top significant increase, call source_lines to find the hot lines, and flame_graph with focus on that function to see its callers.\n\
4. Answer: what regressed, since which version or time, by how much, where in the code, and how sure Kiln is. Include the links from the answers.",
    },
    Prompt {
        name: "explain_service_cpu",
        title: "Where does a service spend its CPU?",
        description: "Summarise where SERVICE spends its CPU now and whether that changed.",
        text: "Explain where the service \"{service}\" spends its CPU time.\n\
1. Call top_functions for \"{service}\" (by self, then by total).\n\
2. Call flame_graph for \"{service}\" to see the hot paths.\n\
3. Call series for \"{service}\" over the last 24 hours to see whether usage changed, and when.\n\
Answer in a few sentences, with the figures and the links from the answers.",
    },
];

pub fn definitions() -> Vec<Value> {
    PROMPTS
        .iter()
        .map(|prompt| {
            json!({
                "name": prompt.name,
                "title": prompt.title,
                "description": prompt.description,
                "arguments": [{
                    "name": "service",
                    "description": "The service's name (service_name), as list_services shows it",
                    "required": true,
                }],
            })
        })
        .collect()
}

pub fn get(params: &Value) -> Result<Value, String> {
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    let prompt = PROMPTS
        .iter()
        .find(|prompt| prompt.name == name)
        .ok_or_else(|| format!("no prompt {name:?}; prompts/list names them"))?;
    let service = params
        .pointer("/arguments/service")
        .and_then(Value::as_str)
        .filter(|service| !service.is_empty())
        .ok_or_else(|| format!("the prompt {name:?} needs the argument \"service\""))?;
    Ok(json!({
        "description": prompt.description.replace("SERVICE", service),
        "messages": [{
            "role": "user",
            "content": { "type": "text", "text": prompt.text.replace("{service}", service) },
        }],
    }))
}
