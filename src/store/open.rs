//! Opening connections: the pragmas every connection needs, the writer's,
//! and the read-only and operator connections of commands beside the daemon.

use super::*;

/// Opens a connection with the pragmas every lockhub connection needs.
pub(super) fn connect(path: &Path, flags: OpenFlags) -> Result<Connection, StoreError> {
    connect_through(path, flags, None)
}

/// [`connect`] through the named VFS instead of the default one.
pub(super) fn connect_through(
    path: &Path,
    flags: OpenFlags,
    vfs: Option<&std::ffi::CStr>,
) -> Result<Connection, StoreError> {
    let opened = match vfs {
        Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs),
        None => Connection::open_with_flags(path, flags),
    };
    let conn = opened.map_err(|source| StoreError::Open {
        path: path.to_owned(),
        source,
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // rusqlite keeps 16 prepared statements by default; applying one event
    // uses a few dozen, and a statement on a table with triggers is costly
    // to prepare (the triggers are compiled into it). Keep them all.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    let corrupt = |e: rusqlite::Error| StoreError::Corrupt {
        path: path.to_owned(),
        detail: e.to_string(),
    };
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(corrupt)?;
    let fk: bool = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .map_err(corrupt)?;
    if !fk {
        return Err(StoreError::Pragma {
            path: path.to_owned(),
            what: "foreign keys",
        });
    }
    Ok(conn)
}

/// Opens the writer's connection: WAL, `synchronous=FULL`, `secure_delete`,
/// then `quick_check`.
pub(super) fn connect_writer(path: &Path) -> Result<Connection, StoreError> {
    let conn = connect(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
    )?;
    let corrupt = |e: rusqlite::Error| StoreError::Corrupt {
        path: path.to_owned(),
        detail: e.to_string(),
    };
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(corrupt)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Pragma {
            path: path.to_owned(),
            what: "WAL journal mode",
        });
    }
    // FULL, not NORMAL: in WAL mode NORMAL may lose the last commits on power
    // loss, and an acked event must survive one.
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(corrupt)?;
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .map_err(corrupt)?;
    if sync != 2 {
        return Err(StoreError::Pragma {
            path: path.to_owned(),
            what: "synchronous=FULL",
        });
    }
    // Guest erasure must not leave names in free pages.
    conn.pragma_update(None, "secure_delete", true)
        .map_err(corrupt)?;
    // Savepoint and statement journals in memory. Every event is applied
    // inside nested savepoints, and each level journals the pages it
    // touches: past SQLite's 64 KiB threshold the journal went to a temp
    // file in /var/tmp, about 50 small writes per event (a third of the
    // writer's time, measured with strace and perf), holding copies of
    // pages (guest names among them) that erasure never reaches. In memory
    // it holds only the pages of the savepoints open at once.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(corrupt)?;
    let check: String = conn
        .pragma_query_value(None, "quick_check", |r| r.get(0))
        .map_err(corrupt)?;
    if check != "ok" {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: check,
        });
    }
    Ok(conn)
}

/// Opens an existing database read-only, for commands that inspect a hub
/// (`keys`, `status`) while the daemon may be running: WAL lets them read
/// without blocking it. Refuses a missing file (rather than creating an
/// empty mirror), a schema newer than this binary, and a file with no schema
/// yet (the daemon has just created it and not yet migrated it; reading it
/// would answer "no such table"). An older schema is left for the caller to
/// judge (`status` reads what it can). Nothing is migrated from here.
pub fn open_read_only(path: &Path) -> Result<Connection, StoreError> {
    if !path.exists() {
        return Err(StoreError::NoDatabase(path.to_owned()));
    }
    let conn = connect(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.pragma_update(None, "query_only", true)?;
    let found = schema_version(&conn)?;
    let known = MIGRATIONS.len() as i64;
    if found > known {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known,
        });
    }
    if found == 0 {
        return Err(StoreError::NotUpgraded {
            path: path.to_owned(),
            found,
            known,
        });
    }
    Ok(conn)
}

/// A read-write connection for an operator's command (`lockhub alert
/// clear`) beside a running daemon: the database must exist at exactly
/// this binary's schema (nothing is created or migrated), writes are
/// `synchronous=FULL` and wait for the daemon's writer with the usual
/// busy timeout. Keep its transactions short: door jobs wait for them.
pub fn open_operator(path: &Path) -> Result<Connection, StoreError> {
    if !path.exists() {
        return Err(StoreError::NoDatabase(path.to_owned()));
    }
    let conn = connect(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let found = schema_version(&conn)?;
    let known = MIGRATIONS.len() as i64;
    if found > known {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known,
        });
    }
    if found < known {
        return Err(StoreError::NotUpgraded {
            path: path.to_owned(),
            found,
            known,
        });
    }
    Ok(conn)
}
