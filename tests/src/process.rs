//! Child processes that die with the test process.

use std::os::unix::process::CommandExt;
use std::process::Command;

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
