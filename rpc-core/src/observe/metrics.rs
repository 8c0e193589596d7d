//! Per-method call metrics through the [`metrics`] facade, named as grpc-ecosystem's
//! `go-grpc-prometheus` names them, so existing dashboards and alerts apply.

use std::sync::{Once, OnceLock};

use metrics::{Counter, Gauge, Histogram, Unit};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::Side;
use crate::Code;

/// The metric names of one side.
struct Names {
    started: &'static str,
    handled: &'static str,
    seconds: &'static str,
    in_flight: &'static str,
}

const CLIENT: Names = Names {
    started: "grpc_client_started_total",
    handled: "grpc_client_handled_total",
    seconds: "grpc_client_handling_seconds",
    in_flight: "grpc_client_in_flight",
};

const SERVER: Names = Names {
    started: "grpc_server_started_total",
    handled: "grpc_server_handled_total",
    seconds: "grpc_server_handling_seconds",
    in_flight: "grpc_server_in_flight",
};

impl Side {
    fn names(self) -> &'static Names {
        match self {
            Side::Client => &CLIENT,
            Side::Server => &SERVER,
        }
    }
}

/// The handles of one method on one side, registered with the recorder installed when the
/// method is first called with metrics on ([`super::enable_metrics`]).
pub(crate) struct MethodMetrics {
    side: Side,
    service: &'static str,
    method: &'static str,
    pub(crate) started: Counter,
    pub(crate) in_flight: Gauge,
    pub(crate) seconds: Histogram,
    handled: [OnceLock<Counter>; 17],
}

impl std::fmt::Debug for MethodMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodMetrics")
            .field("side", &self.side)
            .field("service", &self.service)
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

impl MethodMetrics {
    /// The metrics of `path` (`/package.Service/Method`) on `side`: one set per method and
    /// side for the life of the process.
    pub(crate) fn of(side: Side, path: &'static str) -> &'static MethodMetrics {
        static ALL: OnceLock<Mutex<FxHashMap<(Side, &'static str), &'static MethodMetrics>>> =
            OnceLock::new();
        let mut all = ALL.get_or_init(Default::default).lock();
        all.entry((side, path))
            .or_insert_with(|| Box::leak(Box::new(MethodMetrics::register(side, path))))
    }

    fn register(side: Side, path: &'static str) -> MethodMetrics {
        describe();
        let names = side.names();
        let (service, method) = split_path(path);
        let labels = [("grpc_service", service), ("grpc_method", method)];
        MethodMetrics {
            side,
            service,
            method,
            started: metrics::counter!(names.started, &labels),
            in_flight: metrics::gauge!(names.in_flight, &labels),
            seconds: metrics::histogram!(names.seconds, &labels),
            handled: Default::default(),
        }
    }

    /// The counter of calls that ended with `code`.
    pub(crate) fn handled(&self, code: Code) -> &Counter {
        self.handled[code as usize].get_or_init(|| {
            metrics::counter!(
                self.side.names().handled,
                "grpc_service" => self.service,
                "grpc_method" => self.method,
                "grpc_code" => code.as_str(),
            )
        })
    }
}

/// `("package.Service", "Method")` of `/package.Service/Method`.
fn split_path(path: &'static str) -> (&'static str, &'static str) {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    trimmed.rsplit_once('/').unwrap_or(("", trimmed))
}

/// Describes the metrics to the recorder, once.
fn describe() {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(|| {
        for (side, names) in [("client", &CLIENT), ("server", &SERVER)] {
            metrics::describe_counter!(names.started, format!("RPCs started on the {side}"));
            metrics::describe_counter!(
                names.handled,
                format!("RPCs completed on the {side}, by status code")
            );
            metrics::describe_histogram!(
                names.seconds,
                Unit::Seconds,
                format!("Time from start to end of RPCs on the {side}")
            );
            metrics::describe_gauge!(names.in_flight, format!("RPCs in flight on the {side}"));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::split_path;

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(split_path("/echo.Echo/Echo"), ("echo.Echo", "Echo"));
        assert_eq!(split_path("/a.b.C/D"), ("a.b.C", "D"));
        assert_eq!(split_path("odd"), ("", "odd"));
    }
}
