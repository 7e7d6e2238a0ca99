//! Ctrl-C and SIGTERM for commands that mount or set up things they must take down again (the
//! demo, the benchmarks), or change a file in steps that must all happen or none (`insert`). The default action would kill the process on the spot and leave a dead
//! FUSE mount, a mounted loop device or an image behind. Instead the signals are blocked in every
//! thread and one watcher thread takes them and sets a flag that the long loops check between
//! steps; they then fail with "interrupted" and the normal error path with its clean-up runs.
//!
//! `tandem mount` only blocks the signals (`block_termination_signals`): the FUSE adapter watches
//! for them itself, but the engine starts its threads before the adapter runs, and a signal
//! delivered to one of those threads would kill the process without flushing the volume.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// While set, a second signal does not end the process: the command is putting something back
/// (a partly done `tandem insert`) and ending half-way would leave what the undo is there to
/// remove.
static SECOND_SIGNAL_DEFERRED: AtomicBool = AtomicBool::new(false);

/// Makes a second signal wait (`true`) for the command to finish its undo, or end the process
/// at once again (`false`).
pub fn defer_second_signal(deferred: bool) {
    SECOND_SIGNAL_DEFERRED.store(deferred, Ordering::Relaxed);
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// An error for work stopped by a signal; callers return it as they would any failure.
pub fn check() -> Result<(), String> {
    if interrupted() {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

/// Blocks the signals in this thread, and so in every thread started after, and starts the
/// watcher. Call first thing, before any other thread exists. Child processes are unaffected:
/// the standard library clears the signal mask when it starts one.
pub fn install() {
    let Some(set) = block_termination_signals() else { return };
    let set = Arc::new(set);
    let _ = std::thread::Builder::new().name("tandem-signals".into()).spawn(move || loop {
        let mut signal = 0;
        // SAFETY: sigwait reads the set and writes the signal number into a local.
        if unsafe { libc::sigwait(&*set, &mut signal) } != 0 {
            continue;
        }
        let deferred = SECOND_SIGNAL_DEFERRED.load(Ordering::Relaxed);
        if !INTERRUPTED.swap(true, Ordering::Relaxed) {
            if deferred {
                eprintln!("tandem: interrupted; putting the file back as it was after the current step");
            } else {
                eprintln!("tandem: interrupted; cleaning up after the current step (Ctrl-C again stops at once)");
            }
        } else if deferred {
            eprintln!("tandem: still putting the file back as it was; it ends as soon as that is done");
        } else {
            // A second signal means the user will not wait: leave the way the default would.
            std::process::exit(130);
        }
    });
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and every thread it starts later, and
/// returns the set for `sigwait`. Call before any other thread exists.
pub fn block_termination_signals() -> Option<libc::sigset_t> {
    // SAFETY: sigset operations on a local set, and pthread_sigmask on the calling thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return None;
        }
        Some(set)
    }
}
