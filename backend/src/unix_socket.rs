//! The daemon's unix sockets (vhost-user, counters): created for their owner only (0600), or
//! for a group too (0660, `--socket-group`), whatever the umask; a stale socket at the path
//! is replaced, anything else at the path is left alone and refused.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

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

/// Creates the socket at `path` with `bind` (which must not unlink anything itself), so that
/// it is never reachable by more than its owner, then gives it its mode and group. The umask
/// is process-wide: the daemon binds its sockets before it serves, when no other thread
/// creates files.
pub fn bind_private<T>(
    path: &Path,
    access: SocketAccess,
    bind: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
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
    Ok(v)
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
        let _l = bind_private(&p, SocketAccess::default(), || UnixListener::bind(&p)).unwrap();
        assert_eq!(mode(&p), 0o600);
        // A stale socket is replaced; with a group the mode is 0660.
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
