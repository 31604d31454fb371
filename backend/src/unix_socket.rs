//! The daemon's unix sockets (vhost-user, virtio-net, counters): created for their owner only
//! (0600), or for a group too (0660, `--socket-group`), whatever the umask.
//!
//! A socket path belongs to one daemon at a time. Binding takes an exclusive lock on
//! `<path>.lock` (flock(2), held for as long as the socket is served, as virtiofsd locks its pid
//! file) and refuses a path another daemon holds, or one a listening socket of another program
//! is bound to (/proc/net/unix): such a path is never unlinked. A stale socket (nobody listens,
//! nobody holds the lock) is replaced; anything that is not a socket is left alone and refused.
//! The socket and its lock file go when the [`PathLock`] is dropped, and only then.

use std::fs::File;
use std::io;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Who may connect besides the daemon's user: nobody, or the members of one group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketAccess {
    pub group: Option<u32>,
}

impl SocketAccess {
    /// The socket's mode: 0600, or 0660 with a group.
    pub fn mode(&self) -> u32 {
        if self.group.is_some() {
            0o660
        } else {
            0o600
        }
    }
}

/// Removes the socket at `path` if there is one; nothing there is fine; anything else at the
/// path (a file, a directory, a link) is an error and stays.
pub fn remove_socket(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket: not removing it",
                path.display()
            ),
        )),
    }
}

/// This daemon's claim on a socket path: the exclusive lock on `<path>.lock`. Dropping it
/// removes the socket, then the lock file, then releases the lock.
#[derive(Debug)]
pub struct PathLock {
    /// The socket this lock holds the path of; `None` once it is known not to be ours.
    socket: Option<PathBuf>,
    lock_path: PathBuf,
    _file: File,
}

impl PathLock {
    /// Takes the lock of `socket`'s path, or says which process holds it.
    pub fn acquire(socket: &Path) -> io::Result<PathLock> {
        let mut name = socket.as_os_str().to_os_string();
        name.push(".lock");
        let lock_path = PathBuf::from(name);
        // A holder unlinks the file while it holds the lock: a lock taken on a file that is no
        // longer at the path protects nothing, so try again on the new one.
        for _ in 0..16 {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&lock_path)
                .map_err(|e| annotate(e, &lock_path, "opening the lock file"))?;
            // SAFETY: flock on a file descriptor we own; no memory is passed.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock {
                    return Err(annotate(e, &lock_path, "locking"));
                }
                let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{} is served by another daemon (pid {}, which holds {}): not replacing it",
                        socket.display(),
                        holder.trim(),
                        lock_path.display()
                    ),
                ));
            }
            let same = match std::fs::symlink_metadata(&lock_path) {
                Ok(m) => {
                    let f = file.metadata()?;
                    m.ino() == f.ino() && m.dev() == f.dev()
                }
                Err(_) => false,
            };
            if !same {
                continue;
            }
            file.set_len(0)?;
            (&file).write_all(format!("{}\n", std::process::id()).as_bytes())?;
            return Ok(PathLock {
                socket: Some(socket.to_path_buf()),
                lock_path,
                _file: file,
            });
        }
        Err(io::Error::other(format!(
            "{}: the lock file kept changing under this daemon",
            lock_path.display()
        )))
    }
}

impl Drop for PathLock {
    fn drop(&mut self) {
        if let Some(s) = &self.socket {
            let _ = remove_socket(s);
        }
        // `file` closes after this, releasing the lock once both files are gone.
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

fn annotate(e: io::Error, path: &Path, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Whether a listening unix socket is bound to `path` in this network namespace
/// (/proc/net/unix; false when that cannot be read).
pub fn listening_at(path: &Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return false;
    };
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let names = [path.as_os_str(), abs.as_os_str()];
    // Num RefCount Protocol Flags Type St Inode Path; Flags has __SO_ACCEPTCON (1 << 16) set
    // for a listening socket.
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 8
            && u32::from_str_radix(f[3], 16).is_ok_and(|flags| flags & (1 << 16) != 0)
            && names.iter().any(|n| std::ffi::OsStr::new(f[7]) == *n)
    })
}

/// Creates the socket at `path` with `bind` (which must not unlink anything itself), so that
/// it is never reachable by more than its owner, then gives it its mode and group; the lock
/// it returns holds the path for this daemon (see the module's text). The umask is
/// process-wide: the daemon binds its sockets before it serves, when no other thread creates
/// files.
pub fn bind_private<T>(
    path: &Path,
    access: SocketAccess,
    bind: impl FnOnce() -> io::Result<T>,
) -> io::Result<(T, PathLock)> {
    let mut lock = PathLock::acquire(path)?;
    if listening_at(path) {
        // Not ours: dropping the lock must leave that socket alone.
        lock.socket = None;
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{} is a socket another program listens on: not replacing it",
                path.display()
            ),
        ));
    }
    remove_socket(path)?;
    // SAFETY: umask only changes this process's file-creation mask.
    let old = unsafe { libc::umask(0o177) };
    let r = bind();
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let v = r?;
    if let Some(gid) = access.group {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(access.mode()))?;
    Ok((v, lock))
}

/// The GID of a group given by name or number.
pub fn resolve_group(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Some(n);
    }
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: group is plain data (integers and pointers); all-zero is a valid value.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer names a live buffer of the size passed; getgrnam_r writes the
    // strings into `buf`, which outlives the use of `grp` below.
    let r = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    (r == 0 && !out.is_null()).then_some(grp.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn dir() -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "vur-sock-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn sockets_are_for_their_owner_or_their_group() {
        let d = dir();
        let p = d.join("a.sock");
        let lock_file = d.join("a.sock.lock");
        let held = bind_private(&p, SocketAccess::default(), || UnixListener::bind(&p)).unwrap();
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(&lock_file), 0o600);
        // While it is held, the path is nobody else's, and stays as it is.
        let e = bind_private(&p, SocketAccess::default(), || UnixListener::bind(&p)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert!(p.exists() && lock_file.exists());
        drop(held);
        assert!(
            !p.exists() && !lock_file.exists(),
            "the socket and its lock go with it"
        );
        // A stale socket is replaced; with a group the mode is 0660.
        drop(UnixListener::bind(&p).unwrap());
        // SAFETY: getgid has no preconditions.
        let gid = unsafe { libc::getgid() };
        let g = SocketAccess { group: Some(gid) };
        let _l2 = bind_private(&p, g, || UnixListener::bind(&p)).unwrap();
        assert_eq!(mode(&p), 0o660);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn anything_but_a_socket_is_left_alone() {
        let d = dir();
        let f = d.join("precious");
        std::fs::write(&f, b"keep me").unwrap();
        let e = bind_private(&f, SocketAccess::default(), || UnixListener::bind(&f)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
        assert!(remove_socket(&d).is_err(), "a directory neither");
        assert!(
            remove_socket(&d.join("none")).is_ok(),
            "nothing there is fine"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn groups_by_name_or_number() {
        assert_eq!(resolve_group("1234"), Some(1234));
        assert_eq!(resolve_group("root"), Some(0));
        assert_eq!(resolve_group("no-such-group-here"), None);
    }
}
