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

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
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
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((method.to_string(), route.to_string(), status))
                .or_default() += 1;
        }
        if let Ok(mut l) = self.latency.lock() {
            let h = l.entry(route.to_string()).or_default();
            h.count += 1;
            h.sum_ms += ms;
            for (i, b) in BUCKETS_MS.iter().enumerate() {
                if ms <= *b {
                    h.buckets[i] += 1;
                }
            }
        }
    }

    /// Renders every metric; `store` holds gauges measured at scrape time.
    pub fn render(&self, store: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP skillbox_http_requests_total HTTP requests by method, route and status.\n# TYPE skillbox_http_requests_total counter\n");
        if let Ok(r) = self.requests.lock() {
            for ((m, route, status), n) in r.iter() {
                let _ = writeln!(
                    out,
                    "skillbox_http_requests_total{{method=\"{m}\",route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP skillbox_http_request_duration_seconds Request latency by route.\n# TYPE skillbox_http_request_duration_seconds histogram\n");
        if let Ok(l) = self.latency.lock() {
            for (route, h) in l.iter() {
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
        }
        for (name, help, v) in [
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
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        for (name, help, v) in store {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        out
    }
}
