//! The admin routes: one `match` on method and path. A route that takes a
//! body (the coming `POST /streams`) finds it in `body`, already read and at
//! most [`ADMIN_BODY_BYTES_MAX`] bytes (`413` beyond).

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::admin::{
    AdminState, aggregates, cluster, collect_groups, collect_partitions, collect_stats, render, streams,
};

/// Largest admin request body read, in bytes (`413` beyond). No route takes a
/// body yet; routes that will (`POST /streams`) get it already bounded.
pub(super) const ADMIN_BODY_BYTES_MAX: usize = 64 * 1024;

const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";
const JSON: &str = "application/json";
const TEXT: &str = "text/plain";

/// Answers one request.
pub async fn route(state: &AdminState, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let path = parts.uri.path();
    if aggregates::matches(path) {
        return match aggregates::route(state, &parts.method, path, parts.uri.query(), &body).await {
            Ok((status, body)) => respond(status, JSON, body),
            Err(failure) => respond(failure.status, TEXT, failure.message),
        };
    }
    match (&parts.method, path) {
        (&Method::GET, "/metrics") => match (collect_stats(state).await, collect_groups(state).await) {
            (Ok(stats), Ok((groups, partitions))) => {
                let mut text = render::prometheus(state, &stats);
                render::group_metrics(&mut text, &groups, &partitions);
                if let Some(view) = cluster::collect(state).await {
                    cluster::metrics(&mut text, &view);
                }
                respond(200, PROMETHEUS, text)
            }
            (Err(error), _) | (_, Err(error)) => respond(503, TEXT, error.to_string()),
        },
        (&Method::GET, "/groups") => match collect_groups(state).await {
            Ok((groups, partitions)) => respond(200, JSON, render::groups_json(&groups, &partitions)),
            Err(error) => respond(503, TEXT, error.to_string()),
        },
        (&Method::GET, "/stats") => match collect_stats(state).await {
            Ok(stats) => respond(200, JSON, render::stats_json(state, &stats)),
            Err(error) => respond(503, TEXT, error.to_string()),
        },
        (&Method::GET, "/partitions") => match collect_partitions(state).await {
            Ok(partitions) => respond(200, JSON, render::partitions_json(&partitions)),
            Err(error) => respond(503, TEXT, error.to_string()),
        },
        (&Method::GET, "/cluster") => match cluster::collect(state).await {
            Some(view) => {
                let catalog = match &state.replicated {
                    Some(replicated) => replicated.json(&*state.catalog.lock().await),
                    None => serde_json::Value::Null,
                };
                respond(200, JSON, cluster::json(&view, catalog))
            }
            None => respond(503, TEXT, "the cluster thread did not answer\n".to_string()),
        },
        (&Method::GET, "/streams") => stream_response(200, streams::list(state).await),
        (&Method::POST, "/streams") => stream_response(201, streams::create(state, &body).await),
        (&Method::DELETE, _) if path.starts_with("/streams/") => {
            stream_response(200, streams::delete(state, &path["/streams/".len()..]).await)
        }
        (&Method::GET, "/") => respond(
            200,
            TEXT,
            "spate admin: GET /metrics, /stats, /partitions, /cluster, /streams, /groups, /streams/NAME/aggregates, \
             /aggregates/AGG?key=K, /aggregates/AGG/top?n=N; POST /streams, /streams/NAME/aggregates; \
             DELETE /streams/NAME, /streams/NAME/aggregates/AGG\n"
                .to_string(),
        ),
        (&Method::GET, _) | (&Method::POST, _) | (&Method::DELETE, _) => {
            respond(404, TEXT, format!("not found: {path}\n"))
        }
        _ => respond(405, TEXT, "only GET, POST and DELETE are supported\n".to_string()),
    }
}

/// Reads a request body of at most [`ADMIN_BODY_BYTES_MAX`] bytes, or the
/// response that refuses it.
async fn read_body(body: Incoming) -> Result<Bytes, Response<Full<Bytes>>> {
    match Limited::new(body, ADMIN_BODY_BYTES_MAX).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(respond(413, TEXT, format!("request body over {ADMIN_BODY_BYTES_MAX} bytes\n")))
        }
        Err(error) => Err(respond(400, TEXT, format!("cannot read the request body: {error}\n"))),
    }
}

fn stream_response(status: u16, result: Result<String, streams::Failure>) -> Response<Full<Bytes>> {
    match result {
        Ok(body) => respond(status, JSON, body),
        Err(failure) => respond(failure.status, TEXT, failure.message),
    }
}

fn respond(status: u16, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
