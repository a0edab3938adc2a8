//! `Body<T>`, the JSON request body of every endpoint that takes one. It tells apart what
//! `web::Json` lumps together as 400:
//!
//! - not JSON at all (or not sent as `application/json`): 400 `malformed_json`;
//! - over 1 MiB: 413 `malformed_json`;
//! - JSON holding a NUL character (`\u0000`) in a key or a string, which no text column can
//!   store: 422 `invalid_text`, naming where (a JSON pointer);
//! - well-formed JSON that is not what the endpoint takes (a missing or unknown field, a
//!   wrong type, an unknown variant): 422 `invalid_body`, naming the field.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{web, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::problem::{ApiError, ErrorCode};

/// The largest request body taken.
pub const BODY_LIMIT: usize = 1 << 20;

/// A JSON request body, checked as the module says.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<T> Body<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for Body<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let json = is_json(request);
        let bytes = web::Bytes::from_request(request, payload);
        Box::pin(async move {
            let bytes = bytes.await.map_err(|error| {
                let too_large =
                    error.as_response_error().status_code() == StatusCode::PAYLOAD_TOO_LARGE;
                if too_large {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        ErrorCode::MalformedJson,
                        format!("the body is over {BODY_LIMIT} bytes"),
                    )
                } else {
                    ApiError::bad_request(
                        ErrorCode::MalformedJson,
                        format!("the body could not be read: {error}"),
                    )
                }
            })?;
            if !json {
                return Err(ApiError::bad_request(
                    ErrorCode::MalformedJson,
                    "send the body as JSON with `Content-Type: application/json`",
                ));
            }
            parse(&bytes).map(Body)
        })
    }
}

/// `application/json` or a `+json` type.
fn is_json(request: &HttpRequest) -> bool {
    request
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|mime| mime.trim().to_ascii_lowercase())
        .is_some_and(|mime| mime == "application/json" || mime.ends_with("+json"))
}

/// The body as `T`, or the problem with it.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|error| {
        ApiError::bad_request(
            ErrorCode::MalformedJson,
            format!("the body is not JSON: {error}"),
        )
    })?;
    if let Some(pointer) = nul_at(&value, String::new()) {
        return Err(ApiError::unprocessable(
            ErrorCode::InvalidText,
            format!(
                "{} holds a NUL character (\\u0000), which no text may hold",
                if pointer.is_empty() { "/" } else { &pointer }
            ),
        ));
    }
    // From the bytes again (not the value), so that the message says where: the path of the
    // field with a wrong value (e.g. `app.job.speed_changes[0].serial_iteration_time`), then
    // serde's own words, which name a field missing or unknown and the line and column.
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!("{path}: ")
        };
        ApiError::unprocessable(
            ErrorCode::InvalidBody,
            format!(
                "the body is JSON but not what this endpoint takes: {at}{}",
                error.inner()
            ),
        )
    })
}

/// The JSON pointer of the first key or string holding a NUL character.
fn nul_at(value: &Value, at: String) -> Option<String> {
    let escape = |key: &str| key.replace('~', "~0").replace('/', "~1");
    match value {
        Value::String(text) => text.contains('\0').then_some(at),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(index, item)| nul_at(item, format!("{at}/{index}"))),
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            let here = format!("{at}/{}", escape(key));
            if key.contains('\0') {
                Some(here)
            } else {
                nul_at(item, here)
            }
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Named {
        name: String,
        count: u32,
    }

    fn code_of(bytes: &str) -> (u16, ErrorCode, String) {
        let error = parse::<Named>(bytes.as_bytes()).expect_err("refused");
        (error.status.as_u16(), error.code, error.detail)
    }

    #[test]
    fn each_kind_of_bad_body_has_its_own_status_and_code() {
        assert_eq!(code_of("{").0, 400);
        assert_eq!(code_of("{").1, ErrorCode::MalformedJson);
        let (status, code, detail) = code_of(r#"{"name": "a\u0000b", "count": 1}"#);
        assert_eq!((status, code), (422, ErrorCode::InvalidText));
        assert!(detail.starts_with("/name "), "{detail}");
        let (status, code, detail) = code_of(r#"{"name": "a", "count": 1, "x": {"k\u0000": 1}}"#);
        assert_eq!((status, code), (422, ErrorCode::InvalidText));
        assert!(detail.starts_with("/x/k"), "{detail}");
        let (status, code, detail) = code_of(r#"{"name": "a"}"#);
        assert_eq!((status, code), (422, ErrorCode::InvalidBody));
        assert!(detail.contains("count"), "{detail}");
        let (status, code, detail) = code_of(r#"{"name": "a", "count": -1}"#);
        assert_eq!((status, code), (422, ErrorCode::InvalidBody));
        assert!(detail.contains("takes: count: invalid value"), "{detail}");
        assert!(detail.contains("column"), "{detail}");
        assert!(parse::<Named>(br#"{"name": "a", "count": 2}"#).is_ok());
    }
}

/// Checks a name people read (a tenant's, an app's): 1 to `max_chars` characters, not blank,
/// without control characters or the invisible bidirectional formatting characters that can
/// make one name display as another (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to
/// U+2069). The error names `field`.
pub fn check_name(field: &str, name: &str, max_chars: usize) -> Result<(), String> {
    let length = name.chars().count();
    if name.trim().is_empty() || length > max_chars {
        return Err(format!(
            "{field} must be 1 to {max_chars} characters and not blank (got {length})"
        ));
    }
    let bidi = |c: char| matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    match name.chars().find(|&c| c.is_control() || bidi(c)) {
        Some(c) => Err(format!(
            "{field} must not hold control or bidirectional formatting characters (found U+{:04X})",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod name_tests {
    use super::check_name;

    #[test]
    fn names_are_bounded_and_hold_no_invisible_controls() {
        assert_eq!(check_name("name", "vision-team", 100), Ok(()));
        assert_eq!(check_name("name", "équipe vision", 100), Ok(()));
        for bad in [
            "",
            "   ",
            "a\u{202E}b",
            "a\u{2066}b",
            "tab\there",
            "new\nline",
        ] {
            let refusal = check_name("name", bad, 100).expect_err(bad);
            assert!(refusal.starts_with("name "), "{refusal}");
        }
        assert!(check_name("name", &"x".repeat(101), 100).is_err());
        assert!(check_name("name", &"é".repeat(100), 100).is_ok());
    }
}
