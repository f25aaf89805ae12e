//! The route table: method and path to a mode's route, pure.
//!
//! A mode lists its routes once ([`Routes::get`], [`Routes::post`], [`Routes::delete`]);
//! a path segment `{name}` matches any one non-empty segment and is handed to the
//! handler as a parameter. A path no route has is 404; a path some route has with
//! another method is 405 (naming the methods it takes). What a route needs follows from
//! its method: GET reads ([`Access::Read`], any token), POST and DELETE act
//! ([`Access::Act`], an operator's token, and an audit line).

use hyper::Method;

use crate::reply::ApiError;

/// What a route needs of the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Act,
}

#[derive(Debug)]
struct Entry<R> {
    method: Method,
    pattern: &'static str,
    route: R,
}

/// A mode's routes, `R` its own name for each.
#[derive(Debug)]
pub struct Routes<R> {
    entries: Vec<Entry<R>>,
}

impl<R> Default for Routes<R> {
    fn default() -> Self {
        Routes { entries: Vec::new() }
    }
}

/// The route a request asked for, with its `{name}` parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<R> {
    pub route: R,
    pub access: Access,
    /// `METHOD /pattern`: the action an audit line names.
    pub action: String,
    pub params: Vec<(&'static str, String)>,
}

impl<R: Copy> Routes<R> {
    pub fn new() -> Routes<R> {
        Routes::default()
    }

    /// A read.
    pub fn get(self, pattern: &'static str, route: R) -> Routes<R> {
        self.with(Method::GET, pattern, route)
    }

    /// An action.
    pub fn post(self, pattern: &'static str, route: R) -> Routes<R> {
        self.with(Method::POST, pattern, route)
    }

    /// An action.
    pub fn delete(self, pattern: &'static str, route: R) -> Routes<R> {
        self.with(Method::DELETE, pattern, route)
    }

    fn with(mut self, method: Method, pattern: &'static str, route: R) -> Routes<R> {
        debug_assert!(pattern.starts_with('/'), "{pattern}");
        self.entries.push(Entry { method, pattern, route });
        self
    }

    /// The route for `method` and `path`: 404 when no route has the path, 405 when
    /// routes have it with other methods.
    pub fn find(&self, method: &Method, path: &str) -> Result<Found<R>, ApiError> {
        let mut allowed: Vec<&str> = Vec::new();
        for entry in &self.entries {
            let Some(params) = matches(entry.pattern, path) else { continue };
            if entry.method == *method {
                let access = if *method == Method::GET { Access::Read } else { Access::Act };
                return Ok(Found {
                    route: entry.route,
                    access,
                    action: format!("{} {}", entry.method, entry.pattern),
                    params,
                });
            }
            allowed.push(entry.method.as_str());
        }
        if allowed.is_empty() {
            Err(ApiError::not_found(path, self.entries.iter().map(|e| e.pattern)))
        } else {
            allowed.dedup();
            Err(ApiError::method_not_allowed(method, &allowed))
        }
    }
}

/// The parameters of `path` if it matches `pattern`.
fn matches(pattern: &'static str, path: &str) -> Option<Vec<(&'static str, String)>> {
    let mut params = Vec::new();
    let mut want = pattern.split('/');
    let mut have = path.split('/');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return Some(params),
            (Some(w), Some(h)) => {
                if let Some(name) = w.strip_prefix('{').and_then(|w| w.strip_suffix('}')) {
                    if h.is_empty() {
                        return None;
                    }
                    params.push((name, h.to_owned()));
                } else if w != h {
                    return None;
                }
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use hyper::StatusCode;

    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum R {
        Status,
        Replay,
        StopReplay,
        StartReplay,
    }

    fn routes() -> Routes<R> {
        Routes::new()
            .get("/api/v1/status", R::Status)
            .post("/api/v1/replays", R::StartReplay)
            .get("/api/v1/replays/{id}", R::Replay)
            .delete("/api/v1/replays/{id}", R::StopReplay)
    }

    #[test]
    fn finds_routes_with_their_parameters_and_access() {
        let r = routes();
        let found = r.find(&Method::GET, "/api/v1/status").unwrap();
        assert_eq!((found.route, found.access, found.params.len()), (R::Status, Access::Read, 0));
        let found = r.find(&Method::DELETE, "/api/v1/replays/17").unwrap();
        assert_eq!((found.route, found.access), (R::StopReplay, Access::Act));
        assert_eq!(found.params, vec![("id", "17".to_owned())]);
        assert_eq!(found.action, "DELETE /api/v1/replays/{id}");
        assert_eq!(r.find(&Method::POST, "/api/v1/replays").unwrap().access, Access::Act);
    }

    #[test]
    fn unknown_paths_are_404_and_wrong_methods_405() {
        let r = routes();
        for path in ["/", "/api/v1/status/", "/api/v1/replays/", "/api/v1/replays/1/2", "/api/v2/status"] {
            assert_eq!(r.find(&Method::GET, path).unwrap_err().status(), StatusCode::NOT_FOUND, "{path}");
        }
        let e = r.find(&Method::POST, "/api/v1/status").unwrap_err();
        assert_eq!(e.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert!(e.hint().contains("GET"), "{e:?}");
        let e = r.find(&Method::PUT, "/api/v1/replays/3").unwrap_err();
        assert!(e.hint().contains("GET") && e.hint().contains("DELETE"), "{e:?}");
    }
}
