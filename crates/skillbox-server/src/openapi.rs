//! The OpenAPI document, written from the route table that builds the router.

use crate::routes::ROUTES;
use serde_json::{Map, Value, json};

/// The OpenAPI 3.1 document.
pub fn document() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for r in ROUTES {
        let oa_path = r.path.replace("{*path}", "{path}");
        let params: Vec<Value> = oa_path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "summary": r.summary,
            "operationId": format!("{} {}", r.method.as_str(), r.path),
            "parameters": params,
            "responses": {
                "default": {"description": "Error: {\"error\": {\"code\", \"message\", ...}}",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "200": {"description": "Success"},
            },
        });
        if let Some(role) = r.access.label() {
            op["security"] = json!([{"bearer": []}]);
            op["x-skillbox-role"] = json!(role);
        }
        let entry = paths.entry(oa_path).or_insert_with(|| json!({}));
        entry[r.method.as_str().to_lowercase()] = op;
    }
    let codes: Vec<&str> = skillbox_api::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    json!({
        "openapi": "3.1.0",
        "info": {"title": "skillbox", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Versioned registry for Agent Skills plus a sandbox runtime. See SPEC §5."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": {"type": "object", "properties": {"error": {"type": "object",
                "properties": {"code": {"type": "string", "enum": codes}, "message": {"type": "string"}}, "required": ["code", "message"]}}}}
        }
    })
}
