//! docs/api.md documents every endpoint of the OpenAPI document, each with an example.

use agora_server::api::ApiDoc;
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

/// The table of error codes in docs/api.md is exactly `ErrorCode`: every code under every
/// status it is answered with, and nothing else.
#[test]
fn the_api_guides_table_of_error_codes_is_the_error_code_enum() {
    use std::collections::BTreeSet;

    use agora_server::api::problem::ErrorCode;

    let guide = include_str!("../../../docs/api.md");
    let table = guide
        .split("| Status | Codes |")
        .nth(1)
        .expect("docs/api.md has the table of error codes");
    let mut documented = BTreeSet::new();
    for row in table
        .lines()
        .skip(2)
        .map(str::trim)
        .take_while(|line| line.starts_with('|'))
    {
        let cells: Vec<&str> = row.split('|').collect();
        let status: u16 = cells[1].trim().parse().expect("a status");
        for code in cells[2].split('`').skip(1).step_by(2) {
            documented.insert((status, code.to_owned()));
        }
    }
    let declared: BTreeSet<(u16, String)> = ErrorCode::ALL
        .iter()
        .flat_map(|code| {
            code.statuses()
                .iter()
                .map(move |&status| (status, code.as_str().to_owned()))
        })
        .collect();
    assert_eq!(
        documented, declared,
        "docs/api.md's table of error codes differs from ErrorCode"
    );
    let schema = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let codes = &schema["components"]["schemas"]["ErrorCode"]["enum"];
    let listed: BTreeSet<&str> = codes
        .as_array()
        .expect("the OpenAPI document lists the error codes")
        .iter()
        .filter_map(|code| code.as_str())
        .collect();
    let all: BTreeSet<&str> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
    assert_eq!(listed, all);
}

/// The OpenAPI document's answers: every operation documents the problems any request can get,
/// every error answer is `application/problem+json` with the `Problem` schema (whose `code` is
/// the list of codes), and the event streams are `text/event-stream`.
#[test]
fn every_error_answer_is_a_documented_problem_and_streams_are_event_streams() {
    let document = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let paths = document["paths"].as_object().expect("paths");
    let mut wrong = Vec::new();
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("an item") {
            let responses = operation["responses"].as_object().expect("responses");
            for required in ["401", "503"] {
                if !responses.contains_key(required) {
                    wrong.push(format!("{method} {path}: no {required}"));
                }
            }
            for (status, response) in responses {
                let content = response["content"].as_object();
                if status.starts_with('4') || status.starts_with('5') {
                    let problem = &response["content"]["application/problem+json"]["schema"];
                    if problem["$ref"] != "#/components/schemas/Problem"
                        || content.is_some_and(|content| content.len() != 1)
                    {
                        wrong.push(format!(
                            "{method} {path} {status}: not a problem: {response}"
                        ));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    for stream in ["/v1/apps/{app}/events", "/v1/rounds/events"] {
        let content = &paths[stream]["get"]["responses"]["200"]["content"];
        assert!(
            content.get("text/event-stream").is_some(),
            "{stream}: {content}"
        );
    }
    let code = &document["components"]["schemas"]["Problem"]["properties"]["code"];
    assert_eq!(code["$ref"], "#/components/schemas/ErrorCode", "{code}");
}

/// Every schema of the served document says what it holds: no `object` without properties or
/// typed values, and no schema that admits any JSON (a client generated from the document gets
/// a type for every field: the app description, progress reports, event payloads included).
#[test]
fn the_openapi_document_is_fully_typed() {
    use serde_json::Value;

    /// Collects the schemas at and under `schema` (found at `at`) that leave their content open.
    fn untyped(schema: &Value, at: &str, found: &mut Vec<String>) {
        let Some(fields) = schema.as_object() else {
            return;
        };
        for combinator in ["oneOf", "anyOf", "allOf"] {
            for (index, item) in fields
                .get(combinator)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                untyped(item, &format!("{at}/{combinator}/{index}"), found);
            }
        }
        for (name, property) in fields
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            untyped(property, &format!("{at}/properties/{name}"), found);
        }
        for key in ["items", "additionalProperties"] {
            if let Some(inner) = fields.get(key) {
                untyped(inner, &format!("{at}/{key}"), found);
            }
        }
        let says_what = ["$ref", "oneOf", "anyOf", "allOf", "enum", "const"]
            .iter()
            .any(|key| fields.contains_key(*key));
        let types: Vec<&str> = match fields.get("type") {
            Some(Value::String(name)) => vec![name.as_str()],
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let open_object = types.contains(&"object")
            && fields
                .get("properties")
                .and_then(Value::as_object)
                .is_none_or(|properties| properties.is_empty())
            && !fields
                .get("additionalProperties")
                .is_some_and(Value::is_object);
        if (types.is_empty() && !says_what) || open_object {
            found.push(format!("{at}: {schema}"));
        }
    }

    /// Every schema the document uses: the named ones, parameters', bodies' and answers'.
    fn schemas_of(value: &Value, at: &str, found: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                for (key, inner) in fields {
                    let here = format!("{at}/{key}");
                    if key == "schema" {
                        untyped(inner, &here, found);
                    } else {
                        schemas_of(inner, &here, found);
                    }
                }
            }
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    schemas_of(item, &format!("{at}/{index}"), found);
                }
            }
            _ => {}
        }
    }

    let document = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let mut found = Vec::new();
    schemas_of(&document["paths"], "#/paths", &mut found);
    let named = document["components"]["schemas"]
        .as_object()
        .expect("named schemas");
    for (name, schema) in named {
        untyped(schema, &format!("#/components/schemas/{name}"), &mut found);
    }
    assert!(found.is_empty(), "untyped schemas: {found:#?}");
    for expected in [
        "AppKind",
        "Job",
        "JobProgress",
        "EventPayload",
        "OfferEvent",
    ] {
        assert!(named.contains_key(expected), "no schema {expected}");
    }
}

/// Every operation documents its success and every problem a request of its shape can get
/// (`401` and `503` always, `400` with a query, header or body, `404` with a path parameter,
/// `413` and `422` with a body): a client generated from the document knows each status.
#[test]
fn every_operation_documents_its_statuses() {
    let document = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let mut missing = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("an item") {
            let responses = operation["responses"].as_object().expect("responses");
            let parameters: Vec<&str> = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|parameter| parameter["in"].as_str())
                .collect();
            let takes_body = operation.get("requestBody").is_some();
            let mut expected = vec!["401", "503"];
            if takes_body
                || parameters
                    .iter()
                    .any(|at| matches!(*at, "query" | "header"))
            {
                expected.push("400");
            }
            if parameters.contains(&"path") {
                expected.push("404");
            }
            if takes_body {
                expected.extend(["413", "422"]);
            }
            if !responses.keys().any(|status| status.starts_with('2')) {
                missing.push(format!("{method} {path}: no success"));
            }
            for status in expected {
                if !responses.contains_key(status) {
                    missing.push(format!("{method} {path}: no {status}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}
