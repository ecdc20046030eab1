//! What several servers on one PostgreSQL database hear from each other: `LISTEN` on the
//! channels that `schema_postgres.sql`'s triggers notify at commit.
//!
//! - `skillbox_pins`: a run finished or expired, a revision was revoked or collected. Every
//!   server bumps its pin-cache generation, so its next pinned read asks the database; a
//!   revocation (payload `<skill id> <revision> revoked`) also goes to the server's revocation
//!   subscribers, which kill the executions mounting it there.
//! - `skillbox_events`: an event was appended. Every server wakes its `/events` followers.
//!
//! A notification sent while a server is not listening (connecting, or its listening connection
//! was lost) is never delivered, so the pin cache is off from the moment listening stops until
//! `LISTEN` is back, and the generation is bumped when it is back (whatever was cached before
//! may be stale).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

const PINS: &str = "skillbox_pins";
const EVENTS: &str = "skillbox_events";

/// A pin-cache generation bumped by notifications, usable only while they are heard.
#[derive(Default)]
pub(crate) struct NotifiedGeneration {
    generation: AtomicU64,
    listening: AtomicBool,
}

impl NotifiedGeneration {
    /// The generation, or `None` while notifications may be missed (the cache must not be used).
    pub(crate) fn current(&self) -> Option<u64> {
        // Read `listening` after the generation: a loss bumps the generation after clearing
        // `listening`, so a reader that sees `listening` set and the old generation is refused
        // when it stores its entry (the generation moved meanwhile).
        let g = self.generation.load(Ordering::SeqCst);
        self.listening.load(Ordering::SeqCst).then_some(g)
    }

    pub(crate) fn bump(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// Stops the listener when the registry is dropped.
pub(crate) struct Listener(tokio::task::JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens on `url` for as long as the returned handle lives, reconnecting after a loss.
pub(crate) fn listen(url: String, hearers: Hearers) -> Listener {
    Listener(tokio::spawn(async move {
        let mut announced_loss = false;
        loop {
            match follow(&url, &hearers).await {
                Ok(()) => {}
                Err(e) if !announced_loss => {
                    tracing::warn!(error = %e, "not hearing other servers' changes: pin cache off until reconnected");
                    announced_loss = true;
                }
                Err(_) => {}
            }
            hearers.pins.listening.store(false, Ordering::SeqCst);
            hearers.pins.bump();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }))
}

/// Who is told what the database announces.
pub(crate) struct Hearers {
    pub pins: Arc<NotifiedGeneration>,
    pub changes: Arc<watch::Sender<u64>>,
    pub revocations: tokio::sync::broadcast::Sender<(String, i64)>,
}

/// One listening connection, until it is lost.
async fn follow(url: &str, hearers: &Hearers) -> Result<(), sqlx::Error> {
    let Hearers {
        pins,
        changes,
        revocations,
    } = hearers;
    let mut listener = sqlx::postgres::PgListener::connect(url).await?;
    listener.listen_all([PINS, EVENTS]).await?;
    // Anything may have changed while nobody listened.
    pins.bump();
    pins.listening.store(true, Ordering::SeqCst);
    changes.send_modify(|v| *v += 1);
    tracing::debug!("listening for other servers' changes");
    while let Some(note) = listener.try_recv().await? {
        match note.channel() {
            PINS => {
                pins.bump();
                let mut words = note.payload().split(' ');
                if let (Some(skill_id), Some(Ok(revision)), Some("revoked")) = (
                    words.next(),
                    words.next().map(str::parse::<i64>),
                    words.next(),
                ) {
                    let _ = revocations.send((skill_id.to_string(), revision));
                }
            }
            _ => {
                changes.send_modify(|v| *v += 1);
            }
        }
    }
    Err(sqlx::Error::Protocol(
        "the listening connection was lost".into(),
    ))
}
