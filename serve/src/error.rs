//! Errors in OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`, with the HTTP status each class gets.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (429 and 503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: String) -> ApiError {
        ApiError {
            status,
            message,
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: a malformed body, a wrong type or value (naming `param`).
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: (!param.is_empty()).then(|| param.to_string()),
            code: Some("invalid_value"),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                message.into(),
            )
        }
    }

    /// 400: a field draftc does not support and that would change the output.
    pub fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::invalid(param, message)
        }
    }

    pub fn context_length(message: String) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid("messages", message)
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "a valid API key is required: `Authorization: Bearer KEY`".into(),
            )
        }
    }

    pub fn model_not_found(model: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{model}` does not exist; this server serves `{served}`"),
            )
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than {limit} bytes"),
            )
        }
    }

    pub fn overloaded() -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "the server's queue is full; retry later".into(),
            )
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("service_unavailable"),
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                message.into(),
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("internal_error"),
            ..ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                message.into(),
            )
        }
    }

    pub fn not_found_route() -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no such route".into(),
        )
    }

    /// A route asked with a method it does not take (`GET` on a completions route).
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "this route does not take that method".into(),
        )
    }

    /// The JSON body (also sent as a stream's error event).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}
