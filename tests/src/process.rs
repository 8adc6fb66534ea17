//! Child processes that die with the test process.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

/// Makes `cmd`'s child receive SIGKILL when the thread that spawns it
/// exits (PR_SET_PDEATHSIG), so emulators never outlive the tests. Spawn
/// from a thread that lives as long as the process: the signal follows the
/// spawning *thread*, not the process.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) run
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// Runs `wait` (which waits for the child `pid` of this process and reaps
/// it), killing the child with SIGKILL if `wait` has not returned after
/// `deadline`; what `wait` returned.
pub fn wait_with_deadline<T>(pid: u32, deadline: Duration, wait: impl FnOnce() -> T) -> T {
    let pid = pid as libc::pid_t;
    let (done, watched) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if watched.recv_timeout(deadline) == Err(mpsc::RecvTimeoutError::Timeout) {
            // SAFETY: kill(2) on our own child's pid; the child is not reaped
            // before `wait` returns, so the pid is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = wait();
    let _ = done.send(());
    watchdog.join().expect("watchdog thread");
    out
}
