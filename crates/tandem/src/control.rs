//! The control socket of a mounted array (docs/RAID.md, *Rebuild*): the mount serves
//! `array-<uuid>.sock` in the runtime directory (`/run/tandem` as root), and `tandem rebuild`
//! reaches the serving process through it, because only that process may write the members
//! while they are mounted. A socket rather than an ioctl on the mount point: a rebuild runs for
//! minutes and streams its progress, which one FUSE request cannot, and it needs no file of the
//! volume open.
//!
//! The protocol is lines of text. The client sends one request line:
//! `mountpoint` (answered `mountpoint PATH`), or `rebuild SLOT FORCE PATH` (FORCE 0 or 1, PATH
//! absolute, to the end of the line), answered by `progress DONE TOTAL STRIPE_UNIT_BYTES` lines and then one
//! `done MISSING` (slots still missing) or `error WORDS`. Only the server's own user and root
//! may ask (checked with SO_PEERCRED). A client that goes away does not stop a rebuild; the end
//! of the mount does, leaving the array as it was.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tandemfs::device::array::ArrayDevice;

use crate::error::{CliError, CliResult};

/// Longest request line accepted.
const REQUEST_BYTES_MAX: u64 = 8192;
/// How long a connection may take to send its request.
const REQUEST_WAIT: Duration = Duration::from_secs(10);
/// How often the listener looks at its stop flag while no one connects.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// Connections served at once; more wait in the listen backlog.
const CONNECTIONS_MAX: usize = 4;
/// Progress lines are sent at most this often (and at the end).
const PROGRESS_PERIOD: Duration = Duration::from_millis(250);
/// Sockets looked at when a mount point is searched for.
const SOCKETS_LOOKED_AT_MAX: usize = 256;

/// The control socket of the array with `uuid`.
pub fn socket_path(uuid: &[u8; 16]) -> PathBuf {
    crate::commands::mount::runtime_directory().join(format!("array-{}.sock", crate::array::hex(uuid)))
}

struct Server {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

static SERVER: Mutex<Option<Server>> = Mutex::new(None);
/// The mount point this process serves, once known (for `tandem rebuild MOUNTPOINT`).
static MOUNTPOINT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Starts serving `array`'s control socket. Holds only a weak reference between requests; a
/// rebuild holds the array while it runs and is stopped by `stop`.
pub fn serve(array: &Arc<ArrayDevice>) {
    let path = socket_path(&array.array_uuid());
    // A socket left by a mount that died is only a name: no process listens on it.
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "array: no control socket at {} ({error}): tandem rebuild cannot reach this mount",
                path.display()
            );
            return;
        }
    };
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    if listener.set_nonblocking(true).is_err() {
        let _ = std::fs::remove_file(&path);
        return;
    }
    let weak = Arc::downgrade(array);
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::spawn(move || listen(listener, weak, &stopping, &path));
    let previous = SERVER.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).replace(Server { stop, thread });
    if let Some(previous) = previous {
        previous.stop.store(true, Ordering::Release);
        let _ = previous.thread.join();
    }
}

/// Records the mount point served, for the `mountpoint` request.
pub fn set_mountpoint(mountpoint: &Path) {
    *MOUNTPOINT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(mountpoint.to_path_buf());
}

/// Stops the control socket and any rebuild it runs (the array stays as it was before that
/// rebuild), and waits for them: called before the volume is closed.
pub fn stop() {
    let server = SERVER.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    if let Some(server) = server {
        server.stop.store(true, Ordering::Release);
        let _ = server.thread.join();
    }
}

fn listen(listener: UnixListener, array: Weak<ArrayDevice>, stop: &Arc<AtomicBool>, path: &Path) {
    let mut handlers: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        handlers.retain(|handler| !handler.is_finished());
        if handlers.len() >= CONNECTIONS_MAX {
            std::thread::sleep(ACCEPT_POLL);
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                let (array, stop) = (array.clone(), stop.clone());
                handlers.push(std::thread::spawn(move || handle(stream, &array, &stop)));
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
    let _ = std::fs::remove_file(path);
    for handler in handlers {
        let _ = handler.join();
    }
}

/// The uid of the process at the other end of `stream`.
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    use std::os::unix::io::AsRawFd;
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the length given; both live for the call.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut length,
        )
    };
    (result == 0).then_some(credentials.uid)
}

/// Serves one connection: one request, its answer.
fn handle(stream: UnixStream, array: &Weak<ArrayDevice>, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(REQUEST_WAIT));
    let Ok(mut writer) = stream.try_clone() else { return };
    // SAFETY: geteuid has no arguments and cannot fail.
    let own = unsafe { libc::geteuid() };
    if !peer_uid(&stream).is_some_and(|uid| uid == 0 || uid == own) {
        let _ = writeln!(writer, "error only user {own} or root may ask this mount");
        return;
    }
    let mut line = String::new();
    if BufReader::new(std::io::Read::take(&stream, REQUEST_BYTES_MAX)).read_line(&mut line).is_err() {
        return;
    }
    let line = line.trim_end_matches('\n');
    let answer = if line == "mountpoint" {
        let mountpoint = MOUNTPOINT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        match mountpoint {
            Some(path) => format!("mountpoint {}", path.display()),
            None => "error not mounted yet".to_string(),
        }
    } else if let Some(request) = line.strip_prefix("rebuild ") {
        match rebuild_request(request, array, stop, &mut writer) {
            Ok(missing) => format!("done {missing}"),
            Err(error) => format!("error {}", error.message),
        }
    } else {
        "error unknown request".to_string()
    };
    let _ = writeln!(writer, "{answer}");
}

/// `rebuild SLOT FORCE PATH` in the serving process.
fn rebuild_request(
    request: &str,
    array: &Weak<ArrayDevice>,
    stop: &AtomicBool,
    writer: &mut UnixStream,
) -> CliResult<usize> {
    let mut fields = request.splitn(3, ' ');
    let (Some(slot), Some(force), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
        return Err(CliError::new("malformed rebuild request"));
    };
    let (Ok(slot), Ok(force)) = (slot.parse::<usize>(), force.parse::<u8>()) else {
        return Err(CliError::new("malformed rebuild request"));
    };
    let path = PathBuf::from(path);
    if !path.is_absolute() || force > 1 {
        return Err(CliError::new("malformed rebuild request"));
    }
    let array = array.upgrade().ok_or_else(|| CliError::new("the array is closing"))?;
    let unit_bytes = array.geometry().stripe_unit_bytes;
    let mut last = Instant::now();
    let mut progress = |done: u64, total: u64| {
        if done == total || last.elapsed() >= PROGRESS_PERIOD {
            last = Instant::now();
            // A client gone away does not stop the rebuild.
            let _ = writeln!(writer, "progress {done} {total} {unit_bytes}");
        }
        !stop.load(Ordering::Acquire)
    };
    eprintln!("array: rebuilding slot {slot} onto {}", path.display());
    let result = crate::array::rebuild_to_path(&array, slot, &path, force == 1, &mut progress);
    match &result {
        Ok(()) => eprintln!("array: slot {slot} rebuilt onto {}", path.display()),
        Err(error) => eprintln!("array: the rebuild of slot {slot} onto {} failed: {}", path.display(), error.message),
    }
    result.map(|()| array.missing_slots().len())
}

/// What a mounted array's rebuild said when it ended.
pub struct Finished {
    pub missing: usize,
}

/// Connects to the control socket of the array with `uuid`: `None` when no mount serves it.
pub fn connect(uuid: &[u8; 16]) -> Option<UnixStream> {
    UnixStream::connect(socket_path(uuid)).ok()
}

/// The control socket of the mount at `mountpoint` (canonical), looked for among the sockets
/// in the runtime directory.
pub fn connect_mountpoint(mountpoint: &Path) -> Option<UnixStream> {
    let directory = crate::commands::mount::runtime_directory();
    let entries = std::fs::read_dir(directory).ok()?;
    for entry in entries.take(SOCKETS_LOOKED_AT_MAX).flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("array-") && name.ends_with(".sock")) {
            continue;
        }
        let Ok(mut stream) = UnixStream::connect(entry.path()) else { continue };
        let _ = stream.set_read_timeout(Some(REQUEST_WAIT));
        if writeln!(stream, "mountpoint").is_err() {
            continue;
        }
        let mut answer = String::new();
        if BufReader::new(&stream).read_line(&mut answer).is_err() {
            continue;
        }
        if answer.trim_end().strip_prefix("mountpoint ").is_some_and(|served| Path::new(served) == mountpoint) {
            return UnixStream::connect(entry.path()).ok();
        }
    }
    None
}

/// Asks the mount at the other end of `stream` to rebuild `slot` onto `path` (absolute),
/// calling `progress(done, total, stripe_unit_bytes)` as it reports.
pub fn request_rebuild(
    stream: UnixStream,
    slot: usize,
    path: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64, u64, u64),
) -> CliResult<Finished> {
    let text = path.to_str().filter(|text| !text.contains('\n')).ok_or_else(|| {
        CliError::new(format!("{}: a path the mount can be sent (UTF-8, no newline) is needed", path.display()))
    })?;
    let mut writer = stream.try_clone().map_err(|error| CliError::new(format!("cannot reach the mount: {error}")))?;
    writeln!(writer, "rebuild {slot} {} {text}", u8::from(force))
        .map_err(|error| CliError::new(format!("cannot reach the mount: {error}")))?;
    // Bounded by the rebuild: one line per progress period, then the end.
    for line in BufReader::new(stream).lines() {
        let line = line.map_err(|error| CliError::new(format!("lost the mount: {error}")))?;
        if let Some(numbers) = line.strip_prefix("progress ") {
            let mut numbers = numbers.split(' ').filter_map(|number| number.parse::<u64>().ok());
            if let (Some(done), Some(total), Some(unit_bytes)) = (numbers.next(), numbers.next(), numbers.next()) {
                progress(done, total, unit_bytes);
            }
        } else if let Some(missing) = line.strip_prefix("done ") {
            let missing = missing.parse().map_err(|_| CliError::new(format!("the mount answered {line:?}")))?;
            return Ok(Finished { missing });
        } else if let Some(words) = line.strip_prefix("error ") {
            return Err(CliError::new(words.to_string()));
        } else {
            return Err(CliError::new(format!("the mount answered {line:?}")));
        }
    }
    Err(CliError::new("the mount ended before the rebuild did (the array is as it was before it)"))
}
