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
