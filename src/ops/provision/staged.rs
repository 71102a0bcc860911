//! Staged writes: each file is written under a temporary name in its own
//! folder, with its final mode and owner from the start, then linked (or,
//! with `--force`, renamed) into place.

use super::*;

pub(super) fn parent(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new("/"))
}

/// Temporary files in the target folders, and the folders made for them;
/// whatever is still there when this is dropped (an error on the way, or
/// the check copy) is removed, and the folders too unless the files were
/// committed.
#[derive(Default)]
pub(super) struct Staged {
    pub(super) files: Vec<PathBuf>,
    /// Folders this run created, parents first.
    pub(super) dirs: Vec<PathBuf>,
    pub(super) committed: bool,
}

impl Staged {
    /// Creates `dir` (and missing parents) with `mode`; an existing folder
    /// is left as it is, except that a newly created data folder gets its
    /// owner.
    pub(super) fn make_dir(
        &mut self,
        dir: &Path,
        mode: u32,
        owner: Option<Owner>,
    ) -> Result<(), ProvisionError> {
        let err = |source| ProvisionError::Write {
            path: dir.to_owned(),
            source,
        };
        if dir.is_dir() {
            return Ok(());
        }
        let mut missing: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && a.symlink_metadata().is_err())
            .map(Path::to_owned)
            .collect();
        missing.reverse();
        DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .map_err(err)?;
        self.dirs.extend(missing);
        // The umask may have narrowed the mode; set it exactly.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(err)?;
        if let Some(o) = owner {
            std::os::unix::fs::chown(dir, Some(o.uid), Some(o.gid)).map_err(err)?;
        }
        Ok(())
    }

    /// Writes `bytes` to a new temporary file beside `path`, created with
    /// `mode` by `open(2)` (O_CREAT|O_EXCL: never with a looser mode, never
    /// through an attacker's symlink), chowned before a byte is written, and
    /// synced.
    pub(super) fn stage(
        &mut self,
        path: &Path,
        bytes: &[u8],
        mode: u32,
        owner: Option<Owner>,
    ) -> Result<PathBuf, ProvisionError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let tmp = parent(path).join(format!(".{name}.{}.tmp", Uuid::new_v4().simple()));
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&tmp)?;
            self.files.push(tmp.clone());
            if let Some(o) = owner {
                std::os::unix::fs::fchown(&f, Some(o.uid), Some(o.gid))?;
            }
            // The umask can only narrow; set exactly `mode` (0644 for the config).
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.write_all(bytes)?;
            f.sync_all()
        })();
        result.map_err(|source| ProvisionError::Write {
            path: path.to_owned(),
            source,
        })?;
        Ok(tmp)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for p in &self.files {
            let _ = std::fs::remove_file(p);
        }
        if !self.committed {
            // Deepest first; `remove_dir` leaves a folder someone else
            // filled meanwhile.
            for d in self.dirs.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

/// Moves a staged file into place: `link(2)` without `force` (refuses an
/// existing name atomically), `rename(2)` with it; then syncs the folder.
pub(super) fn commit(tmp: &Path, path: &Path, force: bool) -> Result<(), ProvisionError> {
    let result = if force {
        std::fs::rename(tmp, path)
    } else {
        std::fs::hard_link(tmp, path)
    };
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(ProvisionError::Exists {
                path: path.to_owned(),
            });
        }
        Err(source) => {
            return Err(ProvisionError::Write {
                path: path.to_owned(),
                source,
            });
        }
        Ok(()) => {}
    }
    if let Ok(d) = std::fs::File::open(parent(path)) {
        let _ = d.sync_all();
    }
    Ok(())
}
