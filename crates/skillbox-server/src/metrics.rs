//! Prometheus metrics in the text exposition format: request counts and latencies by route,
//! publishes, conflicts, store sizes.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

const BUCKETS_MS: [f64; 12] = [
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10000.0,
];

#[derive(Default)]
struct Histogram {
    buckets: [u64; BUCKETS_MS.len()],
    count: u64,
    sum_ms: f64,
}

/// One route's requests by (method, status) and their latency.
#[derive(Default)]
struct RouteStats {
    /// A handful of entries per route: a scan beats a map.
    by_outcome: Vec<(String, u16, u64)>,
    latency: Histogram,
}

#[derive(Default)]
pub struct Metrics {
    /// By route; observing a request allocates only the first time its route is seen.
    routes: Mutex<BTreeMap<String, RouteStats>>,
    pub publishes: AtomicU64,
    pub conflicts: AtomicU64,
    pub invalid_packages: AtomicU64,
}

impl Metrics {
    /// Counts a publish (or, with `published = false`, a pointer move) by its outcome.
    pub fn count_publish<T>(
        &self,
        r: &Result<T, skillbox_registry::RegistryError>,
        published: bool,
    ) {
        use skillbox_registry::RegistryError as E;
        let counter = match r {
            Ok(_) if published => &self.publishes,
            Ok(_) => return,
            Err(E::RevisionConflict { .. }) => &self.conflicts,
            Err(E::InvalidPackage { .. }) => &self.invalid_packages,
            Err(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn observe(&self, method: &str, route: &str, status: u16, ms: f64) {
        let Ok(mut routes) = self.routes.lock() else {
            return;
        };
        if !routes.contains_key(route) {
            routes.insert(route.to_string(), RouteStats::default());
        }
        let Some(stats) = routes.get_mut(route) else {
            return;
        };
        match stats
            .by_outcome
            .iter_mut()
            .find(|(m, s, _)| m == method && *s == status)
        {
            Some((_, _, n)) => *n += 1,
            None => stats.by_outcome.push((method.to_string(), status, 1)),
        }
        let h = &mut stats.latency;
        h.count += 1;
        h.sum_ms += ms;
        for (i, b) in BUCKETS_MS.iter().enumerate() {
            if ms <= *b {
                h.buckets[i] += 1;
            }
        }
    }

    /// Renders every metric; `counters` (kept elsewhere) and `gauges` are read at scrape
    /// time.
    pub fn render(&self, counters: &[(&str, &str, u64)], gauges: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP skillbox_http_requests_total HTTP requests by method, route and status.\n# TYPE skillbox_http_requests_total counter\n");
        let Ok(routes) = self.routes.lock() else {
            return out;
        };
        for (route, stats) in routes.iter() {
            for (m, status, n) in &stats.by_outcome {
                let _ = writeln!(
                    out,
                    "skillbox_http_requests_total{{method=\"{m}\",route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP skillbox_http_request_duration_seconds Request latency by route.\n# TYPE skillbox_http_request_duration_seconds histogram\n");
        for (route, stats) in routes.iter() {
            let h = &stats.latency;
            for (i, b) in BUCKETS_MS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "skillbox_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{}\"}} {}",
                    b / 1000.0,
                    h.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "skillbox_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "skillbox_http_request_duration_seconds_sum{{route=\"{route}\"}} {}",
                h.sum_ms / 1000.0
            );
            let _ = writeln!(
                out,
                "skillbox_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
                h.count
            );
        }
        drop(routes);
        let own = [
            (
                "skillbox_publishes_total",
                "Revisions published.",
                self.publishes.load(Ordering::Relaxed),
            ),
            (
                "skillbox_publish_conflicts_total",
                "Publishes and pointer moves refused with revision_conflict.",
                self.conflicts.load(Ordering::Relaxed),
            ),
            (
                "skillbox_invalid_packages_total",
                "Publishes refused with invalid_package.",
                self.invalid_packages.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in own.iter().chain(counters) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        out
    }
}
