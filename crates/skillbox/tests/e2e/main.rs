//! The end-to-end suite: the real `skillbox` binary, as a user runs it, against real
//! bubblewrap, the real Docker engine, real archives and real `kill -9`s. One test binary (one
//! link, one process to start per test under nextest); each module is a concern, and the
//! scenarios every sandbox backend must pass are written once in [`backends`] and run under
//! each by `backend_test!`; the runs scenarios run on the embedded default and scaled out
//! (PostgreSQL + S3) by `storage_test!`.

/// Defines a test per sandbox backend for the scenario `async fn $name(backend: Backend)`:
/// bwrap, docker and remote (Core and a node), or the backends listed after a colon.
macro_rules! backend_test {
    ($name:ident) => {
        backend_test!($name: bwrap, docker, remote);
    };
    ($name:ident: $($backend:ident),+) => {
        mod $name {
            $(backend_test!(@one $name $backend);)+
        }
    };
    (@one $name:ident bwrap) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bwrap() {
            super::$name(crate::backends::Backend::Bwrap).await
        }
    };
    (@one $name:ident docker) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn docker() {
            super::$name(crate::backends::Backend::Docker(
                crate::backends::Owner::new(stringify!($name)),
            ))
            .await
        }
    };
    (@one $name:ident remote) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn remote() {
            super::$name(crate::backends::Backend::Remote(
                crate::backends::RemoteNode::new(),
            ))
            .await
        }
    };
}

/// Defines a test per deployment for the scenario `async fn $name(d: Deployment)`: the
/// embedded default and two servers' worth of PostgreSQL + S3.
macro_rules! storage_test {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                super::$name(crate::support::Deployment::Embedded).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn scale_out() {
                super::$name(crate::support::Deployment::ScaleOut).await
            }
        }
    };
}

mod support;

mod api;
mod backends;
mod cas;
mod cli_client;
mod cli_offline;
mod crash;
mod deps;
mod docker;
mod gc;
mod hardening;
mod lifecycle;
mod nodes;
mod run_drafts;
mod runs;
mod sandbox;
mod scale_out;
mod tenants;
mod wire;
