//! The system calls the daemon may make once it serves (`--seccomp`, as virtiofsd and the
//! rust-vmm daemons): an allow-list installed on every thread of the process
//! (`SECCOMP_FILTER_FLAG_TSYNC`) after the sockets are open and the privileges gone. What a
//! compromised worker could do with a call outside it — run a program, trace or signal another
//! process, mount, load BPF, open a raw socket, change its memory's protection to run code it
//! wrote — it cannot: by default the kernel kills the process (SIGSYS). `log` allows the call
//! and has the kernel log it (a `type=1326` audit line naming the call), to find a call a new
//! code path needs; `trap` sends SIGSYS (a core dump shows where); `none` installs nothing.

use std::collections::BTreeMap;

/// What a call outside the list does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SeccompMode {
    /// The kernel kills the process.
    #[default]
    Kill,
    /// The call is allowed and the kernel logs it.
    Log,
    /// The call raises SIGSYS.
    Trap,
    /// No filter.
    None,
}

/// The calls a serving daemon makes (threads, memory, the sockets it holds, epoll, timers,
/// eventfds, its log, the files it removes on the way out, netlink for the link it follows).
/// Not in it, among others: execve(at), fork, ptrace, process_vm_*, kill, mount, bpf,
/// perf_event_open, init_module, kexec, keyctl, setns, unshare, personality, mprotect with
/// PROT_EXEC is not singled out (mprotect itself serves thread stacks).
const ALLOWED: &[(&str, i64)] = &[
    // Memory.
    ("brk", libc::SYS_brk),
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mremap", libc::SYS_mremap),
    ("mprotect", libc::SYS_mprotect),
    ("madvise", libc::SYS_madvise),
    // Threads, signals, scheduling.
    ("clone", libc::SYS_clone),
    ("clone3", libc::SYS_clone3),
    ("futex", libc::SYS_futex),
    ("set_robust_list", libc::SYS_set_robust_list),
    ("rseq", libc::SYS_rseq),
    ("sched_yield", libc::SYS_sched_yield),
    ("sched_getaffinity", libc::SYS_sched_getaffinity),
    ("sched_setaffinity", libc::SYS_sched_setaffinity),
    ("gettid", libc::SYS_gettid),
    ("getpid", libc::SYS_getpid),
    ("tgkill", libc::SYS_tgkill),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("rt_sigaction", libc::SYS_rt_sigaction),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("rt_sigtimedwait", libc::SYS_rt_sigtimedwait),
    ("sigaltstack", libc::SYS_sigaltstack),
    ("prctl", libc::SYS_prctl),
    ("capget", libc::SYS_capget),
    ("capset", libc::SYS_capset),
    ("getuid", libc::SYS_getuid),
    ("geteuid", libc::SYS_geteuid),
    ("getgid", libc::SYS_getgid),
    ("getegid", libc::SYS_getegid),
    ("prlimit64", libc::SYS_prlimit64),
    ("getrandom", libc::SYS_getrandom),
    ("membarrier", libc::SYS_membarrier),
    // Time.
    ("clock_gettime", libc::SYS_clock_gettime),
    ("clock_getres", libc::SYS_clock_getres),
    ("clock_nanosleep", libc::SYS_clock_nanosleep),
    ("nanosleep", libc::SYS_nanosleep),
    ("gettimeofday", libc::SYS_gettimeofday),
    ("timerfd_create", libc::SYS_timerfd_create),
    ("timerfd_settime", libc::SYS_timerfd_settime),
    ("timerfd_gettime", libc::SYS_timerfd_gettime),
    // File descriptors.
    ("read", libc::SYS_read),
    ("write", libc::SYS_write),
    ("readv", libc::SYS_readv),
    ("writev", libc::SYS_writev),
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("lseek", libc::SYS_lseek),
    ("close", libc::SYS_close),
    ("fcntl", libc::SYS_fcntl),
    ("ioctl", libc::SYS_ioctl),
    ("dup", libc::SYS_dup),
    ("dup3", libc::SYS_dup3),
    ("pipe2", libc::SYS_pipe2),
    ("eventfd2", libc::SYS_eventfd2),
    ("epoll_create1", libc::SYS_epoll_create1),
    ("epoll_ctl", libc::SYS_epoll_ctl),
    ("epoll_pwait", libc::SYS_epoll_pwait),
    ("epoll_pwait2", libc::SYS_epoll_pwait2),
    ("ppoll", libc::SYS_ppoll),
    ("openat", libc::SYS_openat),
    ("newfstatat", libc::SYS_newfstatat),
    ("fstat", libc::SYS_fstat),
    ("statx", libc::SYS_statx),
    ("readlinkat", libc::SYS_readlinkat),
    ("getdents64", libc::SYS_getdents64),
    ("getcwd", libc::SYS_getcwd),
    ("unlinkat", libc::SYS_unlinkat),
    // The guest's NIC: a private directory per frontend for the inner socket.
    ("mkdirat", libc::SYS_mkdirat),
    ("umask", libc::SYS_umask),
    ("fchmodat", libc::SYS_fchmodat),
    ("faccessat", libc::SYS_faccessat),
    ("faccessat2", libc::SYS_faccessat2),
    ("uname", libc::SYS_uname),
    ("flock", libc::SYS_flock),
    ("fallocate", libc::SYS_fallocate),
    ("ftruncate", libc::SYS_ftruncate),
    ("fchmod", libc::SYS_fchmod),
    ("fchown", libc::SYS_fchown),
    // Sockets.
    ("socket", libc::SYS_socket),
    ("socketpair", libc::SYS_socketpair),
    ("bind", libc::SYS_bind),
    ("listen", libc::SYS_listen),
    ("accept", libc::SYS_accept),
    ("accept4", libc::SYS_accept4),
    ("connect", libc::SYS_connect),
    ("shutdown", libc::SYS_shutdown),
    ("getsockname", libc::SYS_getsockname),
    ("getpeername", libc::SYS_getpeername),
    ("getsockopt", libc::SYS_getsockopt),
    ("setsockopt", libc::SYS_setsockopt),
    ("sendto", libc::SYS_sendto),
    ("recvfrom", libc::SYS_recvfrom),
    ("sendmsg", libc::SYS_sendmsg),
    ("recvmsg", libc::SYS_recvmsg),
    ("sendmmsg", libc::SYS_sendmmsg),
    ("recvmmsg", libc::SYS_recvmmsg),
    // The older forms x86_64 still has (the C library or a crate may use them).
    #[cfg(target_arch = "x86_64")]
    ("open", libc::SYS_open),
    #[cfg(target_arch = "x86_64")]
    ("stat", libc::SYS_stat),
    #[cfg(target_arch = "x86_64")]
    ("lstat", libc::SYS_lstat),
    #[cfg(target_arch = "x86_64")]
    ("readlink", libc::SYS_readlink),
    #[cfg(target_arch = "x86_64")]
    ("unlink", libc::SYS_unlink),
    #[cfg(target_arch = "x86_64")]
    ("mkdir", libc::SYS_mkdir),
    #[cfg(target_arch = "x86_64")]
    ("rmdir", libc::SYS_rmdir),
    #[cfg(target_arch = "x86_64")]
    ("chmod", libc::SYS_chmod),
    #[cfg(target_arch = "x86_64")]
    ("access", libc::SYS_access),
    #[cfg(target_arch = "x86_64")]
    ("poll", libc::SYS_poll),
    #[cfg(target_arch = "x86_64")]
    ("epoll_wait", libc::SYS_epoll_wait),
    #[cfg(target_arch = "x86_64")]
    ("epoll_create", libc::SYS_epoll_create),
    #[cfg(target_arch = "x86_64")]
    ("dup2", libc::SYS_dup2),
    #[cfg(target_arch = "x86_64")]
    ("pipe", libc::SYS_pipe),
    #[cfg(target_arch = "x86_64")]
    ("eventfd", libc::SYS_eventfd),
    #[cfg(target_arch = "x86_64")]
    ("arch_prctl", libc::SYS_arch_prctl),
];

/// The names of the calls allowed (for `--print-capabilities`-like listings and the docs).
pub fn allowed() -> impl Iterator<Item = &'static str> {
    ALLOWED.iter().map(|&(n, _)| n)
}

/// The filter for `mode` as a BPF program (None for [`SeccompMode::None`]).
pub fn program(mode: SeccompMode) -> Result<Option<seccompiler::BpfProgram>, String> {
    use seccompiler::SeccompAction;
    let other = match mode {
        SeccompMode::None => return Ok(None),
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Trap => SeccompAction::Trap,
    };
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("seccomp on {}: {e}", std::env::consts::ARCH))?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        ALLOWED.iter().map(|&(_, nr)| (nr, Vec::new())).collect();
    let filter = seccompiler::SeccompFilter::new(rules, other, SeccompAction::Allow, arch)
        .map_err(|e| format!("seccomp filter: {e}"))?;
    let prog: seccompiler::BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("seccomp filter: {e}"))?;
    Ok(Some(prog))
}

/// Installs the filter for `mode` on every thread of the process (needs no_new_privs, which
/// [`crate::sys::drop_privileges`] set).
pub fn install(mode: SeccompMode) -> Result<(), String> {
    let Some(prog) = program(mode)? else {
        return Ok(());
    };
    seccompiler::apply_filter_all_threads(&prog).map_err(|e| format!("seccomp: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a child process with the filter of `mode` on; its wait status.
    fn in_child(mode: SeccompMode, f: fn() -> i32) -> i32 {
        let prog = program(mode).unwrap().unwrap();
        // SAFETY: fork in a test; the child only makes raw calls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: the child's own calls; no allocation after the fork but the filter's,
            // which was built before it.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if seccompiler::apply_filter(&prog).is_err() {
                    libc::_exit(90);
                }
                libc::_exit(f());
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        status
    }

    fn exec_true() -> i32 {
        let path = c"/bin/true";
        let argv = [path.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        // SAFETY: NUL-terminated path and NULL-terminated argument lists.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        91
    }

    fn allowed_calls() -> i32 {
        // SAFETY: plain calls on the child's own objects.
        unsafe {
            let fd = libc::eventfd(0, 0);
            let one = 1u64;
            let w = libc::write(fd, (&one as *const u64).cast(), 8);
            libc::close(fd);
            if fd >= 0 && w == 8 {
                0
            } else {
                92
            }
        }
    }

    #[test]
    fn a_call_outside_the_list_kills_the_process() {
        let st = in_child(SeccompMode::Kill, exec_true);
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGSYS,
            "execve under the filter: wait status {st:#x}, not killed by SIGSYS"
        );
    }

    #[test]
    fn the_calls_on_the_list_work() {
        let st = in_child(SeccompMode::Kill, allowed_calls);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "status {st:#x}"
        );
    }

    #[test]
    fn log_mode_lets_the_call_through() {
        // execve of /bin/true succeeds: the child exits 0 (true's status), not 91 or SIGSYS.
        let st = in_child(SeccompMode::Log, exec_true);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "status {st:#x}"
        );
    }

    #[test]
    fn none_is_no_filter() {
        assert!(program(SeccompMode::None).unwrap().is_none());
        assert!(allowed().any(|n| n == "recvmmsg") && !allowed().any(|n| n.starts_with("exec")));
    }
}
