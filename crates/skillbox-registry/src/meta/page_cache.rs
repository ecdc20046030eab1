//! SQLite's own page cache, wrapped to skip the end-of-transaction truncations that have
//! nothing to drop.
//!
//! At the end of every transaction SQLite truncates its page cache to the database's size
//! (`pager_end_transaction` → `xTruncate(dbSize + 1)`). The default cache (`pcache1`) does
//! that by walking only the hash buckets past the size, unless the largest page number it
//! ever held since the last truncation is further past the size than it has buckets: then it
//! walks every bucket and every page. A B-tree split that renumbers its new pages into
//! ascending order (`balance_nonroot`) moves one of them through a temporary number, that of
//! the lock-byte page at 1 GiB, which holds no data (page 262,145 with 4 KiB pages), and on at
//! once; the cache remembers that number as its largest. In a database under 1 GiB every commit that split a
//! page out of order then walked the whole cache: the pin writer's cache held ~5,000 pages in
//! 8,192 buckets (when SQLite's caches shared one pool and the busiest connection's grew; each
//! connection now has a cache of its own, see `.cargo/config.toml`), and the walk was 15–25%
//! of its thread in `scripts/bench-runs` (new pins at 64 connections).
//!
//! The wrapper forwards every call to the default cache and keeps, per cache, an upper bound
//! of the page numbers in it that ignores a page parked at the temporary number (counted
//! apart while one is). A truncation above that bound has nothing to drop and is not
//! forwarded; any other is. What the caches hold, and when SQLite drops what, is unchanged.
//!
//! SQLite takes a page cache only before it is initialized: [`install`] runs before this
//! process's first SQLite connection (`MetaStore::connect` and `probe` call it). Where SQLite
//! was initialized before, the default cache stays, unwrapped.

use rusqlite::ffi;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, OnceLock};

/// Whether [`install`] wrapped the cache.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Wraps SQLite's default page cache, once per process; a no-op after the first call, and
/// when SQLite is initialized already.
pub(super) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| match wrap_default() {
        Ok(()) => INSTALLED.store(true, Ordering::Release),
        Err(rc) => {
            tracing::debug!(
                rc,
                "SQLite's page cache is not wrapped (SQLite was initialized)"
            )
        }
    });
}

/// SQLite's handle of one cache: the default's own, or the wrapper's `Box<Cache>`.
type Handle = *mut ffi::sqlite3_pcache;
/// One page of a cache.
type Page = *mut ffi::sqlite3_pcache_page;

/// The default cache's methods, as SQLite gave them before the wrapper replaced them, each
/// checked present once, when saved (plain function pointers: shared between threads as they
/// are).
struct DefaultMethods {
    create: unsafe extern "C" fn(c_int, c_int, c_int) -> Handle,
    cachesize: unsafe extern "C" fn(Handle, c_int),
    pagecount: unsafe extern "C" fn(Handle) -> c_int,
    fetch: unsafe extern "C" fn(Handle, c_uint, c_int) -> Page,
    unpin: unsafe extern "C" fn(Handle, Page, c_int),
    rekey: unsafe extern "C" fn(Handle, Page, c_uint, c_uint),
    truncate: unsafe extern "C" fn(Handle, c_uint),
    destroy: unsafe extern "C" fn(Handle),
    shrink: unsafe extern "C" fn(Handle),
}

impl DefaultMethods {
    /// `None` unless every method the wrapper forwards to is set.
    fn of(methods: &ffi::sqlite3_pcache_methods2) -> Option<Self> {
        Some(DefaultMethods {
            create: methods.xCreate?,
            cachesize: methods.xCachesize?,
            pagecount: methods.xPagecount?,
            fetch: methods.xFetch?,
            unpin: methods.xUnpin?,
            rekey: methods.xRekey?,
            truncate: methods.xTruncate?,
            destroy: methods.xDestroy?,
            shrink: methods.xShrink?,
        })
    }
}

static DEFAULT: OnceLock<DefaultMethods> = OnceLock::new();

fn wrap_default() -> Result<(), c_int> {
    let mut default = std::mem::MaybeUninit::<ffi::sqlite3_pcache_methods2>::zeroed();
    // SAFETY: `sqlite3_config` is not thread-safe against other SQLite calls; it runs inside
    // `install`'s `Once`, before any SQLite connection of this process (see the module doc).
    // SQLITE_CONFIG_GETPCACHE2 takes one `sqlite3_pcache_methods2*`, which it fills (with the
    // default methods if none were set), or returns SQLITE_MISUSE once SQLite is initialized,
    // touching nothing.
    let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETPCACHE2, default.as_mut_ptr()) };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    // SAFETY: SQLite filled it (rc is SQLITE_OK); zeroed is a valid value of it anyway (null
    // pointers and `None`s).
    let default = unsafe { default.assume_init() };
    let saved = DefaultMethods::of(&default).ok_or(ffi::SQLITE_MISUSE)?;
    if DEFAULT.set(saved).is_err() {
        return Err(ffi::SQLITE_MISUSE);
    }
    let wrapper = ffi::sqlite3_pcache_methods2 {
        iVersion: default.iVersion,
        pArg: default.pArg,
        xInit: default.xInit,
        xShutdown: default.xShutdown,
        xCreate: Some(create),
        xCachesize: Some(cachesize),
        xPagecount: Some(pagecount),
        xFetch: Some(fetch),
        xUnpin: Some(unpin),
        xRekey: Some(rekey),
        xTruncate: Some(truncate),
        xDestroy: Some(destroy),
        xShrink: Some(shrink),
    };
    // SAFETY: as above; SQLITE_CONFIG_PCACHE2 takes one `sqlite3_pcache_methods2*` and copies
    // the struct. Every method below forwards to the default's, saved above.
    let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_PCACHE2, &wrapper) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rc)
    }
}

fn methods() -> &'static DefaultMethods {
    // Set before the wrapper was installed, so before any of its methods can be called.
    DEFAULT.get().expect("the default page cache is saved")
}

/// One cache: the default's, and what the wrapper knows of its page numbers.
struct Cache {
    inner: Handle,
    /// No page in the cache has a larger number, except one parked at `parking`.
    max_key: c_uint,
    /// The number `balance_nonroot` parks a page at while it swaps two pages' numbers.
    parking: c_uint,
    /// Whether a page is parked there now.
    parked: bool,
}

impl Cache {
    fn bound(&self) -> c_uint {
        if self.parked {
            self.max_key.max(self.parking)
        } else {
            self.max_key
        }
    }
}

// The methods below are SQLite's callbacks. SQLite calls a cache's methods only from the
// connection that owns the cache, one call at a time (the connection is never used by two
// threads at once), so `&mut Cache` is exclusive; the `*mut sqlite3_pcache` SQLite passes is
// the pointer `create` returned (a `Box<Cache>`) until `destroy` takes it back.

/// The byte offset of SQLite's lock-byte page (`PENDING_BYTE`, fixed in a build without test
/// hooks); the page's number is `PENDING_BYTE / page size + 1`.
const PENDING_BYTE: c_uint = 0x4000_0000;

unsafe extern "C" fn create(page_size: c_int, extra: c_int, purgeable: c_int) -> Handle {
    // SAFETY: forwarded as SQLite called it.
    let inner = unsafe { (methods().create)(page_size, extra, purgeable) };
    if inner.is_null() {
        return inner;
    }
    let cache = Cache {
        inner,
        max_key: 0,
        parking: PENDING_BYTE / page_size.max(1) as c_uint + 1,
        parked: false,
    };
    Box::into_raw(Box::new(cache)).cast()
}

/// The wrapper's cache behind SQLite's handle.
///
/// # Safety
/// `cache` is a pointer [`create`] returned and [`destroy`] has not taken back, and no other
/// reference to it is live (see above).
unsafe fn cache<'a>(cache: Handle) -> &'a mut Cache {
    // SAFETY: the caller's promise.
    unsafe { &mut *cache.cast::<Cache>() }
}

unsafe extern "C" fn cachesize(p: Handle, size: c_int) {
    // SAFETY: see `cache`; the default method gets its own handle back.
    unsafe { (methods().cachesize)(cache(p).inner, size) }
}

unsafe extern "C" fn pagecount(p: Handle) -> c_int {
    // SAFETY: as in `cachesize`.
    unsafe { (methods().pagecount)(cache(p).inner) }
}

unsafe extern "C" fn fetch(p: Handle, key: c_uint, create: c_int) -> Page {
    // SAFETY: as in `cachesize`.
    let cache = unsafe { cache(p) };
    let page = unsafe { (methods().fetch)(cache.inner, key, create) };
    if !page.is_null() && key > cache.max_key && !(cache.parked && key == cache.parking) {
        cache.max_key = key;
    }
    page
}

unsafe extern "C" fn unpin(p: Handle, page: Page, discard: c_int) {
    // SAFETY: as in `cachesize`. A discarded page leaves the bound as it was: larger than
    // needed is safe (a truncation is forwarded that had nothing to drop).
    unsafe { (methods().unpin)(cache(p).inner, page, discard) }
}

unsafe extern "C" fn rekey(p: Handle, page: Page, old: c_uint, new: c_uint) {
    // SAFETY: as in `cachesize`.
    let cache = unsafe { cache(p) };
    unsafe { (methods().rekey)(cache.inner, page, old, new) };
    if new == cache.parking {
        cache.parked = true;
    } else {
        if old == cache.parking {
            cache.parked = false;
        }
        cache.max_key = cache.max_key.max(new);
    }
}

unsafe extern "C" fn truncate(p: Handle, limit: c_uint) {
    // SAFETY: as in `cachesize`.
    let cache = unsafe { cache(p) };
    // Every page has a number at most `bound`: none is at `limit` or above, nothing to drop.
    if limit > cache.bound() {
        return;
    }
    unsafe { (methods().truncate)(cache.inner, limit) };
    cache.max_key = cache.max_key.min(limit.saturating_sub(1));
    cache.parked &= cache.parking < limit;
}

unsafe extern "C" fn destroy(p: Handle) {
    // SAFETY: `p` came from `create`'s `Box::into_raw`, and SQLite calls nothing on it after
    // this: the box is taken back once.
    let cache = unsafe { Box::from_raw(p.cast::<Cache>()) };
    unsafe { (methods().destroy)(cache.inner) }
}

unsafe extern "C" fn shrink(p: Handle) {
    // SAFETY: as in `cachesize`.
    unsafe { (methods().shrink)(cache(p).inner) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.cargo/config.toml` builds SQLite without the process-wide page-cache pool and memory
    /// statistics, each behind a mutex every connection takes on its hot path; a build that
    /// loses those flags (the file moved, a `LIBSQLITE3_FLAGS` of the environment's own) fails
    /// here rather than only in `scripts/bench-runs`.
    #[test]
    fn sqlite_is_built_without_its_process_wide_hot_path_locks() {
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        let mut statement = connection.prepare("PRAGMA compile_options").unwrap();
        let options: Vec<String> = statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }

    /// Installs the wrapper (each test is a process of its own under `cargo nextest`, the
    /// suite's runner) and initializes SQLite, as a first connection would.
    fn installed() {
        install();
        assert!(
            INSTALLED.load(Ordering::Acquire),
            "the wrapper was not installed: SQLite was initialized before this test"
        );
        rusqlite::Connection::open_in_memory().unwrap();
    }

    /// The wrapper's truncations against the default cache's own page count: one with nothing
    /// past its limit is skipped, also after a page went through the parking number and back;
    /// one with pages past its limit (a page that really is at a larger number, or one parked)
    /// drops them.
    #[test]
    fn a_truncation_drops_what_is_past_the_limit_and_skips_when_nothing_is() {
        installed();
        // SAFETY: the handle is used only here, on one thread, until `destroy`; pages are
        // used only through the handle they came from.
        unsafe {
            let p = create(4096, 64, 0);
            assert!(!p.is_null());
            let parking = PENDING_BYTE / 4096 + 1;
            let mut pages = std::collections::HashMap::new();
            for key in 1..=10 {
                let page = fetch(p, key, 2);
                assert!(!page.is_null());
                pages.insert(key, page);
            }
            assert_eq!(pagecount(p), 10);
            truncate(p, 11);
            assert_eq!(pagecount(p), 10);

            // balance_nonroot's swap of pages 5 and 7's numbers, through the parking number.
            rekey(p, pages[&5], 5, parking);
            rekey(p, pages[&7], 7, 5);
            rekey(p, pages[&5], parking, 7);
            assert_eq!(cache(p).bound(), 10);
            truncate(p, 11);
            assert_eq!(pagecount(p), 10, "nothing is past page 10");

            truncate(p, 8);
            assert_eq!(pagecount(p), 7, "pages 8 to 10 are dropped");
            assert!(fetch(p, 9, 0).is_null());
            assert!(!fetch(p, 20, 2).is_null());
            truncate(p, 15);
            assert_eq!(pagecount(p), 7, "page 20 is dropped");

            truncate(p, 8);
            assert_eq!(pagecount(p), 7);
            assert_eq!(cache(p).bound(), 7);

            // A page left parked is past any limit below the parking number.
            rekey(p, pages[&3], 3, parking);
            truncate(p, 8);
            assert_eq!(pagecount(p), 6, "the parked page is dropped");
            assert!(fetch(p, parking, 0).is_null());
            assert!(fetch(p, 3, 0).is_null());
            destroy(p);
        }
    }

    /// A database under the wrapper, written as the pins are (random keys, so B-tree splits
    /// renumber pages through the parking number, each batch its own commit) with a
    /// transaction that grows the file and rolls back after each (its pages must leave the
    /// cache), reads back every committed row from the writer and from a second connection,
    /// and passes SQLite's integrity check.
    #[test]
    fn a_database_written_and_rolled_back_under_the_wrapper_reads_back_whole() {
        installed();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.db");
        let writer = rusqlite::Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;",
            )
            .unwrap();
        let reader = rusqlite::Connection::open(&path).unwrap();
        let mut expected = std::collections::BTreeMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut key = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            format!("{seed:016x}")
        };
        let insert = "INSERT INTO t (k, v) VALUES (?1, ?2)";
        for round in 0..60u8 {
            writer.execute_batch("BEGIN IMMEDIATE").unwrap();
            for _ in 0..40 {
                let (k, v) = (key(), vec![round; 150]);
                writer.execute(insert, (&k, &v)).unwrap();
                expected.insert(k, v);
            }
            writer.execute_batch("COMMIT; BEGIN IMMEDIATE").unwrap();
            for _ in 0..200 {
                writer.execute(insert, (key(), vec![0xff_u8; 900])).unwrap();
            }
            writer.execute_batch("ROLLBACK").unwrap();
            if round % 10 == 9 {
                let count: i64 = reader
                    .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
                    .unwrap();
                assert_eq!(count, expected.len() as i64);
            }
        }
        for connection in [&writer, &reader] {
            let mut rows = connection.prepare("SELECT k, v FROM t ORDER BY k").unwrap();
            let read: std::collections::BTreeMap<String, Vec<u8>> = rows
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                read == expected,
                "the rows read back differ from those committed"
            );
            let check: String = connection
                .query_row("PRAGMA integrity_check", [], |row| row.get(0))
                .unwrap();
            assert_eq!(check, "ok");
        }
    }
}
