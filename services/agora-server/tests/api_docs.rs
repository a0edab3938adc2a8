//! The API contract: docs/api.md documents every endpoint of the OpenAPI document, each with
//! an example, and its error codes are `ErrorCode`; the document is fully typed.

use std::collections::{BTreeMap, BTreeSet};

use agora_server::api::problem::ErrorCode;
use agora_server::api::ApiDoc;
use serde_json::{json, Value};
use utoipa::OpenApi;

#[test]
fn every_endpoint_has_a_section_with_an_example_in_the_api_guide() {
    let guide = include_str!("../../../docs/api.md");
    let sections: Vec<&str> = guide.split("\n### ").skip(1).collect();
    let openapi = ApiDoc::openapi();
    let mut undocumented = Vec::new();
    for (path, item) in &openapi.paths.paths {
        for (method, operation) in [
            ("GET", &item.get),
            ("POST", &item.post),
            ("PUT", &item.put),
            ("PATCH", &item.patch),
            ("DELETE", &item.delete),
        ] {
            if operation.is_none() {
                continue;
            }
            let heading = format!("`{method} {path}`");
            match sections
                .iter()
                .find(|section| section.starts_with(&heading))
            {
                Some(section) if section.contains("```") => {}
                Some(_) => undocumented.push(format!("{heading} (no example)")),
                None => undocumented.push(heading),
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "docs/api.md lacks a `### METHOD /path` section with an example for: {undocumented:#?}"
    );
}

/// docs/api.md's table of error codes is `ErrorCode`: each code under its status, none missing
/// and none extra.
#[test]
fn the_error_table_of_the_api_guide_is_the_error_code_enum() {
    let guide = include_str!("../../../docs/api.md");
    let table = guide
        .split("| Status | Codes |")
        .nth(1)
        .expect("docs/api.md has the table of error codes");
    let mut documented: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    for row in table
        .lines()
        .skip(2)
        .map(str::trim)
        .take_while(|row| row.starts_with('|'))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let status: u16 = cells[1].parse().expect("a status");
        // The codes are the backticked words; words after them explain.
        let codes = cells[2].split('`').skip(1).step_by(2).map(str::to_owned);
        documented.entry(status).or_default().extend(codes);
    }
    let mut expected: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    for code in ErrorCode::ALL {
        expected
            .entry(code.status().as_u16())
            .or_default()
            .insert(code.as_str().to_owned());
    }
    assert_eq!(documented, expected);
}

/// Every schema of the OpenAPI document is typed: no object without properties (an untyped
/// object), and every error answer is problem+json.
#[test]
fn the_openapi_document_is_fully_typed() {
    let document = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let mut untyped = Vec::new();
    untyped_objects(&document, "#", &mut untyped);
    assert!(untyped.is_empty(), "untyped objects: {untyped:#?}");
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("an item") {
            let responses = operation["responses"].as_object().expect("responses");
            for status in ["401", "503"] {
                assert!(
                    responses.contains_key(status),
                    "{method} {path} lacks {status}"
                );
            }
            for (status, response) in responses {
                if status.as_str() >= "400" {
                    assert!(
                        response["content"]["application/problem+json"].is_object(),
                        "{method} {path} {status} is not problem+json"
                    );
                }
            }
        }
    }
}

fn untyped_objects(value: &Value, at: &str, found: &mut Vec<String>) {
    let Some(fields) = value.as_object() else {
        if let Some(items) = value.as_array() {
            for (index, item) in items.iter().enumerate() {
                untyped_objects(item, &format!("{at}/{index}"), found);
            }
        }
        return;
    };
    let is_object = fields.get("type").is_some_and(|kind| {
        kind == "object"
            || kind
                .as_array()
                .is_some_and(|kinds| kinds.contains(&json!("object")))
    });
    let described = [
        "properties",
        "additionalProperties",
        "allOf",
        "oneOf",
        "anyOf",
        "$ref",
    ]
    .iter()
    .any(|key| fields.contains_key(*key));
    if is_object && !described {
        found.push(at.to_owned());
    }
    for (key, child) in fields {
        untyped_objects(child, &format!("{at}/{key}"), found);
    }
}

/// The schemas that mirror the engine's wire types (`api/schemas.rs`) name exactly the fields
/// the engine's types serialise.
#[test]
fn the_mirrored_schemas_have_the_engines_fields() {
    use agora_market::app::AppKind;
    use agora_market::progress::JobProgress;
    let document = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let schemas = &document["components"]["schemas"];
    let fields = |value: &Value| -> BTreeSet<String> {
        value
            .as_object()
            .expect("an object")
            .keys()
            .cloned()
            .collect()
    };
    let properties = |name: &str| fields(&schemas[name]["properties"]);
    let curve: AppKind = serde_json::from_value(json!({ "kind": "performance_curve", "jobs": [
        { "job": { "id": "j", "total_iterations": 10, "serial_iteration_time": 1.0,
                   "max_gpus": 1 }, "predicted_final_iteration": 8 }] }))
    .expect("an app");
    let curve = serde_json::to_value(curve).expect("serialises");
    let curve_job = &curve["jobs"][0];
    assert_eq!(fields(curve_job), properties("CurveJob"));
    assert_eq!(fields(&curve_job["job"]), properties("Job"));
    assert_eq!(
        fields(&curve_job["job"]["slowdown"]),
        properties("PlacementSlowdown")
    );
    let progress: JobProgress = serde_json::from_value(json!({ "job": "j",
        "completed_iterations": 3, "observed": { "locality": "same_slot", "gpus": 1,
        "seconds_per_iteration": 0.5 } }))
    .expect("a report");
    let progress = serde_json::to_value(progress).expect("serialises");
    assert_eq!(fields(&progress), properties("JobProgress"));
    assert_eq!(
        fields(&progress["observed"]),
        properties("ObservedIterations")
    );
}
